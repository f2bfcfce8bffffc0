"""inference: the union test's known answers (coverage and false-positive rate under skew,
each part against scipy), the interval as the test inverted, multiplicity levels that agree
with adjusted p-values, and the pilot SD's upper bound."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from test_stats import simulate
from test_verdicts import expected


def lognormal_diffs(rng: np.random.Generator, reps: int, n: int, skew: float, sign: float = 1.0) -> np.ndarray:
    """Standardised lognormal per-prompt differences of population skewness ``skew``
    (``sign`` -1: a few prompts lose a lot, the cache-regression shape), mean 0, sd 1."""
    from scipy.optimize import brentq

    sigma = brentq(lambda v: (math.exp(v * v) + 2) * math.sqrt(math.exp(v * v) - 1) - skew, 1e-4, 3.0)
    x = rng.lognormal(0.0, sigma, (reps, n))
    mean, sd = math.exp(sigma ** 2 / 2), math.sqrt((math.exp(sigma ** 2) - 1) * math.exp(sigma ** 2))
    return sign * (x - mean) / sd


def rejection_rate(x: np.ndarray, mu: float, level: float = 0.95) -> float:
    """Share of studies whose union test rejects ``mean = mu`` (= 1 - coverage of its interval)."""
    from pairflow.analysis.inference import signflip_signs, union_p

    return float(np.mean(union_p(x, mu, signflip_signs(x.shape[1], 2000, 0)) < 1 - level))


@pytest.mark.parametrize("shape, n", [("normal", 7), ("skew2", 7), ("skew-2", 10), ("skew2", 30)])
def test_union_interval_covers_and_test_keeps_its_size_under_skew(shape: str, n: int) -> None:
    """Known answer (issue 23), 4000 synthetic studies per cell: under skewness 2 (either
    sign) the t-test rejects a true mean 7-10% of the time at 7-10 prompts; the union test
    keeps the false-positive rate <= 0.06 (so its interval covers >= 0.94), and does not
    give up much on normal data (BENCHMARKS.md has the full table)."""
    rng = np.random.default_rng(n)
    if shape == "normal":
        x = simulate(n, 4000, 0.0, rng)
    else:
        x = lognormal_diffs(rng, 4000, n, 2.0, -1.0 if shape.startswith("skew-") else 1.0)
    assert rejection_rate(x, 0.0) <= 0.06
    assert rejection_rate(x + 0.3, 0.3) <= 0.06  # the interval covers a shifted true mean as often


def test_union_test_is_never_bolder_than_each_of_its_parts() -> None:
    """p = max(t, Hall[, sign-flip]): t checked against scipy's ttest_1samp, the sign-flip
    part against scipy's exact permutation_test (it joins at <= 5 prompts or for quantised
    values), and the interval is every mean the test accepts."""
    from scipy.stats import permutation_test, ttest_1samp

    from pairflow.analysis.inference import Cell, signflip_signs

    rng = np.random.default_rng(3)
    for n in (3, 6, 9):
        for quantise in (False, True):
            x = rng.lognormal(0, 0.8, n) - 1.0
            if quantise:
                x[: (n + 1) // 2] = 0.25  # half the prompts on one value
            cell = Cell(x, signflip_signs(n, 2000, 0))
            assert cell.uses_signflip == (n <= 5 or quantise)
            ref = permutation_test((x,), np.mean, permutation_type="samples", n_resamples=10 ** 6,
                                   alternative="two-sided").pvalue
            assert cell.p_signflip(0.0) == pytest.approx(ref, abs=1e-12)
            p = cell.p(0.0)
            assert p is not None and p >= ttest_1samp(x, 0.0).pvalue - 1e-12
            assert p >= ref - 1e-12 or not cell.uses_signflip
            lo, hi, why = cell.interval(0.95)
            if lo is None or hi is None:
                assert why is not None and "can reach" in why and n <= 5
                continue
            for mu in np.linspace(lo - 1, hi + 1, 41):
                inside = lo + 1e-6 < mu < hi - 1e-6
                outside = mu < lo - 1e-6 or mu > hi + 1e-6
                q = cell.p(float(mu))
                assert q is not None and (not inside or q >= 0.05) and (not outside or q < 0.05), (mu, lo, hi, q)


def test_family_levels_agree_with_adjusted_p() -> None:
    from pairflow.analysis.inference import family_levels

    rng = np.random.default_rng(0)
    for method in ("holm", "bh"):
        for _ in range(200):
            p = list(rng.uniform(0, 0.1, rng.integers(1, 8)))
            adjusted, levels = family_levels(p, 0.05, method)  # type: ignore[arg-type]
            assert [a < 0.05 for a in adjusted] == [raw < lv for raw, lv in zip(p, levels, strict=True)]


def test_sd_upper_bound_is_the_chi_square_bound() -> None:
    """The pilot's SD is uncertain: from 7 prompts its 80% upper bound is 1.40 times the
    estimate (chi-square, 6 df), so the prompts needed grow accordingly."""
    from scipy.stats import chi2

    from pairflow.analysis.inference import sd_upper

    assert sd_upper(1.0, 7) == pytest.approx(math.sqrt(6 / chi2.ppf(0.2, 6)))
    assert 1.39 < sd_upper(1.0, 7) < 1.41


def test_parametric_p_is_the_union_test_on_continuous_rows() -> None:
    """Planning simulates with ``parametric_p`` where rows are neither flat nor quantised
    past 5 prompts; there it must be ``union_p`` exactly (issue 39)."""
    from pairflow.analysis.inference import parametric_p, signflip_signs, union_p

    rng = np.random.default_rng(3)
    for n in (6, 9, 25):
        x = np.vstack([rng.normal(0.1, 1, (50, n)), rng.lognormal(0, 1, (50, n)), -rng.lognormal(0, 1, (50, n))])
        assert np.allclose(parametric_p(x, -0.4), union_p(x, -0.4, signflip_signs(n, 500, 0)), rtol=0, atol=1e-12)


def test_a_plan_delivers_its_power_in_an_independent_simulation() -> None:
    """Issue 39: "prompts needed" is the smallest N whose simulated union-test power on
    the pilot reaches 0.8. Pilots of 10 prompts from a normal population (sd 1), margin
    1 sd, true difference 0: fresh studies of the stated N from the population itself,
    analysed by the full ``union_p``, deliver at least 0.78 on average (the t-test's N
    delivered about 0.6 here)."""
    from pairflow.analysis.inference import Cell, plan_prompts, signflip_signs, union_p

    rng = np.random.default_rng(11)
    delivered = []
    for _ in range(24):
        x = rng.normal(0, 1, 10)
        plan = plan_prompts(Cell(x, signflip_signs(10, 2000, 0)), 0.0, -1.0, 0.05, 0.8, start=6)
        assert plan.prompts is not None and plan.power >= 0.8
        y = rng.normal(0, 1, (1000, plan.prompts))
        p = union_p(y, -1.0, signflip_signs(plan.prompts, 100, 0))
        delivered.append(float(np.mean((p < 0.05) & (y.mean(axis=1) > -1.0))))
    assert np.mean(delivered) >= 0.78


def test_an_inconclusive_cell_is_told_more_prompts_than_it_has() -> None:
    """Issue 39: a cell at n prompts is never told "about n prompts would decide it"."""
    from pairflow.analysis.inference import Cell, Question, signflip_signs, verdict

    rng = np.random.default_rng(5)
    for n in (6, 10, 15):
        for _ in range(2):
            x = rng.normal(0, 1, n)
            word, detail, _on = verdict(Cell(x, signflip_signs(n, 2000, 0)), Question("margin", 1, margin=0.5),
                                        0.05, 0.8)
            m = re.search(r"about (\d+) prompts would decide it", detail)
            if word == "inconclusive" and m:
                assert int(m.group(1)) > n, detail


# --- issue 39 item 5: each formula's direction, constant and switch, against a hand computation ---------


def hand_union_p(x: list[float], mu: float) -> float:
    """max(Student t p, Hall's skew-corrected t p) of "mean = mu", from the textbook formulas
    in plain Python: G1 = g1 sqrt(n (n - 1)) / (n - 2), a = 1.5 G1 / (3 sqrt(n)),
    g(T) = T + a T^2 + a^2 T^3 / 3 + a / 2 (Hall 1992, with the documented factor 1.5)."""
    from scipy.stats import t as student

    n = len(x)
    mean = sum(x) / n
    m2 = sum((v - mean) ** 2 for v in x) / n
    m3 = sum((v - mean) ** 3 for v in x) / n
    big_g1 = m3 / m2 ** 1.5 * math.sqrt(n * (n - 1)) / (n - 2)
    a = 1.5 * big_g1 / (3 * math.sqrt(n))
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    t = math.sqrt(n) * (mean - mu) / sd
    g = t + a * t * t + a * a * t ** 3 / 3 + a / 2
    return max(2 * float(student.sf(abs(t), n - 1)), 2 * float(student.sf(abs(g), n - 1)))


SKEWED = [0.02, -0.11, 0.05, 0.31, -0.04, 0.09, 1.42, 0.0, -0.07, 0.16]
"""Ten per-prompt differences with one large gain (skewness 2.76): Hall's p differs
from Student's, so a change in the correction's constant or terms moves the union's p."""


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("mu", [0.25, 0.35, 0.45, 0.6])
def test_hall_skew_correction_matches_a_hand_computation(mu: float, sign: float) -> None:
    """Issue 39 item 5 (a surviving mutant sat in the skew correction's constant): the union
    p at 10 continuous prompts is max(t p, Hall p) to 1e-12, in ``Cell.p``, ``union_p`` and
    ``parametric_p``; and Hall's part decides at these means, on the long tail's side of the
    mean (it is not hidden by t's), for right- and left-skewed values."""
    from scipy.stats import skew, ttest_1samp

    from pairflow.analysis.inference import SKEW_FACTOR, Cell, parametric_p, signflip_signs, skewness, union_p

    assert SKEW_FACTOR == 1.5
    x, mu = sign * np.array(SKEWED), sign * mu
    assert skewness(x) == pytest.approx(float(skew(x, bias=False)), abs=1e-12)
    want = hand_union_p(list(x), mu)
    cell = Cell(x, signflip_signs(10, 2000, 0))
    assert not cell.uses_signflip
    assert cell.p(mu) == pytest.approx(want, abs=1e-12)
    assert float(union_p(x[None, :], mu, signflip_signs(10, 2000, 0))[0]) == pytest.approx(want, abs=1e-12)
    assert float(parametric_p(x[None, :], mu)[0]) == pytest.approx(want, abs=1e-12)
    t_p = float(ttest_1samp(x, mu).pvalue)
    assert want > t_p + 1e-3  # Hall's p is the larger one here, so it is what the test sees


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_hall_interval_is_the_hand_inverted_transform(sign: float) -> None:
    """The interval is the hull of the t and Hall intervals: each Hall edge is where
    Hall's p equals 1 - level, found here by root-finding on the hand formula, to 1e-9.
    Skewed right, Hall's upper edge is the interval's; skewed left (sign -1), its lower one."""
    from scipy.optimize import brentq
    from scipy.stats import t as student

    from pairflow.analysis.inference import Cell, signflip_signs

    x = [sign * v for v in SKEWED]
    n, mean = len(x), sum(x) / len(x)
    se = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1)) / math.sqrt(n)
    half = float(student.ppf(0.975, n - 1))
    t_lo, t_hi = mean - half * se, mean + half * se
    m2 = sum((v - mean) ** 2 for v in x) / n
    a = 1.5 * (sum((v - mean) ** 3 for v in x) / n / m2 ** 1.5 * math.sqrt(n * (n - 1)) / (n - 2)) / (3 * math.sqrt(n))

    def hall_p(mu: float) -> float:
        t = (mean - mu) / se
        return 2 * float(student.sf(abs(t + a * t * t + a * a * t ** 3 / 3 + a / 2), n - 1)) - 0.05

    h_lo = brentq(hall_p, mean - 20 * se, mean - 0.2 * se, xtol=1e-14)
    h_hi = brentq(hall_p, mean + 0.2 * se, mean + 20 * se, xtol=1e-14)
    lo, hi, why = Cell(np.array(x), signflip_signs(n, 2000, 0)).interval(0.95)
    assert why is None
    assert lo == pytest.approx(min(t_lo, h_lo), abs=1e-9) and hi == pytest.approx(max(t_hi, h_hi), abs=1e-9)
    if sign > 0:  # skewed right: Hall's interval sits to the right of t's
        assert h_lo > t_lo + 1e-3 and h_hi > t_hi + 1e-3
    else:
        assert h_lo < t_lo - 1e-3 and h_hi < t_hi - 1e-3


def hand_signflip_p(x: list[float], mu: float, signs: list[tuple[float, ...]]) -> float:
    """Share of sign vectors whose |sum| reaches the observed one, in plain Python."""
    y = [v - mu for v in x]
    obs = abs(sum(y))
    return sum(abs(sum(s * v for s, v in zip(row, y, strict=True))) >= obs - 1e-9 for row in signs) / len(signs)


def test_signflip_switches_to_monte_carlo_exactly_past_2_to_the_n() -> None:
    """Issue 39 item 5: a surviving mutant sat in the switch between exact enumeration and
    Monte Carlo. With n = 5 prompts, ``resamples`` = 32 = 2^5 enumerates all 32 sign vectors
    (the exact p, 4/32); 31 draws 31 random ones beside the observed vector, so 32 rows that
    are not all the vectors; 8 (a product 2 n would let it pass) draws too."""
    import itertools

    from pairflow.analysis.inference import Cell, signflip_signs

    x = [0.9, 0.7, 0.4, 0.2, -0.1]
    every = list(itertools.product((1.0, -1.0), repeat=5))
    assert hand_signflip_p(x, 0.0, every) == 4 / 32
    exact = signflip_signs(5, 32, 7)
    assert exact.shape == (32, 5) and {tuple(r) for r in exact} == set(every)
    assert Cell(np.array(x), exact).p_signflip(0.0) == 4 / 32
    mc = signflip_signs(5, 31, 7)
    assert mc.shape == (32, 5) and len({tuple(r) for r in mc}) < 32
    assert Cell(np.array(x), mc).p_signflip(0.0) == hand_signflip_p(x, 0.0, [tuple(r) for r in mc]) != 4 / 32
    assert signflip_signs(5, 8, 7).shape == (9, 5)
    assert signflip_signs(3, 8, 7).shape == (8, 3)  # 2^3 = 8: exact again


def test_monte_carlo_signflip_counts_the_observed_vector_once() -> None:
    """The Monte Carlo p is (1 + #draws at least as extreme) / (B + 1): the observed all-plus
    vector is row 0 and is counted, so p >= 1 / (B + 1). 40 positive prompts: no draw of
    B = 99 reaches the observed sum, p = 1/100 exactly (0 without the observed vector,
    2/101 with it twice). A mixed sample's p is recounted from the same seeded draws."""
    from pairflow.analysis.inference import Cell, signflip_signs

    signs = signflip_signs(40, 99, 3)
    assert signs.shape == (100, 40) and np.all(signs[0] == 1.0) and set(np.unique(signs[1:])) == {-1.0, 1.0}
    draws = np.random.default_rng(3).choice([-1.0, 1.0], (99, 40))
    assert np.array_equal(signs[1:], draws)
    pos = np.linspace(0.1, 2.0, 40)
    assert Cell(pos, signs).p_signflip(0.0) == 1 / 100
    rng = np.random.default_rng(8)
    x = rng.normal(0.25, 1.0, 40)
    want = hand_signflip_p(list(x), 0.0, [tuple([1.0] * 40)] + [tuple(r) for r in draws])
    assert 1 / 100 < want < 1
    assert Cell(x, signs).p_signflip(0.0) == pytest.approx(want, abs=1e-15)
    # the observed vector is the all-plus one: a mean far from the data is rejected at the floor 1/(B+1)
    assert Cell(x, signs).p_signflip(100.0) == 1 / 100


def test_the_signflip_test_joins_the_union_up_to_5_prompts_and_for_quantised_values() -> None:
    """The union's switch at ``SIGNFLIP_ALWAYS_UP_TO`` = 5 and at "half the prompts on one
    value", both sides: at 5 prompts p = max(t, Hall, sign-flip) where the sign-flip p is the
    largest; at 6 continuous prompts it is max(t, Hall) (hand computation); at 6 prompts
    with 3 on one value, the sign-flip p joins again; with 2 of 6 it does not."""
    import itertools

    from pairflow.analysis.inference import SIGNFLIP_ALWAYS_UP_TO, Cell, signflip_signs

    assert SIGNFLIP_ALWAYS_UP_TO == 5
    five = [0.5, 0.6, 0.7, 0.8, 0.9]
    sf5 = hand_signflip_p(five, 0.0, list(itertools.product((1.0, -1.0), repeat=5)))
    assert sf5 == 2 / 32 and hand_union_p(five, 0.0) < sf5
    assert Cell(np.array(five), signflip_signs(5, 2000, 0)).p(0.0) == sf5
    six = [0.5, 0.6, 0.7, 0.8, 0.9, 1.1]
    c6 = Cell(np.array(six), signflip_signs(6, 2000, 0))
    assert not c6.uses_signflip and c6.p(0.0) == pytest.approx(hand_union_p(six, 0.0), abs=1e-12)
    every6 = list(itertools.product((1.0, -1.0), repeat=6))
    half = [0.5, 0.5, 0.5, 0.8, 0.9, 1.1]
    sf_half = hand_signflip_p(half, 0.0, every6)
    assert sf_half > hand_union_p(half, 0.0)
    ch = Cell(np.array(half), signflip_signs(6, 2000, 0))
    assert ch.quantised and ch.p(0.0) == sf_half
    third = [0.5, 0.5, 0.6, 0.8, 0.9, 1.1]
    assert hand_signflip_p(third, 0.0, every6) > hand_union_p(third, 0.0)
    ct = Cell(np.array(third), signflip_signs(6, 2000, 0))
    assert not ct.quantised and ct.p(0.0) == pytest.approx(hand_union_p(third, 0.0), abs=1e-12)


def test_signflip_min_p_is_2_over_2_to_the_n() -> None:
    from pairflow.analysis.inference import min_prompts, signflip_min_p

    assert [signflip_min_p(n) for n in (0, 1, 2, 5, 6)] == [1.0, 1.0, 0.5, 1 / 16, 1 / 32]
    # 2/2^n < alpha: 0.05 needs 6 prompts (2/64 = 0.031; 2/32 = 0.0625 does not); a quantised
    # metric at alpha 0.01 needs 8 (2/256), a continuous one stops at 6, where t takes over.
    assert min_prompts(0.05, False) == 6 and min_prompts(0.01, True) == 8 and min_prompts(0.01, False) == 6
    assert min_prompts(0.0625, True) == 6  # at the level exactly 2/2^n does not reject


@pytest.mark.parametrize("sign", [1, -1])
def test_the_margins_null_is_the_loss_edge_in_the_metrics_direction(sign: int) -> None:
    """Issue 39 item 5: a mutant of the margin's direction gave a lower-is-better metric a
    wrong "non-inferior". Higher is better: the loss edge is -margin; lower is better: +margin."""
    from pairflow.analysis.inference import Question

    assert Question("margin", sign, margin=0.3).null == (-0.3 if sign == 1 else 0.3)
    assert Question("difference", sign, margin=0.3).null == 0.0
    assert Question("floor", sign, floor=0.7).null == 0.7
    # a margin or floor question given none is the one at 0 (the dataclass's defaults)
    assert Question("margin", sign).null == 0.0 and Question("margin", sign).hypothesis == "loss = margin 0 (non-inferiority)"
    assert Question("floor", sign).null == 0.0 and Question("floor", sign).hypothesis == "mean value = floor 0"


LOWER_BETTER = [(-0.09, 0.1, "non_inferior"), (-0.25, 0.1, "superior"), (0.2, 0.3, "worse_non_inferiority_not_shown"),
                (0.55, 0.3, "inferior"), (0.0, 0.3, "equivalent"), (0.0, 0.1, "inconclusive")]
"""(raw mean difference, margin, CONSORT word) of a lower-is-better metric (a negative
difference: the treatment lowered it, an improvement) with the spread of ``spread``: a
t interval of half-width 0.142, each edge at least 0.04 from 0 and the margin."""


def spread(mean: float) -> np.ndarray:
    base = np.array([0.21, -0.18, 0.05, -0.27, 0.12, 0.3, -0.09, -0.14, 0.19, -0.19])
    return base - base.mean() + mean


@pytest.mark.parametrize("mean, margin, word", LOWER_BETTER)
def test_a_lower_is_better_margin_reads_each_word_from_the_interval(mean: float, margin: float, word: str) -> None:
    """The expected word is read here from the t interval in the better direction (-x),
    independently of ``verdict`` (the union interval of these nearly symmetric values is
    within 0.04 of it). A mutant flipping the margin's sign in the loss edge, the gain edge
    or the estimate's direction turns at least one of these into another word."""
    from scipy.stats import ttest_1samp

    from pairflow.analysis.inference import Cell, Question, signflip_signs, verdict

    x = spread(mean)
    ci = ttest_1samp(-x, 0.0).confidence_interval(0.95)
    assert expected(float(ci.low), float(ci.high), margin) == word  # test_verdicts' CONSORT reading
    cell = Cell(x, signflip_signs(10, 2000, 0))
    lo, hi, _why = cell.interval(0.95)
    assert lo is not None and hi is not None and abs(lo + ci.high) < 0.04 and abs(hi + ci.low) < 0.04
    code, _detail, rests_on = verdict(cell, Question("margin", -1, margin=margin), 0.05, 0.8)
    assert code == word
    if word != "worse_non_inferiority_not_shown":  # that word rests on the test of 0 alone
        assert rests_on[0] == margin  # the loss edge of a lower-is-better metric is +margin in raw units


def test_variance_split_recovers_known_components() -> None:
    """Issue 39 item 5: a surviving mutant sat in the seed-variance split. Three seeds per
    prompt at prompt means 1, 3, 8 and offsets (-c, 0, +c) per prompt, c = 0.3, 0.6, 0.9:
    within-prompt variances c^2 (ddof 1: (c^2 + 0 + c^2) / 2), so the seed variance of a
    per-prompt mean is mean(c^2) / 3 = 0.42 / 3 = 0.14; the prompt part is the variance of
    the prompt means, (9 + 1 + 16) / 2 = 13, less the seed part."""
    from pairflow.analysis.inference import variance_split

    means, offsets = [1.0, 3.0, 8.0], [0.3, 0.6, 0.9]
    values = {(f"p{i}", s): m + o * d for i, (m, o) in enumerate(zip(means, offsets, strict=True))
              for s, d in enumerate((-1.0, 0.0, 1.0))}
    seed_var = (0.09 + 0.36 + 0.81) / 3 / 3
    grand = sum(means) / 3
    between = sum((m - grand) ** 2 for m in means) / 2
    var_prompt, var_seed, k = variance_split(values)
    assert k == 3.0 and var_seed == pytest.approx(seed_var, abs=1e-12)
    assert var_prompt == pytest.approx(between - seed_var, abs=1e-12) and between == pytest.approx(13.0)
    # unequal seeds: k is the mean count; a prompt with one seed adds no within-prompt variance
    values2 = {("a", 0): 0.0, ("a", 1): 2.0, ("b", 0): 5.0, ("c", 0): 1.0, ("c", 1): 1.0, ("c", 2): 4.0}
    var_prompt2, var_seed2, k2 = variance_split(values2)
    within = (2.0 + 3.0) / 2  # var(0, 2) = 2; var(1, 1, 4) = 3
    pm = [1.0, 5.0, 2.0]
    between2 = sum((m - 8 / 3) ** 2 for m in pm) / 2
    assert k2 == 2.0 and var_seed2 == pytest.approx(within / 2, abs=1e-12)
    assert var_prompt2 == pytest.approx(between2 - within / 2, abs=1e-12)
    # the prompt part is clamped at 0 where seed noise explains all of the spread
    noisy = {("a", 0): 0.0, ("a", 1): 10.0, ("b", 0): 10.0, ("b", 1): 0.0}
    assert variance_split(noisy) == (0.0, 25.0, 2.0)
    assert variance_split({("a", 0): 1.0, ("b", 0): 2.0}) == (None, None, 1.0)  # one seed: no split
    assert variance_split({("a", 0): 1.0, ("a", 1): 2.0}) == (None, None, 2.0)  # one prompt: no split


def test_at_3_prompts_the_union_keeps_halls_part() -> None:
    """At n = 3 (the fewest with a skewness) the union is max(t, Hall, exact sign-flip), each
    by hand; above the mean Hall's p exceeds both the sign-flip p (0.5) and t's, so dropping the skew
    at n = 3 (a surviving mutant of ``n >= 3``) changes p."""
    import itertools

    from scipy.stats import ttest_1samp

    from pairflow.analysis.inference import signflip_signs, union_p

    x = [0.1, 0.2, 1.5]
    for mu in (0.9, 1.0, 1.2):
        sf = hand_signflip_p(x, mu, list(itertools.product((1.0, -1.0), repeat=3)))
        want = max(hand_union_p(x, mu), sf)
        assert want > max(sf, float(ttest_1samp(x, mu).pvalue)) + 0.1  # Hall's part decides
        assert float(union_p(np.array([x]), mu, signflip_signs(3, 2000, 0))[0]) == pytest.approx(want, abs=1e-12)


def test_a_one_prompt_cell_has_no_spread_and_says_so_without_a_warning() -> None:
    """One value has no sample SD: the cell reads it as NaN itself (numpy's std with ddof 1
    would warn "degrees of freedom <= 0" into the report's log), and gives no test and no
    interval."""
    import warnings

    from pairflow.analysis.inference import Cell, signflip_signs

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cell = Cell(np.array([0.3]), signflip_signs(1, 2000, 0))
        assert math.isnan(cell.sd) and cell.mean == 0.3 and cell.skew is None and not cell.flat
        assert cell.p(0.0) is None and cell.interval(0.95) == (None, None, "no interval: fewer than 2 prompts")


def test_skewness_is_defined_from_3_values() -> None:
    """G1 (bias-adjusted, scipy's ``skew(bias=False)``) exists from 3 values; below, none."""
    from scipy.stats import skew

    from pairflow.analysis.inference import skewness

    x = np.array([0.1, 0.2, 1.5])
    assert skewness(x) == pytest.approx(float(skew(x, bias=False)), abs=1e-12) and skewness(x) > 1.5
    assert skewness(x[:2]) is None and skewness(np.full(4, 0.2)) is None


@pytest.mark.parametrize("centre", [0.0, 0.5, 1000.0])
def test_zero_spread_is_an_sd_within_1e_12_of_the_mean_or_of_1(centre: float) -> None:
    """"Flat" (no test, no interval) means sd <= 1e-12 * max(1, |mean|): rounding, not data.
    Around means up to 1 the tolerance is 1e-12 absolute: an SD of 1.87e-12 is spread (the
    test runs), 0.75e-12 is not; around 1000 it is relative (1e-9)."""
    from pairflow.analysis.inference import Cell, signflip_signs

    unit = 1e-12 * max(1.0, centre)
    signs = signflip_signs(6, 2000, 0)
    for step, flat in ((1.0, False), (0.4, True)):  # 0, 1, .., 5 steps: sd = 1.87 steps
        x = centre + np.arange(6.0) * step * unit
        assert (x.std(ddof=1) <= unit) == flat  # the sample really sits on that side
        cell = Cell(x, signs)
        assert cell.flat == flat and (cell.p(centre) is None) == flat


def test_a_sample_exactly_at_mu_is_no_evidence_against_it() -> None:
    """Every value equal to mu: the sign-flip statistic is 0 for every sign vector, each
    as extreme as the observed one, so p = 1 (the tie counts), in ``Cell.p_signflip`` and
    in ``union_p``'s flat rows (planning's simulated 0/1 studies can be all one value)."""
    from pairflow.analysis.inference import Cell, signflip_signs, union_p

    x = np.full(6, 0.3)
    for signs in (signflip_signs(6, 2000, 0), signflip_signs(6, 20, 1)):  # exact, Monte Carlo
        assert Cell(x, signs).p_signflip(0.3) == 1.0
        assert float(union_p(x[None, :], 0.3, signs)[0]) == 1.0
        assert float(union_p(x[None, :], 0.2, signs)[0]) < 1.0


@pytest.mark.parametrize("scale", [1e-7, 1.0, 1e6])
def test_the_signflip_p_does_not_depend_on_the_units(scale: float) -> None:
    """The sign-flip p counts sign vectors whose |sum| reaches the observed one, with a
    tolerance relative to the values (1e-9 of sum |y|), so a metric in other units (here
    scaled 1e-7 to 1e6) gets the same p: 4/32 for these 5 prompts (hand count)."""
    import itertools

    from pairflow.analysis.inference import Cell, signflip_signs, union_p

    x = [0.9, 0.7, 0.4, 0.2, -0.1]
    assert hand_signflip_p(x, 0.0, list(itertools.product((1.0, -1.0), repeat=5))) == 4 / 32
    signs = signflip_signs(5, 2000, 0)
    xs = np.array(x) * scale
    assert Cell(xs, signs).p_signflip(0.0) == 4 / 32
    want = max(hand_union_p(x, 0.0), 4 / 32)
    assert float(union_p(xs[None, :], 0.0, signs)[0]) == pytest.approx(want, abs=1e-9)


def test_detectable_effect_scales_with_the_sd() -> None:
    """The detectable difference is in the metric's units: doubling the per-prompt SD
    doubles it, and at it the t-test's power (noncentral t, nc = d / sd * sqrt(n), scipy)
    is the target."""
    from scipy.stats import nct
    from scipy.stats import t as student

    from pairflow.analysis.inference import detectable_effect

    n, level, power = 12, 0.95, 0.8
    d1, d2 = detectable_effect(1.0, n, level, power), detectable_effect(2.0, n, level, power)
    assert d1 is not None and d2 is not None and d2 == pytest.approx(2 * d1, rel=1e-6)
    crit = student.ppf(0.975, n - 1)
    for sd, d in ((1.0, d1), (2.0, d2)):
        nc = d / sd * math.sqrt(n)
        assert float(nct.sf(crit, n - 1, nc) + nct.cdf(-crit, n - 1, nc)) == pytest.approx(power, abs=1e-6)
    # a low level (0.6, two-sided: critical value 0.88, below 1) still gives a positive effect with the power
    crit = student.ppf(0.8, n - 1)
    assert crit < 1
    d = detectable_effect(1.0, n, 0.6, power)
    assert d is not None and d > 0
    nc = d * math.sqrt(n)
    assert float(nct.sf(crit, n - 1, nc) + nct.cdf(-crit, n - 1, nc)) == pytest.approx(power, abs=1e-6)


def test_holm_adjusted_p_is_capped_at_1() -> None:
    """Holm's adjusted p is min(1, (m - rank) p), running max: for raw 0.6 and 0.7 of two
    tests, 2 * 0.6 = 1.2 reads 1, and 0.7 takes the running max, 1."""
    from pairflow.analysis.inference import family_levels

    adjusted, levels = family_levels([0.7, 0.6], 0.05, "holm")
    assert adjusted == [1.0, 1.0] and levels == [0.025, 0.025]
    adjusted, _ = family_levels([0.01, 0.3, 0.2], 0.05, "holm")
    assert adjusted == pytest.approx([0.03, 0.4, 0.4], abs=1e-15)


def test_a_question_is_immutable() -> None:
    """A Question is a value (hashable, read by several cells of a study): it cannot be changed."""
    import dataclasses

    from pairflow.analysis.inference import Question

    q = Question("margin", 1, margin=0.3)
    assert hash(q) == hash(Question("margin", 1, margin=0.3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.margin = 0.5  # type: ignore[misc]


def test_too_few_prompts_names_each_panel_below_the_familys_first_level(tmp_path: Path) -> None:
    """Two tests in the family (one treatment, an NR metric and an FR metric with a floor):
    Holm's first level is 0.05 / 2 = 0.025. The exact sign-flip test reaches 2 / 2^n < 0.025
    from 7 prompts (2/128), so a quantised metric needs 7; a continuous one 6 (t takes
    over past 5). A panel of 2 gets the full warning, 6 the quantised one, 7 none. Under
    Benjamini-Hochberg the first level is alpha itself (0.05): 6 prompts suffice for both."""
    from conftest import small_config

    from pairflow.analysis.inference import too_few_prompts
    from pairflow.plan.config import study_from_raw

    cfg = small_config(tmp_path, tmp_path / "model")
    cfg["panels"] = {}
    for n in (2, 6, 7):
        sheet = tmp_path / f"p{n}.tsv"
        sheet.write_text("prompt_id\tprompt\n" + "".join(f"q{i}\tprompt {i}\n" for i in range(n)))
        cfg["panels"][f"p{n}"] = {"sheet": str(sheet), "seeds": [0]}
    cfg["stats"] = {"resamples": 200, "floors": {"psnr": 30.0}, "multiplicity": "holm"}
    study = study_from_raw(cfg, tmp_path, source="test")
    assert [s.name for s in study.treatments] == ["pab"] and study.scorers == ("temporal_flickering", "psnr", "ssim")
    assert too_few_prompts(study) == [
        "panel 'p2' has 2 prompts: no verdict is possible in its own table (the exact sign-flip test decides at 5 "
        "prompts or fewer and its smallest p, 0.5, is not below 0.025 (alpha 0.05 / 2 tests, Holm)); 6 prompts "
        "would allow one (7 for a quantised metric such as a 0/1 score)",
        "panel 'p6' has 6 prompts: a quantised metric (a 0/1 score, half the prompts on one value) can get no "
        "verdict in its own table below 7 prompts (smallest sign-flip p 0.0312, level 0.025)"]
    cfg["stats"]["multiplicity"] = "bh"
    assert too_few_prompts(study_from_raw(cfg, tmp_path, source="test")) == [
        "panel 'p2' has 2 prompts: no verdict is possible in its own table (the exact sign-flip test decides at 5 "
        "prompts or fewer and its smallest p, 0.5, is not below 0.05 (alpha 0.05)); 6 prompts would allow one"]


def test_min_prompts_counts_from_2() -> None:
    """The union test exists from 2 prompts: at a level above 1/2 (2 / 2^2 = 0.5 < alpha) two
    prompts can already reject; at 0.5 exactly they cannot (3 are needed)."""
    from pairflow.analysis.inference import min_prompts

    assert min_prompts(0.6, True) == 2 and min_prompts(0.6, False) == 2
    assert min_prompts(0.5, True) == 3 and min_prompts(0.3, True) == 3 and min_prompts(0.2, True) == 4


def test_decide_in_counts_from_one_above_the_cells_own_and_says_when_it_had_the_power() -> None:
    """An inconclusive cell of 8 prompts (margin 0.5; estimate 0.04) had 23.5% simulated
    power at its own 8 (``plan_prompts``' power at ``now``). Asked for 20% power, the
    answer is the smallest count above its own, 9, never 8 or fewer; and since it had the
    power, the detail says it fell short by chance. The clause appears exactly when that
    power reaches the target: at a target equal to it, yes; a hair above, no."""
    from pairflow.analysis.inference import Cell, Question, plan_prompts, signflip_signs, verdict

    x = np.random.default_rng(5).normal(0.3, 1, 8)
    cell, q = Cell(x, signflip_signs(8, 2000, 0)), Question("margin", 1, margin=0.5)
    word, detail, _on = verdict(cell, q, 0.05, 0.2)
    assert word == "inconclusive" and "about 9 prompts would decide it" in detail
    assert "with as heavy a loss tail as this test is validated for (skewness 2)" in detail  # not quantised
    had = plan_prompts(cell, cell.mean, -0.5, 0.05, 0.2, now=8, start=9).power_now
    assert had == 0.235
    chance = f"this study's 8 prompts had {had:.0%} power under the same assumption, so it fell short by chance"
    assert chance in detail and chance in verdict(cell, q, 0.05, had)[1]
    assert "fell short" not in verdict(cell, q, 0.05, had + 0.001)[1]


def test_the_plan_is_planning_run_on_the_union_tests_decision() -> None:
    """``plan_prompts`` is ``planning.plan`` with ``decides`` (the union test on the
    boundary, the mean on the truth's side), the stressed model's loss tail on the
    boundary's side (truth above it: the tail below, ``loss_side`` -1) and the search
    started at the t-test's N for the pilot's SD (planning: "N grows by half from a
    guess"). The simulated power is not monotone in N to the last prompt, so the start can
    move the answer: for this pilot of 10 (truth 0.3, boundary -0.5), 55 from the t-test's
    guess for their difference 0.8 (15), 58 from none.
    With ``scale`` (the planning table's SD at its upper bound) the guess is the t-test's N
    at the scaled SD: for another pilot at twice its SD, 70 from that guess (32; 67 from the
    guess at half the SD, 5, below the start). Truth below the boundary: the mirror image."""
    from pairflow.analysis import planning
    from pairflow.analysis.inference import PLAN_SIGNFLIPS, Cell, decides, plan_prompts, required_prompts
    from pairflow.analysis.inference import signflip_signs as signs

    x = np.random.default_rng(1).normal(0, 1, (12, 10))[9]
    guess = required_prompts(float(x.std(ddof=1)), 0.8, 0.95, 0.8, limit=planning.PLAN_CAP)
    assert guess == 15
    decide = decides(-0.5, 1, 0.05, lambda n: signs(n, PLAN_SIGNFLIPS, 0), True)
    want = planning.plan(x, 0.3, decide, 0.8, start=11, guess=guess, loss_side=-1)
    assert want.prompts == 55
    assert plan_prompts(Cell(x, signs(10, 2000, 0)), 0.3, -0.5, 0.05, 0.8, start=11) == want
    assert planning.plan(x, 0.3, decide, 0.8, start=11, guess=None, loss_side=-1).prompts == 58
    # truth below the boundary (a lower-is-better metric's loss edge +0.8): the mean must land below
    # it (side -1), and the loss tail is above (loss_side +1); the mirror image of the plan above
    below = decides(0.8, -1, 0.05, lambda n: signs(n, PLAN_SIGNFLIPS, 0), True)
    mirrored = planning.plan(x, 0.0, below, 0.8, start=11, guess=guess, loss_side=1)
    assert mirrored.prompts is not None and 40 < mirrored.prompts < 75
    assert plan_prompts(Cell(x, signs(10, 2000, 0)), 0.0, 0.8, 0.05, 0.8, start=11) == mirrored
    x = np.random.default_rng(1).normal(0, 1, (12, 10))[6]
    guess = required_prompts(2 * float(x.std(ddof=1)), 0.8, 0.95, 0.8, limit=planning.PLAN_CAP)
    assert guess == 32
    decide = decides(-0.8, 1, 0.05, lambda n: signs(n, PLAN_SIGNFLIPS, 0), True)
    want = planning.plan(x, 0.0, decide, 0.8, start=11, guess=guess, loss_side=-1, scale=2.0)
    assert want.prompts == 70
    assert plan_prompts(Cell(x, signs(10, 2000, 0)), 0.0, -0.8, 0.05, 0.8, start=11, scale=2.0) == want


def test_required_prompts_says_none_beyond_its_limit() -> None:
    """An effect of 0.01 sd needs about 78,500 prompts: with a limit of 500 the answer is None
    (the block search stops at the limit), with no limit the count, whose power the
    noncentral t confirms and the count before it misses; and at 8 prompts, where the t's
    degrees of freedom matter, the same."""
    from scipy.stats import nct
    from scipy.stats import t as student

    from pairflow.analysis.inference import required_prompts

    assert required_prompts(1.0, 0.01, 0.95, 0.8, limit=500) is None
    n = required_prompts(1.0, 0.01, 0.95, 0.8)
    assert n is not None and 78_000 < n < 79_000

    def power(k: int, d: float = 0.01) -> float:
        crit, nc = student.ppf(0.975, k - 1), d * math.sqrt(k)
        return float(nct.sf(crit, k - 1, nc) + nct.cdf(-crit, k - 1, nc))

    assert power(n) >= 0.8 > power(n - 1)
    # few prompts, where the t's degrees of freedom (n - 1) matter: an effect of 1.27 sd needs 8
    # (n + 1 degrees of freedom, in the critical value or the power, would read 7)
    small = required_prompts(2.0, -2.54, 0.95, 0.8)
    assert small == 8 and power(8, 1.27) >= 0.8 > power(7, 1.27)
    assert required_prompts(2.0, -2.54, 0.95, 0.8, limit=7) is None  # one short of the answer: none


def test_holm_stops_at_an_adjusted_p_equal_to_alpha() -> None:
    """An adjusted p equal to alpha is not a rejection: Holm stops there, and every later
    cell gets the level it stopped at. Raw 0.01, 0.025, 0.03 of three tests: adjusted 0.03,
    0.05, 0.05; only the first rejected; levels 0.05/3, then 0.05/2 for both others (the
    third's raw 0.03 is above it, as its adjusted 0.05 is not below 0.05)."""
    from pairflow.analysis.inference import family_levels

    adjusted, levels = family_levels([0.01, 0.025, 0.03], 0.05, "holm")
    assert adjusted == pytest.approx([0.03, 0.05, 0.05], abs=1e-15) and adjusted[1] == 0.05
    assert levels == [0.05 / 3, 0.025, 0.025]


@pytest.mark.parametrize("mean, word, side", [(0.3, "superior", "better"), (-0.3, "inferior", "worse")])
def test_a_difference_verdict_names_the_side_its_interval_is_on(mean: float, word: str, side: str) -> None:
    """Without a margin, a rejected 0 reads superior or inferior by the estimate's sign, and
    the detail names that side, for any size of estimate (here +-0.3)."""
    from pairflow.analysis.inference import Cell, Question, signflip_signs, verdict

    code, detail, on = verdict(Cell(spread(mean) / 3, signflip_signs(10, 2000, 0)), Question("difference", 1),
                               0.05, 0.8)
    assert (code, on) == (word, [0.0]) and detail.startswith(f"the whole interval is on the {side} side of 0")


@pytest.mark.parametrize("x, level, m", [([2.3, 2.3, 2.3, 2.3, -1.3, 0.3, -1.2, -1.0], 0.95, 6),
                                         ([-1.2, -1.2, -1.2, -1.2, -1.2, 1.1, 0.9, 1.4], 0.75, 31)])
def test_a_quantised_cells_interval_edge_is_the_exact_signflip_edge(x: list[float], level: float, m: int) -> None:
    """Where the sign-flip test is part of the union its interval can be the widest, and
    the edge is found by bisection. Reference by hand (Hartigan's subset means): below the
    mean, flipping the prompts of a subset F reaches the observed |sum| exactly when
    sum_F (x - mu) <= 0 or its complement's is, so the exact p is 2 (1 + m) / 2^n, m the
    non-empty subsets whose mean is at most mu. At 8 prompts (half or more on one value:
    quantised) p >= 1 - level needs m >= 6 at level 0.95 and m >= 31 at 0.75 (p = 64/256
    = 0.25 exactly: accepted, the interval is closed); the lower edge is that subset mean,
    below the t interval's by more than 0.25. In the second sample the 31 subsets of the
    five -1.2s all have mean -1.2: p jumps from 2/256 to exactly 0.25 there."""
    import itertools

    from scipy.stats import ttest_1samp

    from pairflow.analysis.inference import Cell, signflip_signs

    means = sorted(sum(x[i] for i in f) / len(f) for k in range(1, 9) for f in itertools.combinations(range(8), k))
    edge = means[m - 1]
    signs = list(itertools.product((1.0, -1.0), repeat=8))
    for mu in (edge - 1e-6, edge + 1e-6, edge + 0.0123):  # below the mean: the subset-mean count is the p
        assert hand_signflip_p(x, mu, signs) == 2 * (1 + sum(v <= mu for v in means)) / 256
    assert hand_signflip_p(x, edge, signs) >= 1 - level > hand_signflip_p(x, edge - 1e-6, signs)
    cell = Cell(np.array(x), signflip_signs(8, 2000, 0))
    assert cell.quantised
    lo, _hi, why = cell.interval(level)
    assert why is None and lo == pytest.approx(edge, abs=1e-8)
    assert lo < float(ttest_1samp(x, 0.0).confidence_interval(level).low) - 0.25


def test_an_estimate_on_the_floor_is_told_no_count_will_decide_it() -> None:
    """A cell whose mean sits exactly on the floor (0.5, the mean of these six dyadic
    values) cannot be settled by more prompts if that is the truth: no prompt count is
    offered (the search would only climb to its cap)."""
    from pairflow.analysis.inference import Cell, Question, signflip_signs, verdict

    x = np.array([0.25, 0.75, 0.5, 0.375, 0.125, 1.0])
    assert float(x.mean()) == 0.5
    code, detail, on = verdict(Cell(x, signflip_signs(6, 2000, 0)), Question("floor", 1, floor=0.5), 0.05, 0.8)
    assert (code, on) == ("inconclusive", [0.5])
    assert detail == ("the interval holds the floor 0.5; the estimate sits on the boundary; no prompt count is likely "
                      "to decide it")


def test_a_simulated_study_on_the_boundary_does_not_decide() -> None:
    """``decides`` needs p < alpha and the mean strictly on the truth's side: a 0/1 study
    whose mean is exactly the boundary 0.5 decides nothing (and raises no numpy warning),
    one of quantised values at 0.9 (p = 1/2001, Monte Carlo) does, and with the truth
    below (side -1) neither does."""
    import warnings

    from pairflow.analysis.inference import decides, signflip_signs

    rows = np.array([[0.0, 1.0] * 10, [1.0] * 10 + [0.8] * 10])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        up = decides(0.5, 1, 0.05, lambda n: signflip_signs(n, 2000, 0), False)(rows)
        down = decides(0.5, -1, 0.05, lambda n: signflip_signs(n, 2000, 0), False)(rows)
    assert up.tolist() == [False, True] and down.tolist() == [False, False]


def test_two_prompts_are_quantised_by_the_stated_rule() -> None:
    """"Half the prompts or more on one value": of 2 prompts, one is half, so any 2-prompt
    cell is quantised (the sign-flip test decides it, as it does at <= 5 prompts anyway);
    1 prompt has no test; of 4 distinct values none is."""
    from pairflow.analysis.inference import Cell, signflip_signs

    assert Cell(np.array([0.1, 0.7]), signflip_signs(2, 2000, 0)).quantised
    assert not Cell(np.array([0.1]), signflip_signs(1, 2000, 0)).quantised
    assert not Cell(np.array([0.1, 0.7, 0.2, 0.4]), signflip_signs(4, 2000, 0)).quantised


def test_a_two_prompt_cell_is_tested_not_refused() -> None:
    """Two prompts have a test (its smallest p, 2/4, rejects nothing at 0.05): the verdict
    is inconclusive with the detectable difference at n=2, not "fewer than 2 prompts"."""
    from pairflow.analysis.inference import Cell, Question, signflip_signs, verdict

    cell = Cell(np.array([0.1, 0.7]), signflip_signs(2, 2000, 0))
    assert cell.p(0.0) == 0.5
    code, detail, on = verdict(cell, Question("difference", 1), 0.05, 0.8)
    assert (code, on) == ("inconclusive", [0.0]) and detail.startswith("no detectable difference at n=2;")


@pytest.mark.parametrize("scale", [1.0, 1e6])
def test_values_equal_to_rounding_share_a_value_at_any_scale(scale: float) -> None:
    """"Half the prompts on one value" counts values equal to rounding (1e-12 of the largest
    |value|, at least 1e-12) as one: 0.1 + 0.2 and 0.3 are one value, in any units, so
    three of these six are one value (quantised), and two of the other six are not."""
    from pairflow.analysis.inference import Cell, signflip_signs

    x = np.array([0.3, 0.1 + 0.2, 0.3, 0.9, 0.7, 0.5]) * scale
    assert x[0] != x[1]  # not equal as floats
    assert Cell(x, signflip_signs(6, 2000, 0)).quantised
    y = np.array([0.3, 0.1 + 0.2, 0.4, 0.9, 0.7, 0.5]) * scale
    assert not Cell(y, signflip_signs(6, 2000, 0)).quantised


def test_a_symmetric_cells_interval_is_students() -> None:
    """Skewness 0 (values symmetric about their mean): Hall's correction vanishes (a = 0) and
    the union's interval at 6 continuous prompts is exactly Student's t interval (scipy)."""
    from scipy.stats import ttest_1samp

    from pairflow.analysis.inference import Cell, signflip_signs

    x = np.array([-0.25, -0.125, -0.0625, 0.0625, 0.125, 0.25]) + 0.5  # dyadic: skewness exactly 0
    cell = Cell(x, signflip_signs(6, 2000, 0))
    assert cell.skew == 0.0 and not cell.uses_signflip
    ci = ttest_1samp(x, 0.0).confidence_interval(0.95)
    lo, hi, why = cell.interval(0.95)
    assert why is None and lo == pytest.approx(float(ci.low), abs=1e-12) and hi == pytest.approx(float(ci.high), abs=1e-12)


def test_the_tolerance_of_one_value_is_1e_12_for_values_up_to_1() -> None:
    """Values within 1e-12 of each other (times the largest |value| where that is above 1)
    are one value: three values 0.5e-12 apart around 0.5 make half of six prompts one value
    (quantised); 1.5e-12 apart, they are three values (not quantised)."""
    from pairflow.analysis.inference import Cell, signflip_signs

    for step, same in ((0.5e-12, True), (1.5e-12, False)):
        x = np.array([0.5, 0.5 + step, 0.5 + 2 * step, 0.9, 0.7, 0.1])
        assert (abs(x[1] - x[0]) <= 1e-12) == same
        assert Cell(x, signflip_signs(6, 2000, 0)).quantised == same


def test_union_p_takes_one_mu_per_row() -> None:
    """``union_p``'s mu may be one value per row (studies tested each at its own mu): the
    same p as each row alone."""
    from pairflow.analysis.inference import signflip_signs, union_p

    rng = np.random.default_rng(6)
    x, mu, signs = rng.normal(0, 1, (4, 8)), np.array([-0.5, 0.0, 0.3, 1.0]), signflip_signs(8, 2000, 0)
    each = [float(union_p(x[i : i + 1], float(mu[i]), signs)[0]) for i in range(4)]
    assert union_p(x, mu, signs).tolist() == pytest.approx(each, abs=1e-15)


def test_a_simulated_study_of_5_prompts_keeps_the_signflip_test_and_p_at_alpha_does_not_decide() -> None:
    """At 5 prompts the sign-flip test is part of the union even for continuous rows: five
    positive values have t p far below 0.05 but sign-flip p 2/32 = 0.0625, so they do not
    decide at 0.05; at alpha 0.0625 exactly they still do not (p < alpha, not <=); at 0.07
    they do."""
    from pairflow.analysis.inference import decides, signflip_signs

    row = np.array([[0.5, 0.6, 0.7, 0.8, 0.9]])
    for alpha, want in ((0.05, False), (0.0625, False), (0.07, True)):
        assert decides(0.0, 1, alpha, lambda n: signflip_signs(n, 2000, 0), True)(row).tolist() == [want]


def test_at_a_level_the_signflip_test_only_ties_the_interval_is_unbounded() -> None:
    """Five prompts: the smallest sign-flip p is 2/32 = 0.0625. At level 0.9375 (1 - level =
    0.0625 exactly) that p equals the level's alpha, which is not a rejection, so no mean is
    ever rejected and the interval is unbounded; at 0.93 (alpha 0.07) it is bounded."""
    from pairflow.analysis.inference import Cell, signflip_signs

    cell = Cell(np.array([0.5, 0.6, 0.7, 0.8, 0.9]), signflip_signs(5, 2000, 0))
    lo, hi, why = cell.interval(0.9375)
    assert lo is None and hi is None and why is not None and "no test can reach p < 0.0625" in why
    lo, hi, why = cell.interval(0.93)
    assert why is None and lo is not None and hi is not None


def test_a_p_exactly_at_alpha_is_not_a_rejection_in_a_verdict() -> None:
    """A verdict rejects a null when its p is below alpha, not at it (as ``family_levels``
    and planning read p). Five prompts 1..5, all above 0: the exact sign-flip p of mean 0
    is 2/32 = 0.0625 (only the all-plus and all-minus sign vectors reach the observed sum),
    above Student's (t = 4.24, df 4: 0.013; no skew, so Hall's is the same). At alpha
    0.0625 exactly the cell is inconclusive; a hair above, superior."""
    from pairflow.analysis.inference import Cell, Question, signflip_signs, verdict

    cell = Cell(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), signflip_signs(5, 2000, 0))
    assert cell.p(0.0) == 2 / 32
    assert verdict(cell, Question("difference", 1), 2 / 32, 0.8)[0] == "inconclusive"
    assert verdict(cell, Question("difference", 1), 0.0626, 0.8)[0] == "superior"


def test_the_interval_holds_the_extreme_values_the_signflip_test_accepts() -> None:
    """The interval is every mu the test accepts. Five symmetric prompts 0, 4.9, 5, 5.1, 10
    at level 0.9: at mu = 0 (the smallest value) one y is 0, so flipping it ties the
    observed sum and the exact sign-flip p is 4/32 = 0.125 >= 0.1: accepted (the union's p
    there is at least that). Just below 0 only the all-plus and all-minus vectors reach
    it, 2/32: rejected. Student's interval (mean 5 +- 2.13 * 3.54 / sqrt 5 = 1.6..8.4) is
    inside, so the sign-flip edges are the interval's: 0 and 10 (to 1e-7), each included."""
    from pairflow.analysis.inference import Cell, signflip_signs

    cell = Cell(np.array([0.0, 4.9, 5.0, 5.1, 10.0]), signflip_signs(5, 2000, 0))
    for edge in (0.0, 10.0):
        p = cell.p(edge)
        assert p is not None and p >= 0.125 and cell.p_signflip(edge) == 4 / 32
    lo, hi, why = cell.interval(0.9)
    assert why is None and lo is not None and hi is not None
    assert -1e-7 < lo <= 0.0 and 10.0 <= hi < 10.0 + 1e-7


@pytest.mark.parametrize("scale", [1e-12, 1e12])
def test_the_signflip_edges_are_the_same_in_any_units(scale: float) -> None:
    """The sign-flip edges of the interval do not depend on the units: the prompts of
    ``test_the_interval_holds_the_extreme_values_the_signflip_test_accepts`` times 1e-12 or
    1e12 get the same edges times the scale, to 1e-12 of the range (just beyond 0 and 10,
    where the p's 1e-9 tolerance still counts the nearly-zero y as a tie, by about
    1.25e-8)."""
    from pairflow.analysis.inference import Cell, signflip_signs

    x = np.array([0.0, 4.9, 5.0, 5.1, 10.0])
    lo, hi, _ = Cell(x, signflip_signs(5, 2000, 0)).interval(0.9)
    lo_s, hi_s, _ = Cell(scale * x, signflip_signs(5, 2000, 0)).interval(0.9)
    assert lo is not None and hi is not None and lo_s is not None and hi_s is not None
    assert -1e-7 < lo < 0.0 and 10.0 < hi < 10.0 + 1e-7
    assert lo_s / scale == pytest.approx(lo, abs=1e-11) and hi_s / scale == pytest.approx(hi, abs=1e-11)


@pytest.mark.parametrize("scale", [1.0, 1e12])
def test_whether_the_signflip_test_bounds_the_interval_does_not_depend_on_the_units(scale: float) -> None:
    """Five prompts 1..5 at level 0.9: the sign-flip test's smallest p, 2/32 = 0.0625, is
    below 0.1, so far from the data it rejects and the interval is bounded, in any units
    (here the values times 1e12: far from the data every y has one sign and none is
    within the p's rounding tolerance, 1e-9 of sum |y|, of zero)."""
    from pairflow.analysis.inference import Cell, signflip_signs

    cell = Cell(scale * np.array([1.0, 2.0, 3.0, 4.0, 5.0]), signflip_signs(5, 2000, 0))
    assert cell.bounded(0.9)
    lo, hi, why = cell.interval(0.9)
    assert why is None and lo is not None and hi is not None and lo < scale < 5 * scale < hi


def test_an_unbounded_interval_names_its_reason() -> None:
    """Where the sign-flip test cannot reject at the level the interval is unbounded and
    says why the test is in the union: 3 distinct prompts at 0.95 (smallest p 2/8 = 0.25)
    read "at most 5 prompts"; 6 prompts, half on one value, at 0.99 (smallest p 2/64 =
    0.031) read "quantised values"."""
    from pairflow.analysis.inference import Cell, signflip_signs

    few = Cell(np.array([1.0, 2.0, 4.0]), signflip_signs(3, 2000, 0))
    assert not few.quantised
    lo, hi, why = few.interval(0.95)
    assert lo is None and hi is None and why is not None and "(at most 5 prompts:" in why
    quant = Cell(np.array([0.0, 0.0, 0.0, 1.0, 2.0, 3.0]), signflip_signs(6, 2000, 0))
    assert quant.quantised
    lo, hi, why = quant.interval(0.99)
    assert lo is None and hi is None and why is not None and "(quantised values:" in why


@pytest.mark.parametrize("centre, half_gap, flat", [(0.0, 1.5e-12, False), (1e6, 1.05e-6, True)])
def test_union_p_reads_zero_spread_by_the_cells_rule(centre: float, half_gap: float, flat: bool) -> None:
    """``union_p`` calls a row flat (and gives the sign-flip p alone) exactly when ``Cell``
    does: sd <= 1e-12 * max(1, |mean|). Six prompts in three pairs, centre -+ g and centre
    (sd = g sqrt(0.8), not quantised: the pairs are more than 1e-12 of the values apart).
    At centre 0, g = 1.5e-12: sd 1.34e-12 is above 1e-12 * 1: not flat, the t test decides
    and 1e-3 below the values p is tiny. At centre 1e6, g = 1.05e-6: sd 0.94e-6 is within
    1e-12 * 1e6: flat, and p is the exact sign-flip p, 2/64."""
    from pairflow.analysis.inference import Cell, signflip_signs, union_p

    x = centre + np.array([-half_gap, -half_gap, 0.0, 0.0, half_gap, half_gap])
    cell = Cell(x, signflip_signs(6, 2000, 0))
    assert cell.flat is flat and not cell.quantised
    p = float(union_p(x[None, :], centre - 1e-3, cell.signs)[0])
    assert (p == 2 / 64) if flat else (p < 1e-20)


def test_bh_counts_an_adjusted_p_equal_to_alpha_as_not_rejected() -> None:
    """Benjamini-Hochberg's level is R alpha / m with R the adjusted p-values below alpha:
    raw 0.01 and 0.05 of two tests adjust to 0.02 and 0.05 (0.05 * 2 / 2); 0.05 is not
    below 0.05, so R = 1 and both levels are 0.025."""
    from pairflow.analysis.inference import family_levels

    adjusted, levels = family_levels([0.01, 0.05], 0.05, "bh")
    assert adjusted == [0.02, 0.05] and levels == [0.025, 0.025]


def test_power_reads_scipys_nan_lower_tail_as_0() -> None:
    """The two-sided power is a probability: at df 1 and noncentrality 40 scipy's
    nct.cdf(-2) is NaN (far into the lower tail), which counts 0, so the power is the
    upper tail alone."""
    from scipy.stats import nct

    from pairflow.analysis.inference import _power

    assert math.isnan(nct.cdf(-2.0, 1, 40.0))
    assert float(_power(2.0, 1, 40.0)) == float(nct.sf(2.0, 1, 40.0)) <= 1.0


def test_required_prompts_is_the_first_count_with_the_power() -> None:
    """The block search returns what a one-count-at-a-time search with the noncentral t
    (df n - 1 in the critical value and the power) returns: from 2 prompts (an effect of
    100 sd needs 2, also with a limit of 2), through the first block's end (264) to the
    second block's first count (265, an effect of 0.1727 sd). Zero spread needs 2."""
    from scipy.stats import nct
    from scipy.stats import t as student

    from pairflow.analysis.inference import required_prompts

    def one_at_a_time(d: float) -> int:
        k = 2
        while True:
            crit, nc = student.ppf(0.975, k - 1), d * math.sqrt(k)
            if nct.sf(crit, k - 1, nc) + np.nan_to_num(nct.cdf(-crit, k - 1, nc), nan=0.0) >= 0.8:
                return k
            k += 1

    assert required_prompts(1.0, 100.0, 0.95, 0.8) == required_prompts(1.0, 100.0, 0.95, 0.8, limit=2) == 2
    for d, n in ((3.0, 4), (1.5, 6), (1.0, 10), (0.8, 15), (0.17272901055587234, 265)):
        assert required_prompts(1.0, d, 0.95, 0.8) == one_at_a_time(d) == n
    assert required_prompts(0.0, 0.5, 0.95, 0.8) == 2


def test_zero_spread_detects_any_effect() -> None:
    """With a per-prompt SD of 0 every difference is detected: the detectable effect is 0."""
    from pairflow.analysis.inference import detectable_effect

    assert detectable_effect(0.0, 10, 0.95, 0.8) == 0.0


def test_a_one_metric_family_is_one_test(tmp_path: Path) -> None:
    """One treatment and one NR metric, its FR metrics without floors (not tested): the
    family is one test, Holm's first level is alpha itself (0.05), and 6 prompts allow a
    verdict for any metric (2/64 < 0.05); 5 get the warning, naming alpha alone."""
    from conftest import small_config

    from pairflow.analysis.inference import too_few_prompts
    from pairflow.plan.config import study_from_raw

    cfg = small_config(tmp_path, tmp_path / "model")
    cfg["panels"] = {}
    for n in (5, 6):
        sheet = tmp_path / f"p{n}.tsv"
        sheet.write_text("prompt_id\tprompt\n" + "".join(f"q{i}\tprompt {i}\n" for i in range(n)))
        cfg["panels"][f"p{n}"] = {"sheet": str(sheet), "seeds": [0]}
    cfg["stats"] = {"resamples": 200, "multiplicity": "holm"}
    study = study_from_raw(cfg, tmp_path, source="test")
    assert [s.name for s in study.treatments] == ["pab"] and study.scorers == ("temporal_flickering", "psnr", "ssim")
    assert too_few_prompts(study) == [
        "panel 'p5' has 5 prompts: no verdict is possible in its own table (the exact sign-flip test decides at 5 "
        "prompts or fewer and its smallest p, 0.0625, is not below 0.05 (alpha 0.05)); 6 prompts would allow one"]


@pytest.mark.parametrize("sd", [1e-12, 1e-9, 1e6])
def test_detectable_effect_is_as_precise_in_any_units(sd: float) -> None:
    """The detectable effect is sd times the effect in SDs, to 1e-12, for an SD of 1e-12
    as for 1e6 (the root search's tolerance is relative to its bracket, not 2e-12 in the
    metric's units, which at an SD of 1e-12 would be 4% of the answer)."""
    from pairflow.analysis.inference import detectable_effect

    one = detectable_effect(1.0, 12, 0.95, 0.8)
    d = detectable_effect(sd, 12, 0.95, 0.8)
    assert one is not None and d is not None and d / sd == pytest.approx(one, rel=1e-12)

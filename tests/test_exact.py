"""exact: the exact paired-proportions test of a 0/1 metric: exact at any n, defined at
zero spread, more power than the union test it replaced there (issue 39)."""

from __future__ import annotations

import numpy as np
import pytest

from pairflow.analysis import exact
from pairflow.analysis.inference import signflip_signs, union_p


def test_the_score_is_mcnemars_z_at_0_and_mcnemar_exact_is_the_binomial() -> None:
    b, c = np.array([5, 3, 0]), np.array([1, 3, 0])
    assert exact.score(b, c, 10, 0.0) == pytest.approx([4 / 6 ** 0.5, 0.0, 0.0])
    assert exact.mcnemar_exact(7, 0) == pytest.approx(2 / 2 ** 7) and exact.mcnemar_exact(0, 0) == 1.0


def test_zero_spread_does_not_show_non_inferiority_at_7_prompts() -> None:
    """Regression (issue 39): 7 identical 0/1 prompts (every difference 0) read
    "inconclusive" beside the sign-flip p 0.0156 at margin 0.2. A loss of 1 on one prompt in
    five leaves all 7 at 0 with probability 0.8^7 = 0.21, so no test may reject there."""
    cell = exact.BinaryCell(np.zeros(7), signflip_signs(7, 2000, 0))
    assert cell.p(-0.2) == pytest.approx(2 * 0.8 ** 7, rel=1e-6)
    lo, hi, why = cell.interval(0.95)
    assert why is None and lo == pytest.approx(-hi) and -0.5 < lo < -0.2  # exact, symmetric, holds the loss edge


def test_exact_has_more_power_than_the_union_test_and_keeps_its_size() -> None:
    """Exact by enumeration at 6 and 7 prompts (benchmarks/exact_power.py, BENCHMARKS.md)."""
    for n in (6, 7):
        signs = signflip_signs(n, 2 ** n, 0)

        def union(b: int, c: int, n: int = n, signs: np.ndarray = signs) -> bool:
            x = np.array([[1.0] * b + [-1.0] * c + [0.0] * (n - b - c)])
            return bool(union_p(x, 0.0, signs)[0] < 0.05)

        def now(b: int, c: int, n: int = n) -> bool:
            return exact.two_sided(b, c, n, 0.0) < 0.05

        assert exact.rejection_rate(n, 0.6, 0.05, now) > 1.5 * exact.rejection_rate(n, 0.6, 0.05, union)
        assert max(exact.rejection_rate(n, q, q, now) for q in np.linspace(0.02, 0.5, 13)) <= 0.05


def test_a_non_binary_cell_is_not_tested_exactly() -> None:
    assert exact.is_binary([0.0, 1.0], [1.0, 1.0], np.array([1.0, 0.0]))
    assert not exact.is_binary([0.0, 1.0], [1.0, 0.5], np.array([1.0, -0.5]))
    assert not exact.is_binary([0.2, 0.3], [0.2, 0.4], np.array([0.0, 0.1]))


def test_a_loss_of_1_is_still_a_0_1_metric() -> None:
    """Differences -1, 0 and +1 all fit the exact test (a mutant accepting only 0 and +1
    survived a mutation run: issue 39 item 5); 0.5 or a control value of 2 do not."""
    from pairflow.analysis.exact import is_binary

    assert is_binary([1.0, 0.0, 1.0], [0.0, 0.0, 1.0], np.array([-1.0, 0.0, 0.0]))
    assert is_binary([0.0, 1.0], [1.0, 0.0], np.array([1.0, -1.0]))
    assert not is_binary([1.0, 0.0], [0.0, 0.0], np.array([-0.5, 0.0]))
    assert not is_binary([2.0, 0.0], [1.0, 0.0], np.array([-1.0, 0.0]))
    assert not is_binary([1.0], [0.0], np.array([-1.0]))  # one prompt: no test


def test_a_0_1_cell_at_zero_spread_is_tested_not_refused() -> None:
    """Seven prompts all 0 against 0 have zero spread, but the exact test needs none: the
    verdict is read from it, never the zero-spread refusal (``BinaryCell.flat`` is False;
    issue 39 item 5)."""
    from pairflow.analysis.inference import Question, verdict

    cell = exact.BinaryCell(np.zeros(7), signflip_signs(7, 2000, 0))
    assert not cell.flat and cell.p(0.0) == 1.0
    _code, detail, _on = verdict(cell, Question("margin", 1, margin=0.5), 0.05, 0.8)
    assert "zero spread" not in detail


def _tango_reference(b: int, c: int, n: int, d0: float) -> float:
    """Tango's score from its definition: the variance of b - c under delta = d0 at the
    maximum-likelihood p- (found by a bounded numerical search, not the closed form)."""
    import math

    from scipy.optimize import minimize_scalar

    lo, hi = max(0.0, -d0), (1 - d0) / 2

    def nll(q: float) -> float:
        return -sum(k * math.log(max(p, 1e-300)) for k, p in ((b, q + d0), (c, q), (n - b - c, 1 - 2 * q - d0)) if k)

    found = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x
    q = min((lo, hi, found), key=nll)
    return (b - c - n * d0) / math.sqrt(n * (2 * q + d0 * (1 - d0)))


def test_the_score_equals_tangos_statistic_at_the_maximum_likelihood_nuisance() -> None:
    """The closed-form MLE of p- under delta = d0 (the root of Tango's quadratic) gives
    the same score as maximising the trinomial likelihood numerically, for every outcome
    of 6 prompts, at nulls of both signs and near 0 (where only ties leave the
    discriminant below 1: a mutant that floored it at 1 survived, issue 39 item 5)."""
    n = 6
    for d0 in (-0.6, -0.2, -0.01, 0.01, 0.3, 0.7):
        for b in range(n + 1):
            for c in range(n + 1 - b):
                got = float(exact.score(np.array([b]), np.array([c]), n, d0)[0])
                assert got == pytest.approx(_tango_reference(b, c, n, d0), rel=1e-6, abs=1e-6), (b, c, d0)


def test_the_observed_outcome_counts_toward_its_own_p_even_at_an_infinite_score() -> None:
    """Each one-sided p is at least the observed outcome's own null probability (it is
    "at least as extreme" as itself). Within 1e-13 of delta = -1 or +1 the score's variance
    vanishes and the score is infinite; the tie with itself must still count there."""
    from scipy.stats import multinomial

    n = 2
    for d0 in (-1 + 1e-13, -0.5, 0.0, 0.4, 1 - 1e-13):
        q = np.linspace(max(0.0, -d0), (1 - d0) / 2, exact.NUISANCE_GRID + 1)  # the test's own nuisance grid
        probs = np.stack([q + d0, q, 1 - 2 * q - d0], axis=1).clip(0.0, 1.0)
        for b in range(n + 1):
            for c in range(n + 1 - b):
                own = max(float(multinomial.pmf([b, c, n - b - c], n, p / p.sum())) for p in probs)
                up, down = exact.one_sided(b, c, n, d0)
                assert up >= own * (1 - 1e-9) and down >= own * (1 - 1e-9), (b, c, d0, up, down, own)


def test_at_delta_plus_or_minus_1_the_null_is_one_outcome_and_beyond_it_none() -> None:
    """delta = 1 means every prompt gained 1: that outcome is the null itself (p 1, the
    limit of the p as d0 rises to 1), any other is impossible under it (p 0); no delta
    exceeds 1, so "delta > 1.5" is never shown and "delta < 1.5" always is. Mirrored at -1.
    (The branch had the two one-sided p swapped: p 0 of the null at its own outcome.)"""
    n = 4
    for b in range(n + 1):
        for c in range(n + 1 - b):
            for end in (1.0, -1.0):
                limit = exact.one_sided(b, c, n, end * (1 - 1e-9))
                assert exact.one_sided(b, c, n, end) == pytest.approx(limit, abs=1e-6), (b, c, end)
            assert exact.one_sided(b, c, n, 1.5) == (1.0, 0.0) and exact.one_sided(b, c, n, -1.5) == (0.0, 1.0)
    assert exact.two_sided(n, 0, n, 1.0) == 1.0 and exact.two_sided(0, n, n, -1.0) == 1.0
    assert exact.two_sided(n - 1, 0, n, 1.0) == 0.0 and exact.two_sided(0, n - 1, n, -1.0) == 0.0  # impossible: 0


def test_two_prompts_get_an_exact_interval() -> None:
    """Two gains of two: under delta = d, p+ = p- + d is largest, (1 + d) / 2, with no ties,
    so two gains have probability at most ((1 + d) / 2)^2; the 95% interval's lower edge is
    where that is 2.5%, d = 2 sqrt(0.025) - 1, and its upper edge is 1."""
    cell = exact.BinaryCell(np.ones(2), signflip_signs(2, 2000, 0))
    lo, hi, why = cell.interval(0.95)
    assert why is None and lo == pytest.approx(2 * 0.025 ** 0.5 - 1, abs=1e-9) and hi == 1.0
    assert cell.p(0.0) == pytest.approx(0.5)  # two gains under no effect: at most (1/2)^2, doubled


def test_rejection_rate_is_the_trinomial_probability_of_the_rejected_outcomes() -> None:
    """A test that always rejects has rate 1 (the trinomial law sums to 1, also with a
    probability of 0 at either end); one rejecting only (b, c) = (2, 1) of 3 has rate
    3 p+^2 p-; one that never rejects, 0."""
    for p_plus, p_minus in ((0.5, 0.25), (0.0, 0.3), (0.3, 0.0), (0.6, 0.4), (0.0, 0.0)):
        assert exact.rejection_rate(5, p_plus, p_minus, lambda b, c: True) == pytest.approx(1.0, abs=1e-12)
    assert exact.rejection_rate(3, 0.5, 0.25, lambda b, c: (b, c) == (2, 1)) == pytest.approx(3 * 0.5 ** 2 * 0.25)
    assert exact.rejection_rate(3, 0.5, 0.25, lambda b, c: False) == 0.0


def test_mcnemar_exact_is_the_binomial_on_the_discordant_prompts() -> None:
    """5 gains and 2 losses: two-sided binomial p of 5 of 7 at 1/2, 2 (1 + 7 + 21) / 2^7
    = 0.453125, the same for 2 gains and 5 losses; the ties (b = c) give 1."""
    assert exact.mcnemar_exact(5, 2) == pytest.approx(58 / 128) and exact.mcnemar_exact(2, 5) == pytest.approx(58 / 128)
    assert exact.mcnemar_exact(3, 3) == 1.0


def test_the_p_is_the_supremum_over_the_documented_nuisance_grid() -> None:
    """Each one-sided p is the largest, over p- on 201 equally spaced points from its
    smallest to its largest value under the null (``NUISANCE_GRID`` = 200 steps, both ends
    included), of the trinomial probability of a score at least (at most) the observed
    one, here summed by scipy's multinomial law. The cases chosen have their supremum
    inside the range, where another grid moves the p (by about 4e-5 of it), or a null
    (0.1, 0.2) at which the tie probability 1 - 2 p- - delta at the range's end rounds
    below 0 (-3e-17, -6e-17): a probability still, 0, never a NaN."""
    from scipy.stats import multinomial

    n = 7
    ob, oc = (a.ravel() for a in np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij"))
    ob, oc = ob[ob + oc <= n], oc[ob + oc <= n]
    outcomes = np.stack([ob, oc, n - ob - oc], axis=1)
    for b, c, d0 in ((6, 0, 0.0), (0, 6, 0.0), (0, 5, -0.2), (6, 0, -0.2), (0, 5, 0.2), (1, 0, 0.1)):
        z, z_obs = exact.score(ob, oc, n, d0), float(exact.score(np.array([b]), np.array([c]), n, d0)[0])
        up = down = 0.0
        for q in np.linspace(max(0.0, -d0), (1 - d0) / 2, 201):
            pmf = multinomial.pmf(outcomes, n, np.clip([q + d0, q, 1 - 2 * q - d0], 0.0, 1.0))
            up, down = max(up, float(pmf[z >= z_obs].sum())), max(down, float(pmf[z <= z_obs].sum()))
        assert exact.one_sided(b, c, n, d0) == pytest.approx((min(1.0, up), min(1.0, down)), rel=1e-9), (b, c, d0)


def test_outcomes_whose_scores_tie_exactly_are_equally_extreme() -> None:
    """Tied scores are ties even where floating point rounds them apart: at delta = -0.2 of
    5 prompts, (1 gain, 4 losses) and (0, 2) have the same score (equal to 60 digits in
    exact decimal arithmetic; the floats differ by 1e-15), and at -0.25 of 6 prompts so do
    (2, 1) and six ties (sqrt 2). Each one's p counts the other, so their p are equal."""
    for (first, second), n, d0 in ((((1, 4), (0, 2)), 5, -0.2), (((2, 1), (0, 0)), 6, -0.25)):
        z = exact.score(np.array([first[0], second[0]]), np.array([first[1], second[1]]), n, d0)
        assert z[0] != z[1] and z[0] == pytest.approx(z[1], rel=1e-14)  # the rounding this is about
        assert exact.one_sided(*first, n, d0) == exact.one_sided(*second, n, d0)


def test_a_p_is_never_above_1() -> None:
    """The least extreme outcome's p sums every outcome's probability, and that sum rounds
    above 1 (1 + 2e-16 at 2 prompts and d0 = -0.85): each one-sided p is capped at 1."""
    for n in (2, 3):
        for d0 in (-0.85, -0.7, -0.3, 0.2, 0.6):
            for b in range(n + 1):
                for c in range(n + 1 - b):
                    up, down = exact.one_sided(b, c, n, d0)
                    assert 0.0 <= up <= 1.0 and 0.0 <= down <= 1.0, (b, c, n, d0, up, down)


def test_a_0_1_cell_counts_its_gains_and_losses() -> None:
    """Gains are the prompts at +1, losses those at -1: 5 and 2 of 8, and the cell's p is
    the exact test's of those counts."""
    cell = exact.BinaryCell(np.array([1.0, 1.0, -1.0, 0.0, 1.0, 1.0, -1.0, 1.0]), signflip_signs(8, 2000, 0))
    assert cell.counts == (5, 2)
    assert cell.p(0.0) == exact.two_sided(5, 2, 8, 0.0) and cell.p(-0.2) == exact.two_sided(5, 2, 8, -0.2)

"""analysis.sequential: the timed pass's stopping design (Stein's two-stage procedure).

The coverage test simulates the whole procedure as the timed pass and the stats run it:
the pilot's per-prompt log ratios decide N (``plan``), and the reported interval is the
wider of Stein's (``stein_half_width``) and the t-interval over the N prompts
(``stats.t_procedure``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pairflow.analysis import sequential
from pairflow.analysis.stats import t_procedure


def test_order_is_seeded_independent_of_input_order_and_stable_when_a_prompt_is_added() -> None:
    units = [("a", f"p{i}") for i in range(8)] + [("b", f"q{i}") for i in range(5)]
    first = sequential.order(units, 0)
    assert first == sequential.order(list(reversed(units)), 0) and sorted(first) == sorted(units)
    assert first != sequential.order(units, 1)  # the seed chooses the order
    grown = sequential.order([*units, ("a", "p99")], 0)
    assert [u for u in grown if u != ("a", "p99")] == first  # the others keep their relative places


def test_plan_times_what_the_pilot_spread_asks_for_within_the_ceiling() -> None:
    pilot = np.array([0.10, 0.14, 0.06, 0.12, 0.08])  # sd 0.0316
    q = 2.7764451051977987  # t(4) at 0.975
    need = math.ceil((q * pilot.std(ddof=1) / math.log1p(0.02)) ** 2)
    p = sequential.plan(pilot, 0.95, 0.02, 5, 200, 64)
    assert (p.prompts, p.stopped) == (need, "precision") and need == 20
    assert p.planned_half_width == pytest.approx(q * pilot.std(ddof=1) / math.sqrt(need))
    assert p.planned_half_width <= math.log1p(0.02)
    assert sequential.plan(pilot, 0.95, 0.02, 5, 200, 12) == sequential.Plan(
        12, "ceiling", 5, pytest.approx(pilot.std(ddof=1)), pytest.approx(q * pilot.std(ddof=1) / math.sqrt(12)))
    assert sequential.plan(pilot, 0.95, 0.02, 5, 9, 64).stopped == "exhausted"
    tight = sequential.plan(pilot / 100, 0.95, 0.02, 5, 200, 64)
    assert (tight.prompts, tight.stopped) == (5, "precision")  # never fewer than the pilot
    # a wider level or a finer precision asks for more prompts
    assert sequential.plan(pilot, 0.99, 0.02, 5, 999, 999).prompts > need
    assert sequential.plan(pilot, 0.95, 0.01, 5, 999, 999).prompts > need
    # fewer than two clean pilot prompts: the spread is unknown, everything up to the ceiling
    assert sequential.plan(np.array([0.1]), 0.95, 0.02, 5, 30, 64) == sequential.Plan(30, "exhausted", 1, None, None)


def test_stein_half_width_uses_the_pilots_spread_and_degrees_of_freedom() -> None:
    pilot = np.array([0.1, 0.3, 0.2])
    assert sequential.stein_half_width(pilot, 16, 0.95) == pytest.approx(4.302652729749464 * 0.1 / 4)
    assert sequential.stein_half_width(pilot[:1], 16, 0.95) is None


def _draw(rng: np.random.Generator, shape: str, sigma: float, size: tuple[int, int]) -> np.ndarray:
    if shape == "normal":
        return rng.normal(0.0, sigma, size)
    if shape == "t3":
        return rng.standard_t(3, size) * sigma / math.sqrt(3)
    # latency-like: mostly steady, one prompt in ten on a slower path (a cache that rarely skips)
    slow = rng.random(size) < 0.1
    x = rng.normal(0.0, sigma, size) + np.where(slow, 3 * sigma, 0.0)
    return x - 0.3 * sigma  # mean 0


def _coverage(shape: str, sigma: float, reps: int, stein: bool, rng: np.random.Generator,
              level: float = 0.95, precision: float = 0.02, n0: int = 5, cap: int = 64) -> tuple[float, float]:
    """(coverage of the true mean 0, mean prompts timed) of the procedure over ``reps`` studies;
    ``stein`` False: the naive rule (stop the first time the running t-interval is narrow enough).
    Rows that stop at the same N are evaluated together (``t_procedure`` is vectorised)."""
    x = _draw(rng, shape, sigma, (reps, cap))
    d = math.log1p(precision)
    n = np.full(reps, cap)
    if stein:
        n = np.array([sequential.plan(row[:n0], level, precision, n0, cap, cap).prompts for row in x])
    else:
        open_ = np.ones(reps, dtype=bool)
        for k in range(n0, cap + 1):
            lo, hi, _p = t_procedure(x[:, :k], level)
            stop = open_ & ((hi - lo) / 2 <= d)
            n[stop], open_ = k, open_ & ~stop
    covered = 0
    for k in np.unique(n):
        rows = x[n == k, :k]
        lo, hi, _p = t_procedure(rows, level)
        mid = rows.mean(axis=1)
        half = np.maximum(hi - mid, mid - lo)
        if stein:
            half = np.maximum(half, [sequential.stein_half_width(r[:n0], int(k), level) for r in rows])
        covered += int(np.sum(np.abs(mid) <= half))
    return covered / reps, float(n.mean())


@pytest.mark.parametrize("shape", ["normal", "t3", "latency-like"])
def test_stopping_early_keeps_the_interval_at_its_level(shape: str) -> None:
    """Coverage at nominal 0.95 is at least 0.93 for spreads that stop anywhere from the
    pilot to the ceiling (sd of the per-prompt log ratio 1% to 6%: 5 to 64 prompts)."""
    rng = np.random.default_rng(20261204)
    for sigma in (0.01, 0.02, 0.035, 0.06):
        cov, used = _coverage(shape, sigma, 5000, True, rng)
        assert cov >= 0.93, (shape, sigma, cov, used)


def test_the_naive_stopping_rule_would_not_keep_its_level() -> None:
    """Why Stein: stopping the first time the running interval is narrow enough covers
    less than 0.93 where stopping is decided by noise (here sd 4%, about 30 prompts)."""
    naive, _ = _coverage("normal", 0.04, 6000, False, np.random.default_rng(7))
    stein, used = _coverage("normal", 0.04, 6000, True, np.random.default_rng(7))
    assert naive < 0.93 <= stein and 5 < used < 64


def test_a_plan_whose_need_equals_the_ceiling_stopped_for_precision() -> None:
    """The pilot asks for 20 prompts; with a ceiling of exactly 20 the planned half-width
    still reaches the precision, so it stops for "precision", not at the ceiling (19 is)."""
    pilot = np.array([0.10, 0.14, 0.06, 0.12, 0.08])
    assert sequential.plan(pilot, 0.95, 0.02, 5, 200, 20).stopped == "precision"
    assert sequential.plan(pilot, 0.95, 0.02, 5, 200, 19).stopped == "ceiling"
    assert sequential.plan(pilot, 0.95, 0.02, 5, 20, 64).stopped == "precision"  # the study's last prompt
    assert sequential.plan(pilot, 0.95, 0.02, 5, 19, 64).stopped == "exhausted"


def test_a_need_that_is_a_whole_number_up_to_rounding_is_that_number() -> None:
    """(q sd / d)^2 lands on 25 up to float rounding when the precision is chosen so that
    q sd / d = 5: the plan asks 25 prompts, not 26 (the 1e-9 guard takes rounding off,
    never adds a prompt)."""
    pilot = np.array([0.10, 0.14, 0.06, 0.12, 0.08])
    q = 2.7764451051977987  # t(4) at 0.975
    precision = math.expm1(q * float(pilot.std(ddof=1)) / 5)
    assert abs((q * float(pilot.std(ddof=1)) / math.log1p(precision)) ** 2 - 25) < 1e-9
    assert sequential.plan(pilot, 0.95, precision, 5, 200, 64).prompts == 25


def test_stein_half_width_from_a_pilot_of_2() -> None:
    """Two pilot prompts are enough for a spread (t with 1 df): q = 12.706, sd = 0.1414; the
    half-width is q sd / sqrt(N) for any N >= 1 timed prompts."""
    pilot = np.array([0.1, 0.3])
    assert sequential.stein_half_width(pilot, 4, 0.95) == pytest.approx(12.706204736174698 * math.sqrt(0.02) / 2)
    assert sequential.stein_half_width(pilot, 1, 0.95) == pytest.approx(12.706204736174698 * math.sqrt(0.02))
    assert sequential.stein_half_width(pilot, 0, 0.95) is None  # no prompts timed: no mean


def test_a_plan_is_immutable() -> None:
    """A timing plan is a value (recorded with the timing records): it cannot be changed."""
    import dataclasses

    p = sequential.plan(np.array([0.1, 0.2, 0.15]), 0.95, 0.02, 3, 50, 50)
    assert hash(p) == hash(dataclasses.replace(p))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.prompts = 3  # type: ignore[misc]


def test_two_clean_pilot_prompts_plan_from_their_spread() -> None:
    """Two pilot prompts give a spread (1 df): the plan asks what their SD asks for
    (q = 12.706: here 21 prompts), not the ceiling."""
    pilot = np.array([0.10, 0.11])
    q, sd = 12.706204736174698, float(pilot.std(ddof=1))
    need = math.ceil((q * sd / math.log1p(0.02)) ** 2)
    assert need == 21
    assert sequential.plan(pilot, 0.95, 0.02, 2, 200, 64) == sequential.Plan(
        need, "precision", 2, pytest.approx(sd), pytest.approx(q * sd / math.sqrt(need)))

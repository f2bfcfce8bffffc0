"""planning: the simulated studies are shaped and spread as stated, and the search finds the
smallest prompt count reaching the power, deterministically (issue 39). The plan's delivered
power against an independent simulation is in test_inference (it needs the union test)."""

from __future__ import annotations

import numpy as np

from pairflow.analysis import planning


def test_draws_keep_the_pilots_spread_and_the_stated_mean() -> None:
    x = np.random.default_rng(1).normal(3.0, 2.0, 12)
    y = planning.draws(x, 0.5, 40, np.ones(4000), 0, quantised=False)
    assert abs(y.mean() - 0.5) < 0.02 and abs(y.var(axis=1, ddof=1).mean() / x.var(ddof=1) - 1) < 0.03
    assert (np.abs(np.diff(np.sort(y, axis=1), axis=1)) > 0).all()  # smoothed: no ties to read as quantised
    q = planning.draws(np.array([0.0, 0.0, 0.0, 1.0, 0.5]), 0.0, 20, np.ones(10), 0, quantised=True)
    assert len(np.unique(np.round(q - q[:, :1], 12))) <= 5  # a quantised pilot keeps its ties


def test_search_finds_the_smallest_count_and_is_deterministic() -> None:
    x = np.random.default_rng(2).normal(0, 1, 10)

    def decides(v: np.ndarray) -> np.ndarray:  # a procedure that decides once a study has 37 prompts
        return np.full(len(v), v.shape[1] >= 37)

    for guess in (None, 5, 36, 37, 300):
        plan = planning.smallest_prompts(x, 0.0, decides, 0.8, start=6, guess=guess)
        assert plan.prompts == 37 and plan.power == 1.0
    assert planning.smallest_prompts(x, 0.0, decides, 0.8, start=6, cap=30).prompts is None
    a = planning.power_at(x, 0.2, 15, lambda v: v.mean(axis=1) > 0, seed=4)
    assert a == planning.power_at(x, 0.2, 15, lambda v: v.mean(axis=1) > 0, seed=4)
    assert planning.scale_df(x) <= 9 and planning.scale_df(np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 10.0])) < 9


def test_skewed_draws_have_the_stated_skewness_and_unit_spread() -> None:
    y = planning.skewed(np.random.default_rng(3), np.array([-2.0, 0.0, 1.0] * 100), 4000)
    for k, rows in ((-2.0, y[0::3]), (0.0, y[1::3]), (1.0, y[2::3])):
        r = rows.ravel() - rows.mean()
        assert abs(rows.mean()) < 0.01 and abs(rows.std() - 1) < 0.01
        assert abs(np.mean(r ** 3) / np.mean(r * r) ** 1.5 - k) < 0.1


def test_a_plan_delivers_its_power_under_skew_toward_losses() -> None:
    """Issue 39 item 3: pilots of 8 prompts from a population skewed toward losses
    (standardised lognormal, skewness -2, sd 1) rarely hold the loss tail, so their own
    shape under-plans (it delivered 0.46-0.63); the stressed model (a loss tail of
    skewness 2 at the pilot's SD, as well as the pilot's shape) delivers at least 0.78 in
    fresh studies from the population, analysed by the full union test. Margin 1 sd, true
    difference 0."""
    from pairflow.analysis.inference import decides, signflip_signs, union_p

    rng = np.random.default_rng(12)
    v = float(planning.lognormal_sigma(np.array([2.0]))[0])
    scale = np.sqrt(np.expm1(v * v) * np.exp(v * v))

    def population(shape: tuple[int, int]) -> np.ndarray:  # skewness -2: a few prompts lose a lot
        return -(rng.lognormal(0.0, v, shape) - np.exp(v * v / 2)) / scale

    decide = decides(-1.0, 1, 0.05, lambda n: signflip_signs(n, 200, 0), True)
    delivered = []
    for _ in range(32):
        plan = planning.plan(population((1, 8))[0], 0.0, decide, 0.8, start=6, reps=400)
        assert plan.prompts is not None
        y = population((400, plan.prompts))
        p = union_p(y, -1.0, signflip_signs(plan.prompts, 200, 0))
        delivered.append(float(np.mean((p < 0.05) & (y.mean(axis=1) > -1.0))))
    assert np.mean(delivered) >= 0.78

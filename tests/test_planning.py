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

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

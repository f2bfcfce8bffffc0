"""The tail, stated: what a cell's prompts rule out about prompts that break.

A test of the mean cannot see a failure the sample did not draw: a cache that leaves most
prompts alone and breaks a few badly can read "better" at 7-15 prompts whenever the panel
drew none of the few. So every cell with a margin (``stats.margins``) also says, per
prompt (the estimand's unit: the mean over seeds of treatment - control), how many prompts
lost more than the margin in the metric's bad direction, and the exact (Clopper-Pearson)
upper bound of the share of prompts that could: the upper end of the two-sided interval at
the study's level, so one-sided at (1 + level) / 2, the convention of a non-inferiority
claim read from a two-sided interval (a one-sided 95% bound admitted only 20% of the
false "better" cells at 15 prompts with 20% of prompts breaking: BENCHMARKS.md). It names
the ``WORST`` prompts by loss, and how many prompts (none of the added ones breaking) would
bound the breaking share below ``TAIL_SHARE``.

The flag (``outlying``): the worst prompt's loss lies more than ``OUTLIER_Z`` robust
standard deviations (1.4826 MAD about the median; 1.2533 x the mean absolute deviation
when half the prompts or more sit on the median) beyond the median loss. The interval of
the mean was checked for normal, t3 and |skewness| <= 2 values; a prompt this far out says
the cell's distribution is outside that, and the mean's interval is not guaranteed.
Simulated in ``benchmarks/tail_bench.py``: at 7-30 prompts it marks 0.3-4.2% of normal
cells and most cells that drew a breaking prompt.

Imports without torch.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import StatsError
from ..records.types import TailPrompt, TailStatement

TAIL_SHARE = 0.10
"""The breaking share the report asks a panel to be able to rule out (the low end of
"10-20% of prompts break"): ``prompts_to_bound`` counts the prompts that would bound it."""
WORST = 3
"""Prompts named per cell, worst loss first."""
OUTLIER_Z = 5.0
"""Robust z of the worst loss above which a cell is flagged (benchmarks/tail_bench.py)."""
MIN_PROMPTS_FLAG = 5
"""Fewest prompts for the flag: below it a median and MAD say nothing."""
BOUND_LIMIT = 100_000
"""Most prompts ``prompts_to_bound`` counts to (beyond: None, "no panel under ...")."""


def cp_upper(k: int, n: int, level: float) -> float:
    """Upper end of the two-sided Clopper-Pearson interval at confidence ``level`` for
    ``k`` events in ``n`` trials (1.0 when k == n). Raises StatsError for k outside 0..n
    or n < 1."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.stats import beta

    if n < 1 or not 0 <= k <= n:
        raise StatsError(f"a Clopper-Pearson bound needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    return 1.0 if k == n else float(beta.ppf(1 - (1 - level) / 2, k + 1, n - k))


def prompts_to_bound(k: int, n: int, share: float, level: float, limit: int = BOUND_LIMIT) -> int | None:
    """Fewest prompts N >= n at which ``k`` breaking prompts would put the upper bound
    (``cp_upper``) at or below ``share``: the panel's size if every prompt added to it holds.
    With k = 0 it solves (1 - share)^N <= (1 - level) / 2. None when that N exceeds ``limit``."""
    if not 0 < share < 1:
        raise StatsError(f"a breaking share to bound must lie in (0, 1), got {share}")
    if k == 0:
        need = max(n, math.ceil(math.log((1 - level) / 2) / math.log1p(-share) - 1e-9))
        return need if need <= limit else None
    lo = hi = max(n, k + 1)  # N = k is never enough: its bound is 1
    while cp_upper(k, hi, level) > share:  # the bound falls as N grows: double, then bisect
        if hi > limit:
            return None
        lo, hi = hi, 2 * hi
    while lo < hi:
        mid = (lo + hi) // 2
        if cp_upper(k, mid, level) <= share:
            hi = mid
        else:
            lo = mid + 1
    return hi if hi <= limit else None


def robust_z(loss: np.ndarray) -> np.ndarray:
    """Per row of ``loss`` (studies, n): how many robust standard deviations the largest
    loss lies above the median (MAD scaled by 1.4826; where the MAD is 0, the mean
    absolute deviation from the median scaled by 1.2533; 0 where both are 0)."""
    loss = np.atleast_2d(np.asarray(loss, dtype=np.float64))
    med = np.median(loss, axis=1, keepdims=True)
    mad = 1.4826 * np.median(np.abs(loss - med), axis=1)
    mead = 1.2533 * np.mean(np.abs(loss - med), axis=1)
    scale = np.where(mad > 0, mad, mead)
    top = loss.max(axis=1) - med[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(scale > 0, top / np.where(scale > 0, scale, 1.0), 0.0), dtype=np.float64)


def outlying(loss: np.ndarray) -> bool:
    """The flag for one cell's per-prompt losses: at least ``MIN_PROMPTS_FLAG`` prompts and
    the worst more than ``OUTLIER_Z`` robust standard deviations beyond the median."""
    return len(loss) >= MIN_PROMPTS_FLAG and bool(robust_z(loss)[0] > OUTLIER_Z)


def statement(loss: dict[str, float], worst: list[TailPrompt], margin: float, level: float) -> TailStatement:
    """The tail of one cell: ``loss`` maps a prompt ("<panel>/<prompt id>") to its loss
    (the mean over seeds of treatment - control, in the metric's bad direction: positive
    is worse), ``worst`` names the worst prompts' pairs (``WORST``, worst first; built by
    the caller, which knows the videos), ``margin`` is the cell's margin (> 0) and
    ``level`` the study's confidence. Raises StatsError for no prompts or a margin <= 0."""
    if not loss:
        raise StatsError("a tail statement needs at least one prompt")
    if margin <= 0:
        raise StatsError(f"a margin must be > 0, got {margin}")
    x = np.array([loss[p] for p in sorted(loss)], dtype=np.float64)
    n, k = len(x), int(np.sum(x > margin))
    z = float(robust_z(x)[0]) if n >= MIN_PROMPTS_FLAG else None
    return {"margin": margin, "n_prompts": n, "exceed": k, "share": k / n, "upper": cp_upper(k, n, level),
            "upper_level": level, "outlier_z": z, "flag": outlying(x), "target_share": TAIL_SHARE,
            "prompts_to_bound": prompts_to_bound(k, n, TAIL_SHARE, level), "worst": worst}


def sentence(t: TailStatement) -> str:
    """The statement in words: ``0 of 7 prompts lost more than 0.005; up to 41% could
    (95%, two-sided Clopper-Pearson)``."""
    return (f"{t['exceed']} of {t['n_prompts']} prompts lost more than {t['margin']:g}; up to "
            f"{t['upper']:.0%} could ({t['upper_level']:.0%}, two-sided Clopper-Pearson)")


def to_bound(t: TailStatement) -> str:
    """How many prompts would bound the breaking share below ``target_share``."""
    need = t["prompts_to_bound"]
    if need is None:
        return f"no panel under {BOUND_LIMIT} prompts would bound the breaking share below {t['target_share']:.0%}"
    more = need - t["n_prompts"]
    if more <= 0:
        return f"the breaking share is bounded below {t['target_share']:.0%}"
    return (f"{need} prompts ({more} more, none losing more than {t['margin']:g}) would bound the breaking share "
            f"below {t['target_share']:.0%}")


def flag_text(t: TailStatement) -> str:
    """The diagnostic line of a flagged cell: why, the statement, and the prompts that
    would bound the breaking share (whatever the verdict, so an inconclusive or favourable
    word beside it always carries it)."""
    return (f"outlying prompt: the worst loss is {t['outlier_z']:.1f} robust SDs beyond the median (> {OUTLIER_Z:g}); "
            f"the mean's interval is not guaranteed for this shape; {sentence(t)}; {to_bound(t)}")

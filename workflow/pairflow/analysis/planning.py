"""Sample size by simulating the verdict's own procedure on a pilot's paired differences.

"About N prompts would decide it" and the planning table's "prompts needed" used to be the
paired t-test's N, while the verdict comes from the union test (``inference``): at the
stated N they delivered 0.41-0.79 power instead of 0.8 (issue 39; BENCHMARKS.md). Here
N is the smallest prompt count at which simulated studies, analysed by the decision
procedure itself (passed in as ``decides``), reach the target power.

The model of a future study (``draws``), stated:

- **Shape: the pilot's.** Each simulated prompt is a pilot residual ``x_i - mean(x)``
  drawn with replacement (a bootstrap), plus Gaussian kernel noise of ``KERNEL`` times the
  pilot's spread (a smoothed bootstrap: ties between resampled values would otherwise read
  as quantised data to the union test), rescaled so the model's variance is the pilot's
  ``s^2``. A quantised pilot (half its prompts on one value: a 0/1 metric, identical
  videos) is resampled plain, so its ties, and the exact test they bring in, stay.
- **Scale: the pilot's, with its uncertainty.** Before each simulated study its spread is
  drawn as ``s * sqrt(nu / chi2_nu)`` (the posterior of a standard deviation given ``s``
  under the reference prior), ``nu = n - 1`` for normal tails and fewer where the pilot's
  excess kurtosis says ``s`` is less certain (``var(s^2) ~ sigma^4 (2 / (n - 1) + k / n)``:
  ``nu = 2 / (2 / (n - 1) + max(k, 0) / n)``, at least 2). ``scale`` instead fixes it
  (the planning table's "at the upper bound" column).
- **Mean: stated, not drawn.** Power is "if the true mean is ``truth``" (the estimate, or
  no difference): drawing the mean too would answer a different question (assurance).

Search (``smallest_prompts``): every candidate N gets ``PLAN_REPS`` studies from a
generator seeded by (``seed``, N), the scale draws shared across N (common random
numbers), so the answer is deterministic; N grows by half from a guess (the t-test's N)
until the power is reached, then bisects. Beyond ``PLAN_CAP`` prompts it says "more than".
Checked by an independent simulation in ``benchmarks/run.py power`` (BENCHMARKS.md).

Imports without torch or scipy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

PLAN_REPS = 2000
"""Simulated studies per candidate prompt count (Monte Carlo SE of a power of 0.8: 0.009)."""
PLAN_CAP = 2000
"""The most prompts the search tries; beyond it the answer is "more than PLAN_CAP"."""
KERNEL = 0.2
"""Smoothed bootstrap's kernel width, in pilot standard deviations (variance kept)."""
MIN_DF = 2.0
"""Fewest degrees of freedom the scale's uncertainty is drawn with (heavy-tailed pilots)."""

Decides = Callable[[np.ndarray], np.ndarray]
"""A decision procedure: per row of simulated per-prompt values (studies, n), whether it decides."""


@dataclass(frozen=True)
class Plan:
    """The answer of ``smallest_prompts``: ``prompts`` (None: more than ``cap``), the
    simulated power there, and the power at ``now`` prompts (the pilot's own count, when
    asked) under the same model."""

    prompts: int | None
    power: float
    cap: int
    power_now: float | None = None


def scale_df(x: np.ndarray) -> float:
    """Degrees of freedom of the pilot SD's uncertainty: ``n - 1``, fewer for a pilot
    whose excess kurtosis is positive, never below ``MIN_DF`` (see the module)."""
    n = len(x)
    r = x - x.mean()
    m2 = float(np.mean(r * r))
    kurt = float(np.mean(r ** 4)) / (m2 * m2) - 3.0 if m2 > 0 else 0.0
    return max(MIN_DF, min(n - 1.0, 2.0 / (2.0 / (n - 1) + max(kurt, 0.0) / n)))


def scale_draws(x: np.ndarray, reps: int, seed: int, scale: float | None) -> np.ndarray:
    """Each simulated study's spread as a multiple of the pilot's (reps,): drawn (see the
    module) or, with ``scale``, that fixed multiple."""
    if scale is not None:
        return np.full(reps, float(scale))
    nu = scale_df(x)
    return np.sqrt(nu / np.random.default_rng([seed, 0]).chisquare(nu, reps))


def draws(x: np.ndarray, truth: float, n: int, spread: np.ndarray, seed: int, quantised: bool) -> np.ndarray:
    """Simulated per-prompt values (len(spread), n) of studies at ``n`` prompts whose true
    mean is ``truth``, shaped as the pilot ``x`` (1-D, at least 2 values) with each
    study's spread ``spread`` times the pilot's (see the module)."""
    rng = np.random.default_rng([seed, n])
    r = x - x.mean()
    s = float(x.std(ddof=1))
    pop_sd = math.sqrt(float(np.mean(r * r)))
    picked = r[rng.integers(0, len(x), (len(spread), n))]
    if pop_sd == 0:
        return np.full((len(spread), n), truth)
    if quantised:
        y = picked * (s / pop_sd)
    else:
        y = (picked + KERNEL * pop_sd * rng.standard_normal(picked.shape)) * (s / pop_sd / math.sqrt(1 + KERNEL ** 2))
    return np.asarray(truth + spread[:, None] * y, dtype=np.float64)


def power_at(x: np.ndarray, truth: float, n: int, decides: Decides, *, seed: int = 0, quantised: bool = False,
             scale: float | None = None, reps: int = PLAN_REPS) -> float:
    """Share of ``reps`` simulated studies at ``n`` prompts that ``decides`` decides."""
    spread = scale_draws(x, reps, seed, scale)
    return float(np.mean(decides(draws(x, truth, n, spread, seed, quantised))))


def smallest_prompts(x: np.ndarray, truth: float, decides: Decides, power: float, *, start: int,
                     guess: int | None = None, now: int | None = None, seed: int = 0, quantised: bool = False,
                     scale: float | None = None, reps: int = PLAN_REPS, cap: int = PLAN_CAP) -> Plan:
    """Smallest prompt count from ``start`` up to ``cap`` whose simulated power (studies
    whose true mean is ``truth``, shaped and spread as the pilot ``x``, analysed by
    ``decides``) reaches ``power``; the search starts near ``guess``. With ``now``, the
    power at that count is reported too."""
    spread = scale_draws(np.asarray(x, dtype=np.float64), reps, seed, scale)
    memo: dict[int, float] = {}

    def pw(n: int) -> float:
        if n not in memo:
            memo[n] = float(np.mean(decides(draws(x, truth, n, spread, seed, quantised))))
        return memo[n]

    power_now = pw(now) if now is not None and now >= 2 else None
    if start > cap:
        return Plan(None, 0.0, cap, power_now)
    hi = max(start, min(cap, guess or start))
    if pw(hi) >= power:  # gallop down from the guess to a count short of the power (or to start)
        lo = hi
        while lo > start and pw(lo) >= power:
            hi, lo = lo, max(start, lo - max(1, lo // 3))
        if pw(lo) >= power:
            return Plan(lo, pw(lo), cap, power_now)
    else:  # gallop up by half
        lo = hi
        while pw(hi) < power:
            if hi >= cap:
                return Plan(None, pw(hi), cap, power_now)
            lo, hi = hi, min(cap, hi + max(1, hi // 2))
    while hi - lo > 1:  # lo short of the power, hi reaching it
        mid = (lo + hi) // 2
        if pw(mid) >= power:
            hi = mid
        else:
            lo = mid
    return Plan(hi, pw(hi), cap, power_now)

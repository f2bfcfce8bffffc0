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
- **Stressed: a loss tail as heavy as the test is validated for** (``model="stressed"``,
  the default for a continuous pilot). A pilot of 8-15 prompts rarely holds the few
  prompts that lose a lot, so no resampling of it sees the prompts a skewed population
  needs (under skewness -2 the union test needs about 70 prompts at a 0.5 sd margin,
  normal data 36; the pilot's shape alone delivered 0.56-0.73 there). So N is also
  planned under a stated model: a shifted lognormal (``skewed``) of skewness
  ``MAX_SKEW`` (the edge of the validated range, |skewness| <= 2) with its long tail on
  the boundary's side (``loss_side``), at the pilot's SD drawn as below but with the
  stressed shape's uncertainty (``stress_df``: the lognormal's kurtosis 7.9 in the
  formula below, at least ``STRESS_MIN_DF``), and N is the larger of the two. It costs
  normal data 1.9-2.5x the prompts (median N, BENCHMARKS.md) and delivered 0.81-1.00 in
  every validated family. Rejected by the same benchmark: each study's skewness drawn around
  the pilot's (SE ~ sqrt(6/n)) delivered 0.59-0.69 under skewness -2 (a pilot without
  the tail reads near 0); the stressed model with the pilot's own SD uncertainty
  delivered 0.78-0.79 there, at the goal's edge. A quantised pilot keeps its own shape
  (its support is bounded: a lognormal tail does not describe it).
- **Mean: stated, not drawn.** Power is "if the true mean is ``truth``" (the estimate, or
  no difference): drawing the mean too would answer a different question (assurance).

Search (``smallest_prompts``): every candidate N gets ``PLAN_REPS`` studies from a
generator seeded by (``seed``, N), the scale draws shared across N (common random
numbers), so the answer is deterministic; N grows by half from a guess (the t-test's N)
until the power is reached (or, where the guess already reaches it, falls by a third until
it does not), then bisects. Simulated power is not monotone in N to the last prompt, so the
answer is the crossing this path meets (a few prompts apart from another path's). Beyond
``PLAN_CAP`` prompts it says "more than".
Checked by an independent simulation in ``benchmarks/run.py power`` (BENCHMARKS.md).

Imports without torch or scipy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

PLAN_REPS = 2000
"""Simulated studies per candidate prompt count (Monte Carlo SE of a power of 0.8: 0.009)."""
PLAN_CAP = 2000
"""The most prompts the search tries; beyond it the answer is "more than PLAN_CAP"."""
KERNEL = 0.2
"""Smoothed bootstrap's kernel width, in pilot standard deviations (variance kept)."""
MAX_SKEW = 2.0
"""The largest skewness the union test was validated for (BENCHMARKS.md, statistics)."""
MIN_DF = 2.0
"""Fewest degrees of freedom the scale's uncertainty is drawn with. It binds only for a pilot
of 2 prompts (n - 1 = 1): from 3, the sample's excess kurtosis (at most (n^2 - 6n + 6) /
(n - 1)) keeps ``scale_df`` above 2 even for a single outlier."""

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


def scale_draws(x: np.ndarray, reps: int, seed: int, scale: float | None, df: float | None = None) -> np.ndarray:
    """Each simulated study's spread as a multiple of the pilot's (reps,): drawn (see the
    module; ``df`` replaces ``scale_df``) or, with ``scale``, that fixed multiple."""
    if scale is not None:
        return np.full(reps, float(scale))
    nu = scale_df(x) if df is None else df
    return np.sqrt(nu / np.random.default_rng([seed, 0]).chisquare(nu, reps))


def lognormal_sigma(skew: np.ndarray) -> np.ndarray:
    """The log-scale sigma of a lognormal whose skewness is ``|skew|`` (elementwise,
    ``(w + 2) sqrt(w - 1) = |skew|`` with ``w = exp(sigma^2)``, solved by bisection)."""
    k = np.abs(np.asarray(skew, dtype=np.float64))
    lo, hi = np.ones_like(k), np.full_like(k, 1.0 + max(1.0, float(k.max(initial=0.0))))
    for _ in range(60):
        mid = (lo + hi) / 2
        big = (mid + 2) * np.sqrt(mid - 1) > k
        hi, lo = np.where(big, mid, hi), np.where(big, lo, mid)
    return np.sqrt(np.log(np.maximum((lo + hi) / 2, 1 + 1e-8)))


def skewed(rng: np.random.Generator, skew: np.ndarray, n: int) -> np.ndarray:
    """Standardised (mean 0, sd 1) draws (len(skew), n), row i from a shifted lognormal of
    skewness ``skew[i]`` (its sign the side of the long tail; 0: normal)."""
    v = lognormal_sigma(skew)[:, None]
    z = rng.standard_normal((len(skew), n))
    y = (np.expm1(v * z) - np.expm1(v * v / 2)) / np.sqrt(np.expm1(v * v) * np.exp(v * v))
    return np.asarray(np.where(np.asarray(skew)[:, None] < 0, -y, y), dtype=np.float64)


def draws(x: np.ndarray, truth: float, n: int, spread: np.ndarray, seed: int, quantised: bool,
          skew: np.ndarray | None = None) -> np.ndarray:
    """Simulated per-prompt values (len(spread), n) of studies at ``n`` prompts whose true
    mean is ``truth``, shaped as the pilot ``x`` (1-D, at least 2 values) with each
    study's spread ``spread`` times the pilot's (see the module). With ``skew`` (one per
    study), each study is instead a shifted lognormal of that skewness (``skewed``) at the
    pilot's SD times its spread."""
    rng = np.random.default_rng([seed, n])
    r = x - x.mean()
    s = float(x.std(ddof=1))
    if skew is not None:
        return np.asarray(truth + (spread * s)[:, None] * skewed(rng, skew, n), dtype=np.float64)
    pop_sd = math.sqrt(float(np.mean(r * r)))
    picked = r[rng.integers(0, len(x), (len(spread), n))]
    if pop_sd == 0:
        return np.full((len(spread), n), truth)
    if quantised:
        y = picked * (s / pop_sd)
    else:
        y = (picked + KERNEL * pop_sd * rng.standard_normal(picked.shape)) * (s / pop_sd / math.sqrt(1 + KERNEL ** 2))
    return np.asarray(truth + spread[:, None] * y, dtype=np.float64)


def skew_draws(reps: int, skew: float | None) -> np.ndarray | None:
    """Each simulated study's skewness (reps,), or None for the pilot's own shape."""
    return None if skew is None else np.full(reps, float(skew))


def power_at(x: np.ndarray, truth: float, n: int, decides: Decides, *, seed: int = 0, quantised: bool = False,
             scale: float | None = None, reps: int = PLAN_REPS, skew: float | None = None,
             df: float | None = None) -> float:
    """Share of ``reps`` simulated studies at ``n`` prompts that ``decides`` decides."""
    spread = scale_draws(x, reps, seed, scale, df)
    return float(np.mean(decides(draws(x, truth, n, spread, seed, quantised, skew_draws(reps, skew)))))


def smallest_prompts(x: np.ndarray, truth: float, decides: Decides, power: float, *, start: int,
                     guess: int | None = None, now: int | None = None, seed: int = 0, quantised: bool = False,
                     scale: float | None = None, reps: int = PLAN_REPS, cap: int = PLAN_CAP, skew: float | None = None,
                     df: float | None = None) -> Plan:
    """Smallest prompt count from ``start`` up to ``cap`` whose simulated power (studies
    whose true mean is ``truth``, shaped and spread as the pilot ``x``, analysed by
    ``decides``) reaches ``power``; the search starts near ``guess``. With ``now``, the
    power at that count is reported too. With ``skew``, studies are instead a shifted
    lognormal of that skewness at the pilot's SD; ``df`` replaces ``scale_df``."""
    spread = scale_draws(np.asarray(x, dtype=np.float64), reps, seed, scale, df)
    skews = skew_draws(reps, skew)
    memo: dict[int, float] = {}

    def pw(n: int) -> float:
        if n not in memo:
            memo[n] = float(np.mean(decides(draws(x, truth, n, spread, seed, quantised, skews))))
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


Model = Literal["pilot", "stressed"]
"""What a planned study is assumed to look like: "pilot", the pilot's own shape (the
smoothed bootstrap); "stressed", that and also a shifted lognormal of skewness
``MAX_SKEW`` toward the losses at the pilot's SD (the larger N of the two; see the module)."""

def lognormal_kurtosis(skew: float) -> float:
    """Excess kurtosis of a lognormal of skewness ``skew``: ``w^4 + 2 w^3 + 3 w^2 - 6``."""
    w = math.exp(float(lognormal_sigma(np.array([skew]))[0]) ** 2)
    return w ** 4 + 2 * w ** 3 + 3 * w ** 2 - 6


STRESS_MIN_DF = 4.0
"""Fewest degrees of freedom of the stressed model's SD uncertainty (below 4 the drawn
variance itself has no finite variance, and a few huge draws set N)."""


def stress_df(x: np.ndarray) -> float:
    """Degrees of freedom of the stressed model's SD uncertainty: as ``scale_df`` with the
    stressed lognormal's kurtosis (a pilot of that shape has an SD that uncertain: 1.6 at
    8 prompts, 3 at 15, 6 at 30), at least ``STRESS_MIN_DF``, never more than the
    pilot's own ``scale_df``."""
    n = len(x)
    k = lognormal_kurtosis(MAX_SKEW)
    # no min(n - 1, ...) as in scale_df: with k > 0 the formula is below n - 1 at every n
    return min(scale_df(x), max(STRESS_MIN_DF, 2.0 / (2.0 / (n - 1) + k / n)))


def plan(x: np.ndarray, truth: float, decides: Decides, power: float, *, start: int, guess: int | None = None,
         now: int | None = None, seed: int = 0, quantised: bool = False, scale: float | None = None,
         model: Model = "stressed", loss_side: int = -1, reps: int = PLAN_REPS, cap: int = PLAN_CAP) -> Plan:
    """``smallest_prompts`` under ``model``; ``loss_side`` (-1 or +1) is the side of the
    stressed model's long tail. A quantised pilot is always planned on its own shape.
    "stressed": the larger count of the two, with the power simulated there (at equal
    counts, the stressed model's), and the smaller power at ``now``."""
    kw = {"start": start, "guess": guess, "now": now, "seed": seed, "quantised": quantised, "scale": scale,
          "reps": reps, "cap": cap}
    if quantised or model == "pilot":
        return smallest_prompts(x, truth, decides, power, **kw)  # type: ignore[arg-type]
    a = smallest_prompts(x, truth, decides, power, **kw)  # type: ignore[arg-type]
    b = smallest_prompts(x, truth, decides, power, skew=loss_side * MAX_SKEW, df=stress_df(x), **kw)  # type: ignore[arg-type]
    now_ = None if a.power_now is None or b.power_now is None else min(a.power_now, b.power_now)
    if a.prompts is None or b.prompts is None:
        return Plan(None, min(a.power, b.power), cap, now_)
    return Plan(max(a.prompts, b.prompts), a.power if a.prompts > b.prompts else b.power, cap, now_)

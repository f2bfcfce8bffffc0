"""One cell's inference: a test of "mean = mu" for any mu, the interval that inverts it,
multiplicity across a study's family of cells, and the verdict read from both.

A cell is one (arm, metric): its per-prompt values ``x`` (treatment - control, or an FR
metric's value against control), one per prompt.

The test (``Cell.p``) is the max-p union of Student's t and Hall's (1992) skew-corrected t
(``g(T) = T + a T^2 + a^2 T^3 / 3 + a / 2``, ``a = 1.5 G1 / (3 sqrt(n))``, G1 the
bias-adjusted sample skewness; ``g`` is monotone, so it inverts in closed form), joined by
the exact sign-flip permutation test (Monte Carlo beyond ``resamples`` sign vectors, the
observed one counted) when the values are quantised (zero spread, or half the prompts or
more on one value) or there are at most 5 prompts. Its p is the largest of its parts, so
it rejects only when all of them do: its false-positive rate is at most the smallest of
theirs. t holds for roughly normal and heavy-tailed values; Hall's t for skewed ones
(factor 1.5 on G1: from 7-30 values G1 averages 0.8-1.4 for a population skewness of 2, so
the plain estimate under-corrects); the sign-flip test is exact for symmetric values at any
n and never lets p fall below 2 / 2^n, so zero or quantised spread never reads as proof. At
5 prompts or fewer no shape can be checked from the data, so only what the sign-flip test
allows is claimed. The interval (``Cell.interval``) is every mu the test does not reject:
the hull of its parts' intervals (each contains the mean). Measured in ``benchmarks/run.py
stats`` (BENCHMARKS.md); the choice is argued in docs/metrics-and-verdicts.md.

Zero spread gives no interval and no test of the mean (an interval needs spread; the exact
sign-flip p says only that the sign is consistent; a 0/1 metric is tested exactly instead,
``analysis.exact``), and where the sign-flip test is part of the union but cannot
reach the level at this n the interval is unbounded (``None`` bounds, with the reason).

Imports without torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..errors import StatsError
from ..metrics import metric_spec
from ..records.types import VerdictCode
from . import planning

if TYPE_CHECKING:
    from ..plan.config import StudySpec

PROCEDURE = ("max-p union of Student t and Hall's skew-corrected t, joined by the exact sign-flip permutation test "
             "for quantised values or at most 5 prompts (p = the largest; interval = every mean none rejects)")
SKEW_FACTOR = 1.5
"""Hall's correction uses SKEW_FACTOR * G1: G1 from few values underestimates a skewed
population's skewness (benchmarks; docs/metrics-and-verdicts.md)."""
SIGNFLIP_ALWAYS_UP_TO = 5
"""At this many prompts or fewer the sign-flip test is always part of the union."""
SKEW_CHECKED = 2.0
"""|skewness| up to which the procedure's coverage and false-positive rate were measured
to hold at 7-30 prompts (BENCHMARKS.md); a cell beyond it is flagged."""
SD_UPPER_CONFIDENCE = 0.8
"""One-sided confidence of the pilot SD's upper bound used for planning (Browne 1995)."""
Multiplicity = Literal["holm", "bh"]
MULTIPLICITY_NAMES = {"holm": "Holm", "bh": "Benjamini-Hochberg"}


def signflip_signs(n: int, resamples: int, seed: int) -> np.ndarray:
    """Sign vectors (k, n) of the sign-flip test: all 2^n while 2^n <= ``resamples``
    (exact), else the observed all-plus vector and ``resamples`` seeded random ones."""
    if n <= 30 and 2 ** n <= resamples:
        return (1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)).astype(np.float64)
    rng = np.random.default_rng(seed)
    return np.vstack([np.ones((1, n)), rng.choice([-1.0, 1.0], (resamples, n))])


def signflip_min_p(n: int) -> float:
    """Smallest two-sided p an exact sign-flip test can reach with ``n`` prompts: 2 / 2^n."""
    return min(1.0, math.ldexp(1.0, 1 - n))  # 2 * 2^-n, exact


def skewness(x: np.ndarray) -> float | None:
    """Bias-adjusted sample skewness G1 (None below 3 values or at zero spread)."""
    n = len(x)
    if n < 3:
        return None
    m2 = float(np.mean((x - x.mean()) ** 2))
    if m2 <= 0:
        return None
    g1 = float(np.mean((x - x.mean()) ** 3)) / m2 ** 1.5
    return float(g1 * math.sqrt(n * (n - 1)) / (n - 2))


@dataclass
class Cell:
    """The test and interval of one cell's per-prompt values ``x`` (1-D)."""

    x: np.ndarray
    signs: np.ndarray
    n: int = field(init=False)
    mean: float = field(init=False)
    sd: float = field(init=False)
    skew: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=np.float64)
        self.n = len(self.x)
        self.mean = float(self.x.mean()) if self.n else math.nan
        self.sd = float(self.x.std(ddof=1)) if self.n > 1 else math.nan
        self.skew = skewness(self.x)

    @property
    def flat(self) -> bool:
        """Zero spread: every value equal (to rounding)."""
        return self.n > 1 and self.sd <= 1e-12 * max(1.0, abs(self.mean))

    @property
    def quantised(self) -> bool:
        """Half the prompts or more share one value (a 0/1 metric, identical videos)."""
        return self.n >= 2 and bool(quantised(self.x[None, :])[0])

    @property
    def uses_signflip(self) -> bool:
        """Whether the sign-flip test is part of this cell's union."""
        return self.n <= SIGNFLIP_ALWAYS_UP_TO or self.flat or self.quantised

    def _a(self) -> float:
        return SKEW_FACTOR * (self.skew or 0.0) / (3 * math.sqrt(self.n))

    def p_signflip(self, mu: float) -> float:
        """Two-sided sign-flip p of "symmetric about mu" (exact or Monte Carlo)."""
        y = self.x - mu
        null = np.abs(self.signs @ y)
        obs = abs(float(y.sum()))
        return float(np.mean(null >= obs - 1e-9 * float(np.abs(y).sum())))

    def p(self, mu: float) -> float | None:
        """Two-sided p of "mean = mu" (None below 2 values, and at zero spread: the
        sign-flip p then says only that the sign is consistent, which bounds no mean)."""
        if self.n < 2 or self.flat:
            return None
        return float(union_p(self.x[None, :], mu, self.signs)[0])

    def bounded(self, level: float) -> bool:
        """Whether the sign-flip test can reject far from the data at ``level``."""
        far = float(self.x.min() - (np.ptp(self.x) + 1.0))
        return self.p_signflip(far) < 1 - level

    def interval(self, level: float) -> tuple[float | None, float | None, str | None]:
        """(low, high, why) at confidence ``level``: every mu the test does not reject.
        Bounds are None, and ``why`` says so, below 2 values, at zero spread, or where the
        sign-flip test cannot reject at this n (the interval is then unbounded)."""
        # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
        from scipy.stats import t as student

        if self.n < 2:
            return None, None, "no interval: fewer than 2 prompts"
        if self.flat:
            return None, None, (f"no interval: every prompt's value is {self.mean:.6g} (zero spread); the exact "
                                "sign-flip p says only that the sign is consistent")
        if self.uses_signflip and not self.bounded(level):
            why = "quantised values" if self.quantised else f"at most {SIGNFLIP_ALWAYS_UP_TO} prompts"
            return None, None, (f"no bounded interval: with n={self.n} prompts ({why}: the exact sign-flip test "
                                f"decides) no test can reach p < {1 - level:.3g} (smallest p "
                                f"{signflip_min_p(self.n):.3g}); add prompts")
        half = float(student.ppf(1 - (1 - level) / 2, self.n - 1))
        se = self.sd / math.sqrt(self.n)
        a = self._a()
        if abs(a) < 1e-12:
            hall = (self.mean - half * se, self.mean + half * se)
        else:
            def ginv(y: float) -> float:
                return float((np.cbrt(1 + 3 * a * (y - a / 2)) - 1) / a)
            hall = (self.mean - ginv(half) * se, self.mean - ginv(-half) * se)
        lo, hi = min(self.mean - half * se, hall[0]), max(self.mean + half * se, hall[1])
        if self.uses_signflip:  # bounded: one range beyond the data every y has one sign, none near 0: rejected
            lo = min(lo, self._signflip_edge(float(self.x.min() - np.ptp(self.x)), level))
            hi = max(hi, self._signflip_edge(float(self.x.max() + np.ptp(self.x)), level))
        return lo, hi, None

    def _signflip_edge(self, out: float, level: float) -> float:
        """Bisection between a rejected ``out`` (one range beyond the data) and the mean
        (p = 1) for the outermost mu the sign-flip test still accepts, to 2^-60 of their
        distance: the same edge in any units (where the p's tolerance counts a nearly-zero
        y as a tie just beyond the data, the outer end of that band)."""
        inside = self.mean
        for _ in range(60):
            mid = (inside + out) / 2
            if self.p_signflip(mid) >= 1 - level:
                inside = mid
            else:
                out = mid
        return inside


def quantised(x: np.ndarray) -> np.ndarray:
    """Per row of ``x`` (studies, n): whether half the values or more share one value."""
    n = x.shape[1]
    tol = 1e-12 * np.maximum(1.0, np.abs(x).max(axis=1, keepdims=True))
    most = np.max(np.stack([np.sum(np.abs(x - x[:, [j]]) <= tol, axis=1) for j in range(n)]), axis=0)
    return np.asarray(2 * most >= n)


def union_p(x: np.ndarray, mu: float | np.ndarray, signs: np.ndarray) -> np.ndarray:
    """The union test's two-sided p of "mean = mu" for each row of ``x`` (studies, n >= 2
    prompts), vectorised (the benchmark runs thousands of studies through it): max(t p,
    Hall p), and the sign-flip p too for quantised rows or n <= 5; the sign-flip p alone
    for a row with zero spread."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.stats import t as student

    x = np.asarray(x, dtype=np.float64)
    n = x.shape[1]
    y = x - np.asarray(mu, dtype=np.float64).reshape(-1, 1)
    obs = np.abs(y.sum(axis=1))
    p_sf = np.mean(np.abs(y @ signs.T) >= (obs - 1e-9 * np.abs(y).sum(axis=1))[:, None], axis=1)
    mean, sd = x.mean(axis=1), x.std(axis=1, ddof=1)
    flat = sd <= 1e-12 * np.maximum(1.0, np.abs(mean))
    r = x - mean[:, None]
    m2 = np.mean(r * r, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        # r * r * r, not r ** 3: numpy's power has no fast path for 3 (about 90x slower on planning's arrays)
        g1 = np.where(m2 > 0, np.mean(r * r * r, axis=1) / m2 ** 1.5, 0.0)
        skew = g1 * math.sqrt(n * (n - 1)) / (n - 2) if n >= 3 else np.zeros_like(g1)
        t = np.where(flat, 0.0, math.sqrt(n) * y.mean(axis=1) / sd)  # y's mean is mean - mu
    a = SKEW_FACTOR * skew / (3 * math.sqrt(n))
    g = t + a * t * t + a * a * t ** 3 / 3 + a / 2
    p = np.maximum(2 * student.sf(np.abs(t), n - 1), 2 * student.sf(np.abs(g), n - 1))
    with_sf = np.maximum(p, p_sf)
    if n > SIGNFLIP_ALWAYS_UP_TO:
        with_sf = np.where(quantised(x), with_sf, p)
    return np.asarray(np.where(flat, p_sf, with_sf), dtype=np.float64)


def parametric_p(x: np.ndarray, mu: float) -> np.ndarray:
    """``union_p`` for rows (studies, n > ``SIGNFLIP_ALWAYS_UP_TO`` prompts) that are
    neither flat nor quantised, where it is max(t p, Hall p): the same arithmetic without
    the sign-flip test's (studies x 2^n) product, for planning's thousands of simulated
    studies (a test keeps it equal to ``union_p``)."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.stats import t as student

    n = x.shape[1]
    mean, sd = x.mean(axis=1), x.std(axis=1, ddof=1)
    r = x - mean[:, None]
    m2 = np.mean(r * r, axis=1)
    g1 = np.mean(r * r * r, axis=1) / m2 ** 1.5  # r * r * r: see union_p
    a = SKEW_FACTOR * g1 * math.sqrt(n * (n - 1)) / (n - 2) / (3 * math.sqrt(n))
    t = math.sqrt(n) * (mean - mu) / sd
    g = t + a * t * t + a * a * t ** 3 / 3 + a / 2
    return np.asarray(np.maximum(2 * student.sf(np.abs(t), n - 1), 2 * student.sf(np.abs(g), n - 1)))


def decides(boundary: float, side: int, alpha: float, signs_for: Callable[[int], np.ndarray],
            continuous: bool) -> planning.Decides:
    """The verdict's decision on ``boundary`` as planning simulates it: per row of
    per-prompt values (studies, n), whether the union test rejects "mean = boundary" at
    ``alpha`` with the mean on the ``side`` (+1 above, -1 below) the truth is on.
    ``continuous`` rows (a smoothed bootstrap or a lognormal: never flat or quantised) past
    ``SIGNFLIP_ALWAYS_UP_TO`` prompts take ``parametric_p``; the rest ``union_p`` with
    ``signs_for(n)``."""
    def decide(x: np.ndarray) -> np.ndarray:
        n = x.shape[1]
        p = parametric_p(x, boundary) if continuous and n > SIGNFLIP_ALWAYS_UP_TO else union_p(x, boundary,
                                                                                                  signs_for(n))
        return np.asarray((p < alpha) & (side * (x.mean(axis=1) - boundary) > 0))
    return decide


def plan_prompts(cell: Cell, truth: float, boundary: float, alpha: float, power: float, *, start: int,
                 now: int | None = None, scale: float | None = None, seed: int = 0,
                 model: planning.Model = "stressed") -> planning.Plan:
    """Prompts at which the verdict on ``boundary`` is reached with probability ``power``
    if the true mean is ``truth`` and prompts vary as ``cell``'s do (``planning``: a
    smoothed bootstrap of its values with its SD's uncertainty, analysed by this module's
    test at ``alpha``), and, with ``model`` "stressed" (the default; a continuous cell),
    also if they vary with the pilot's SD but a loss tail of skewness ``planning.MAX_SKEW``
    toward the boundary (the larger count of the two; see ``planning``). The sign-flip
    test inside uses at most ``PLAN_SIGNFLIPS`` random sign vectors beyond exact
    enumeration. Cached per question (a study asks some twice)."""
    return _plan_cached(cell.x.tobytes(), truth, boundary, alpha, power, start, now, scale, seed, cell.quantised,
                        model)


PLAN_SIGNFLIPS = 1000
"""Random sign vectors of the sign-flip test inside planning's simulated studies."""


@functools.lru_cache(maxsize=256)
def _plan_cached(xb: bytes, truth: float, boundary: float, alpha: float, power: float, start: int, now: int | None,
                 scale: float | None, seed: int, quant: bool, model: planning.Model) -> planning.Plan:
    x = np.frombuffer(xb, dtype=np.float64)
    side = 1 if truth > boundary else -1
    sd = float(x.std(ddof=1)) * (scale or 1.0)
    guess = required_prompts(sd, truth - boundary, 1 - alpha, power, limit=planning.PLAN_CAP) if sd > 0 else None
    return planning.plan(x, truth, decides(boundary, side, alpha, functools.partial(_signs, seed=seed), not quant),
                         power, start=start, guess=guess, now=now, seed=seed, quantised=quant, scale=scale,
                         model=model, loss_side=-side)


@functools.lru_cache(maxsize=64)
def _signs(n: int, seed: int) -> np.ndarray:
    return signflip_signs(n, PLAN_SIGNFLIPS, seed)


def family_levels(pvalues: list[float], alpha: float, method: Multiplicity) -> tuple[list[float], list[float]]:
    """Adjusted p-values and each cell's adjusted significance level, so that a cell's
    adjusted p < ``alpha`` exactly when its raw p < its level, and its interval at
    confidence 1 - level excludes the null value exactly then.

    Holm (step-down, family-wise error): a rejected cell of rank r gets alpha / (m - r + 1);
    the others get the level at which the procedure stopped. Benjamini-Hochberg (false
    discovery rate): every cell gets R alpha / m, R the number rejected (at least 1), the
    false-coverage-rate intervals of Benjamini and Yekutieli (2005)."""
    m = len(pvalues)
    if m == 0:
        return [], []
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * pvalues[i]))
            adjusted[i] = running
        rank_of = {i: rank for rank, i in enumerate(order)}
        stop = next((rank for rank, i in enumerate(order) if adjusted[i] >= alpha), m)  # first not rejected
        return adjusted, [alpha / (m - min(rank_of[i], stop)) for i in range(m)]
    if method == "bh":
        running = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            running = min(running, pvalues[i] * m / (rank + 1))
            adjusted[i] = min(1.0, running)
        rejected = sum(p < alpha for p in adjusted)
        return adjusted, [max(rejected, 1) * alpha / m] * m
    raise StatsError(f"unknown multiplicity procedure {method!r}; stats/multiplicity is holm or bh")


def sd_upper(sd: float, n: int, confidence: float = SD_UPPER_CONFIDENCE) -> float:
    """One-sided upper confidence bound of a standard deviation estimated from ``n`` values
    (chi-square with n - 1 df): the true SD is below it with probability ``confidence``."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.stats import chi2

    return sd * math.sqrt((n - 1) / float(chi2.ppf(1 - confidence, n - 1)))


def variance_split(values: dict[tuple[str, int], float]) -> tuple[float | None, float | None, float]:
    """Split the variance of a per-prompt mean into prompts and seeds (one-way random
    effects, method of moments): (prompt variance, seed variance of a per-prompt mean over
    its seeds, mean seeds per prompt). None where it cannot be split (one seed per prompt,
    or fewer than 2 prompts)."""
    by: dict[str, list[float]] = {}
    for (prompt, _seed), v in sorted(values.items()):
        by.setdefault(prompt, []).append(v)
    k = float(np.mean([len(v) for v in by.values()]))
    within = [np.var(v, ddof=1) for v in by.values() if len(v) > 1]
    if len(by) < 2 or not within:
        return None, None, k
    seed_var = float(np.mean(within)) / k
    between = float(np.var([np.mean(v) for v in by.values()], ddof=1))
    return max(0.0, between - seed_var), seed_var, k


def _power(crit: Any, df: Any, nc: Any) -> Any:
    """Two-sided t-test power, P(|T| > crit) for T noncentral t(df, nc >= 0). The lower
    tail is below 1e-9 wherever scipy's nct.cdf returns NaN (far into it), so NaN reads 0."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.stats import nct

    return nct.sf(crit, df, nc) + np.nan_to_num(nct.cdf(-crit, df, nc), nan=0.0)


def required_prompts(sd: float, effect: float, level: float, power: float, limit: int = 100_000) -> int | None:
    """Prompts a two-sided paired t-test at ``1 - level`` needs to detect a true mean
    difference ``effect`` with probability ``power``, given a per-prompt standard
    deviation ``sd`` (exact, from the noncentral t distribution). None beyond ``limit``.
    The union test (``Cell``) rejects only when its t test does, so it needs at least this."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.stats import t as student

    if effect == 0:
        raise StatsError("an effect of 0 cannot be detected; give the smallest difference that matters "
                         "(stats/margins in the config)")
    if sd == 0:
        return 2
    start = 2
    while start <= limit:  # power rises with n: search in growing blocks, not all of 2..limit at once
        n = np.arange(start, min(limit, 4 * start + 256) + 1)
        crit = student.ppf(1 - (1 - level) / 2, n - 1)
        hit = np.nonzero(_power(crit, n - 1, abs(effect) / sd * np.sqrt(n)) >= power)[0]
        if hit.size:
            return int(n[hit[0]])
        start = int(n[-1]) + 1
    return None


def detectable_effect(sd: float, n: int, level: float, power: float) -> float | None:
    """Smallest true |mean difference| the paired t-test detects with probability
    ``power`` at ``n`` prompts and per-prompt standard deviation ``sd``."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.optimize import brentq
    from scipy.stats import t as student

    if n < 2:
        return None
    if sd == 0:
        return 0.0
    crit = student.ppf(1 - (1 - level) / 2, n - 1)

    def gap(d: float) -> float:
        nc = d / sd * math.sqrt(n)
        return float(_power(crit, n - 1, nc)) - power

    hi = sd * (crit + 1.0) / math.sqrt(n)
    while gap(hi) < 0:  # power rises with the effect; widen until the bracket holds it
        hi *= 2
    # xtol relative to the bracket: brentq's default (2e-12 absolute) is the answer itself at an sd of 1e-12
    return float(brentq(gap, 0.0, hi, xtol=1e-14 * hi))


def min_prompts(alpha: float, quantised: bool) -> int:
    """Fewest prompts at which the union test can reject at ``alpha`` at all: where the
    sign-flip test is part of it (quantised values, or up to 5 prompts), 2 / 2^n < alpha."""
    n = 2
    while signflip_min_p(n) >= alpha and (quantised or n <= SIGNFLIP_ALWAYS_UP_TO):
        n += 1
    return n


def too_few_prompts(study: StudySpec) -> list[str]:
    """One warning per panel with too few prompts for any verdict at the configured level:
    at ``SIGNFLIP_ALWAYS_UP_TO`` prompts or fewer the exact sign-flip test decides, and its
    smallest p (2 / 2^n) must be below the level of the family's first test (Holm: alpha / m,
    m the (treatment, metric) tests; Benjamini-Hochberg: alpha). Each names the panel, its
    prompt count and the count that allows a verdict; a second clause gives the count a
    quantised metric (a 0/1 score: the sign-flip test always decides) needs, where larger."""
    alpha = 1 - study.stats.level
    tested = sum(1 for name in study.scorers if metric_spec(name).kind == "NR" or name in study.stats.floors)
    m = max(1, len(study.treatments) * tested)
    first = alpha / m if study.stats.multiplicity == "holm" else alpha
    need, need_q = min_prompts(first, quantised=False), min_prompts(first, quantised=True)
    out = []
    for p in study.panels:
        n = len(p.planned)
        if n < need_q:
            why = (f"the exact sign-flip test decides at {SIGNFLIP_ALWAYS_UP_TO} prompts or fewer and its smallest p, "
                   f"{signflip_min_p(n):.3g}, is not below {first:.3g} (alpha {alpha:g}"
                   + (f" / {m} tests, Holm)" if first < alpha else ")"))
            out.append(f"panel {p.name!r} has {n} prompts: no verdict is possible in its own table ({why}); "
                       f"{need} prompts would allow one" if n < need else
                       f"panel {p.name!r} has {n} prompts: a quantised metric (a 0/1 score, half the prompts on one "
                       f"value) can get no verdict in its own table below {need_q} prompts (smallest sign-flip p "
                       f"{signflip_min_p(n):.3g}, level {first:.3g})")
            if n < need and need_q > need:
                out[-1] += f" ({need_q} for a quantised metric such as a 0/1 score)"
    return out


@dataclass(frozen=True)
class Question:
    """What a cell asks, in the metric's direction (``sign`` +1: higher is better).
    ``difference``: is the mean difference 0? ``margin``: is the loss inside ``margin``
    (non-inferior), both bounds inside +-margin (equivalent), or beyond it (inferior)?
    ``floor``: does an FR metric's value clear ``floor`` (a minimum for higher-is-better
    metrics, a maximum otherwise)?"""

    kind: Literal["difference", "margin", "floor"]
    sign: int
    margin: float = 0.0
    floor: float = 0.0

    @property
    def null(self) -> float:
        """The value the cell's primary hypothesis (the one in the family) tests."""
        return {"difference": 0.0, "margin": -self.sign * self.margin, "floor": self.floor}[self.kind]

    @property
    def hypothesis(self) -> str:
        return {"difference": "mean difference = 0",
                "margin": f"loss = margin {self.margin:g} (non-inferiority)",
                "floor": f"mean value = floor {self.floor:g}"}[self.kind]


def _decide_in(cell: Cell, boundary: float, alpha: float, power: float) -> str:
    """How many prompts would likely settle an inconclusive cell, if its estimate is the
    true mean: the smallest count above the cell's own (and at least ``min_prompts``) whose
    simulated studies reach a verdict on ``boundary`` with probability ``power``
    (``plan_prompts``)."""
    if cell.mean == boundary or not cell.sd > 0:
        return "the estimate sits on the boundary; no prompt count is likely to decide it"
    plan = plan_prompts(cell, cell.mean, boundary, alpha, power, now=cell.n,
                        start=max(cell.n + 1, min_prompts(alpha, cell.quantised)))
    how = (f"{power:.0%} power if the true mean is the estimate and prompts vary as these did, or with as "
           "heavy a loss tail as this test is validated for (skewness 2); simulated with this test")
    if cell.quantised:
        how = (f"{power:.0%} power if the true mean is the estimate and prompts vary as these did; simulated with "
               "this test")
    if plan.prompts is None:
        return (f"more than {plan.cap} prompts would be needed ({how}); the estimate sits near the boundary")
    now = ("" if plan.power_now is None or plan.power_now < power else
           f"; this study's {cell.n} prompts had {plan.power_now:.0%} power under the same assumption, so it "
           "fell short by chance: a study of its size on new prompts would likely decide it too")
    return f"about {plan.prompts} prompts would decide it ({how}){now}"


def verdict(cell: Cell, q: Question, alpha: float, power: float) -> tuple[VerdictCode, str, list[float]]:
    """(code, detail, rests on) for one cell at its family-adjusted significance
    ``alpha``, read from the cell's test (so from its interval at 1 - alpha, every mu the
    test accepts) in the CONSORT wording of ``verdicts``; "rests on" lists the null values
    whose tests decided the word, the deciding one (its p printed beside the word) last.
    A metric without a margin is read with margin 0, a floor as the loss edge."""
    if cell.n < 2:
        return "inconclusive", "fewer than 2 prompts: no interval and no test; add prompts", [q.null]

    def rejects(mu: float) -> bool:
        p = cell.p(mu)
        return p is not None and p < alpha

    e = q.sign * (cell.mean - (q.floor if q.kind == "floor" else 0.0))  # estimate, better-direction units
    flat = (f"every prompt's value is {cell.mean:.4g} (zero spread): no test of the mean and no interval (an "
            "interval needs spread; the sign-flip p says only that the sign is consistent)")
    if cell.flat:
        return "inconclusive", flat, [q.null]
    if q.kind == "difference":
        if rejects(0.0):
            side = "better" if e > 0 else "worse"
            return ("superior" if e > 0 else "inferior"), (
                f"the whole interval is on the {side} side of 0 (no margin declared, so the margin is 0)"), [0.0]
        d = detectable_effect(cell.sd, cell.n, 1 - alpha, power)
        return "inconclusive", (f"no detectable difference at n={cell.n}; the smallest detectable difference is "
                                f"{d:.3g} ({power:.0%} power); this is not equivalence (declare a margin under "
                                "stats/margins for a non-inferiority or equivalence question)"), [0.0]
    if q.kind == "floor":
        if rejects(q.floor):
            if e > 0:
                return "non_inferior", f"the whole interval clears the floor {q.floor:g}", [q.floor]
            return "inferior", f"the whole interval is beyond the floor {q.floor:g}", [q.floor]
        return "inconclusive", (f"the interval holds the floor {q.floor:g}; "
                                + _decide_in(cell, q.floor, alpha, power)), [q.floor]
    d, loss, gain = q.margin, -q.sign * q.margin, q.sign * q.margin
    if rejects(loss) and e > -d:
        if rejects(gain) and e < d:
            return "equivalent", f"the whole interval is inside +-{d:g}", [loss, gain]
        if rejects(0.0) and e > 0:
            return "superior", f"the whole interval is on the better side of 0 (and inside the margin {d:g})", [
                loss, 0.0]
        return "non_inferior", f"the whole interval is on the better side of the loss edge -{d:g}", [loss]
    if rejects(loss):
        return "inferior", f"the whole interval is beyond the margin: a loss of more than {d:g}", [loss]
    if rejects(0.0) and e < 0:
        return "worse_non_inferiority_not_shown", (f"the whole interval is on the worse side of 0 but holds the loss "
                                                   f"edge -{d:g}: worse than control, by an amount that may be "
                                                   "inside the margin"), [0.0]
    return "inconclusive", (f"the interval holds 0 and the loss edge -{d:g}; "
                            + _decide_in(cell, loss, alpha, power)), [loss]

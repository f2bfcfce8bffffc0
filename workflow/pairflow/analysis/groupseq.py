"""Group-sequential stopping over prompts: alpha-spending boundaries, the decision at each
look, the interval after a stop, and the prompts a stop saves. The statistics core only:
no rule, checkpoint or report reads it yet (docs/metrics-and-verdicts.md says what is wired).

A study that declares looks releases its prompts in stages: look k analyses the first
``n_k`` prompts of the release order, at information fraction ``t_k = n_k / N`` of the
planned maximum ``N``. Each pre-registered question (a cell's test of ``mean = null``, the
same null the verdict tests: 0, the loss edge -margin, or a floor) is tested at every look
against a boundary that spends its alpha over the looks, and the study stops once every
question is decided or at ``N``.

Boundaries: the alpha-spending approach of Lan & DeMets (1983, Biometrika 70:659-663),
with the O'Brien-Fleming-type spending ``2 - 2 Phi(z_{1-a/2} / sqrt(t))`` for each side's
``a`` (alpha / 2 per side of a two-sided design, as ldbounds, gsDesign and rpact spend
it), the Pocock-type ``a log(1 + (e - 1) t)`` and Hwang, Shih & DeCani's (1990) family
``a (1 - e^{-g t}) / (1 - e^{-g})``. Each look's boundary solves "probability of first
crossing here = the alpha spent here" under the null, by the recursive numerical
integration of Armitage, McPherson & Rowe (1969, JRSS A 132:235-244): the density of the
score process ``S_k = Z_k sqrt(t_k)`` (independent normal increments) on the continuation
region, carried look to look on a Simpson grid. The looks need not be equally spaced; they
need not be fixed in advance either, since a look's boundary depends only on the fractions
up to it. The classical constant designs (Pocock 1977; O'Brien & Fleming 1979) are here
too, through the same recursion, because the published tables that check it are theirs.

Why not a library: on PyPI (checked 2026-12-05) ``gsdesign`` 0.1.5 is a self-described
experimental port of only gsDesign's grid routines (``gridpts``, ``h1``, ``hupdate``): no
spending functions and no boundary search, which is most of this module; ``gsd`` is an
unrelated simulation-file format; R's gsDesign, ldbounds and rpact are not Python. So the
published method is implemented here and tested against published boundary tables
(tests/test_groupseq.py names each table).

Unknown variance: the boundaries are for a z statistic with known variance, and a study
has 10-60 prompts. Each look's z boundary ``b_k`` is turned into its nominal two-sided
level ``p_k = 2 (1 - Phi(b_k))`` and the look rejects when the verdicts' own test
(``inference.union_p``: the max-p union of Student's t, Hall's skew-corrected t and, for
quantised values or few prompts, the exact sign-flip test) gives p < p_k at that look's
own n. That is the practical "same nominal level, t quantile at the look's df" rule
(Jennison & Turnbull 2000 discuss it for normal data of unknown variance), with the
verdicts' test in place of the t test so that a sequential verdict is read with the same
test as a fixed one. Its error rate is not exact at small n; the tests simulate it
(false-positive rate at most alpha + 0.01) under the shapes the verdicts are tested on.

The interval after a stop: the repeated confidence interval of Jennison & Turnbull (1989,
JRSS B 51:305-361) at the look where the question was decided: every mean the same test
does not reject at that look's nominal level ``p_k``, i.e. ``Cell.interval(1 - p_k)``.
The sequence of these intervals covers the true mean at every look at once with
probability at least 1 - alpha (exactly so for a z statistic; simulated in the tests for
this test), so the one read at any stopping look, however the stop was chosen, covers at
least as often: valid under optional stopping and with looks that were not planned, at
the price of being wider than a fixed-sample interval on the same prompts (about
``b_k / 1.96`` times: 1.03 at the last of four O'Brien-Fleming-type looks, over 2 at the
first). The stage-wise-ordering exact interval (Tsiatis, Rosner & Mehta 1984) is shorter
but needs the looks to follow the plan and the variance known, neither of which a small
study of prompts guarantees. Under several questions a question's interval is read at
the share of alpha it was decided with.

Several questions: each is tested with its own spending boundary at a share of the
table's alpha. ``bonferroni`` (the default) gives each ``alpha / m`` over the ``m``
questions; ``holm`` is the group-sequential Holm procedure of Maurer & Bretz (2013): the
undecided share ``alpha / r`` (r of them left), and when a question is decided its alpha
passes to the rest, whose looks so far are re-read at the larger share. A question once
decided stays decided. Both keep the family-wise error rate (simulated in the tests,
three questions). Pure functions; numpy and scipy only; no torch, no I/O.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import ConfigError, StatsError
from . import inference

Spending = Literal["obf", "pocock", "hsd"]
SPENDING_NAMES: dict[Spending, str] = {
    "obf": "Lan-DeMets O'Brien-Fleming-type",
    "pocock": "Lan-DeMets Pocock-type",
    "hsd": "Hwang-Shih-DeCani",
}
Z_CAP = 8.5
"""Largest z boundary searched: beyond it a look spends under 2e-17, below double
precision's reach; a look asked to spend less gets this boundary (it spends 2e-17)."""
GRID_PER_SD = 24
"""Simpson grid points per standard deviation of the next increment (AMR recursion)."""
GRID_STEP = 0.02
"""Largest grid step on the score scale, so that a later look's short increment (SD
down to about 0.2) still has ten points per SD."""
MAX_GRID = 6000
"""Most grid points at a look (the kernel is points x previous points, so this bounds
memory at about 300 MB): reached only by looks under about 1/140 of the plan apart, which
looks over at most a hundred-odd prompts cannot be; beyond it the grid coarsens."""
TAIL_SD = 10.0
"""A one-sided design's continuation region is cut this many SDs below the drift: the mass
beyond it is below 1e-23."""
SIGNFLIPS = 2000
"""Random sign vectors of the sign-flip test at a look (as the verdicts use)."""
Decision = Literal["reject", "continue", "final"]
Family = Literal["bonferroni", "holm"]
FAMILIES: tuple[Family, ...] = ("bonferroni", "holm")


@dataclass(frozen=True)
class Design:
    """A group-sequential plan for one question: ``fractions`` of the planned maximum
    ``max_prompts`` at which the looks fall (increasing, in (0, 1], the last 1), the
    question's ``alpha``, ``sides`` (2: reject ``mean = null`` on either side, as the
    verdicts do; 1: only on the better side), and the spending function (``gamma`` is the
    Hwang-Shih-DeCani parameter: -4 is close to O'Brien-Fleming, 1 to Pocock)."""

    fractions: tuple[float, ...]
    max_prompts: int
    alpha: float = 0.05
    spending: Spending = "obf"
    sides: Literal[1, 2] = 2
    gamma: float = -4.0

    def __post_init__(self) -> None:
        f = self.fractions
        if not f or any(not a < b for a, b in zip((0.0, *f), f, strict=False)) or f[-1] != 1.0:
            raise ConfigError(f"group-sequential looks {list(f)} must be increasing fractions of the planned "
                              "prompts in (0, 1] ending at 1 (e.g. [0.25, 0.5, 0.75, 1])")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"group-sequential alpha {self.alpha} must lie in (0, 1); give e.g. 0.05")
        if self.spending not in SPENDING_NAMES:
            raise ConfigError(f"spending function {self.spending!r} is unknown; use one of {sorted(SPENDING_NAMES)}")
        if self.sides not in (1, 2):
            raise ConfigError(f"sides {self.sides!r} must be 2 (either side, as the verdicts test) or 1 "
                              "(the better side only)")
        if self.max_prompts < 2 or self.max_prompts * f[0] < 2:
            raise ConfigError(f"the first look at fraction {f[0]} of {self.max_prompts} planned prompts has fewer "
                              "than 2 prompts; plan more prompts or a later first look")
        looks = self.looks
        if any(a >= b for a, b in zip(looks, looks[1:], strict=False)):
            raise ConfigError(f"looks at fractions {list(f)} of {self.max_prompts} prompts fall on prompt counts "
                              f"{list(looks)}, two of them the same; space the looks further apart or plan more "
                              "prompts")
        if self.spending == "hsd" and self.gamma == 0:
            raise ConfigError("Hwang-Shih-DeCani gamma 0 is the linear limit, not a member; give e.g. -4 or 1")

    @property
    def looks(self) -> tuple[int, ...]:
        """Cumulative prompts at each planned look (``ceil(fraction * max_prompts)``)."""
        return tuple(math.ceil(f * self.max_prompts - 1e-9) for f in self.fractions)

    def spent(self, t: np.ndarray | float) -> np.ndarray:
        """Cumulative alpha spent by information fraction ``t`` (array or scalar)."""
        return spend(self.spending, self.alpha, np.asarray(t, dtype=np.float64), self.sides, self.gamma)

    def boundaries(self, fractions: Sequence[float] | None = None) -> tuple[float, ...]:
        """The z boundaries at ``fractions`` (default: the planned ones)."""
        f = tuple(self.fractions if fractions is None else fractions)
        return spending_boundaries(f, self.spent(np.asarray(f)).tolist(), self.sides)

    def nominal(self, boundary: float) -> float:
        """The two-sided nominal p a look with z ``boundary`` rejects below (one-sided
        designs: twice the one-sided level, read with a direction check)."""
        return nominal_p(boundary)


def spend(kind: Spending, alpha: float, t: np.ndarray, sides: int = 2, gamma: float = -4.0) -> np.ndarray:
    """Cumulative alpha spent at information fractions ``t`` in [0, 1] (Lan & DeMets 1983;
    Hwang, Shih & DeCani 1990). ``alpha`` is the design's total (two-sided total for
    ``sides`` 2); every function spends 0 at t = 0 and ``alpha`` at t = 1."""
    from scipy.stats import norm  # lazy: scipy.stats takes seconds to import

    t = np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)
    if kind == "obf":
        # Each side spends its own a = alpha / sides as 2 - 2 Phi(z_{1-a/2} / sqrt(t)): the
        # convention of ldbounds (Reboussin et al. 2000), gsDesign's sfLDOF and rpact's asOF,
        # whose tables the tests check. (Lan & DeMets's 1983 paper wrote the same formula
        # with the two-sided total in place of a; it spends more early.)
        z = float(norm.isf(alpha / sides / 2))
        with np.errstate(divide="ignore"):
            return np.asarray(np.where(t > 0, sides * 2 * norm.sf(z / np.sqrt(np.maximum(t, 1e-300))), 0.0))
    if kind == "pocock":
        return np.asarray(alpha * np.log1p((math.e - 1) * t))
    if kind == "hsd":
        return np.asarray(alpha * -np.expm1(-gamma * t) / -math.expm1(-gamma))
    raise ConfigError(f"spending function {kind!r} is unknown; use one of {sorted(SPENDING_NAMES)}")


def nominal_p(boundary: float) -> float:
    """Two-sided p below which a look with z ``boundary`` rejects: 2 (1 - Phi(b)). A
    one-sided design reads it with a direction check, so its one-sided level is 1 - Phi(b)."""
    from scipy.stats import norm

    return float(2 * norm.sf(boundary))


def _simpson(lo: float, hi: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid on [lo, hi] with an odd number of points about ``step`` apart, and its
    composite Simpson weights."""
    m = max(3, 2 * math.ceil((hi - lo) / step / 2) + 1)
    x = np.linspace(lo, hi, m)
    h = (hi - lo) / (m - 1)
    w = np.full(m, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return x, w * h / 3


class _Recursion:
    """Armitage-McPherson-Rowe: the sub-density of ``S_k = Z_k sqrt(t_k)`` on the
    continuation region (paths that have not crossed yet), look by look, under drift
    ``theta`` (E S_k = theta t_k: theta is the z statistic's mean at t = 1)."""

    def __init__(self, theta: float = 0.0) -> None:
        self.theta = theta
        self.t = 0.0
        self.grid: np.ndarray | None = None  # points; None before the first look
        self.dens: np.ndarray | None = None  # density times Simpson weight at each point

    def exit(self, t: float, upper: float, lower: float) -> tuple[float, float]:
        """Probability of crossing, first at fraction ``t``, above z ``upper`` and below z
        ``lower`` (-inf: no lower boundary)."""
        from scipy.stats import norm

        d = t - self.t
        mean = (self.grid if self.grid is not None else np.zeros(1)) + self.theta * d
        w = self.dens if self.dens is not None else np.ones(1)
        sd = math.sqrt(d)
        up = float(w @ norm.sf((upper * math.sqrt(t) - mean) / sd))
        down = 0.0 if lower == -math.inf else float(w @ norm.cdf((lower * math.sqrt(t) - mean) / sd))
        return up, down

    def advance(self, t: float, upper: float, lower: float) -> None:
        """Move to fraction ``t``, keeping only paths inside (lower, upper) there."""
        from scipy.stats import norm

        d = t - self.t
        if d <= 0:
            raise StatsError(f"look fractions must increase; got {t} after {self.t}")
        sd, st = math.sqrt(d), math.sqrt(t)
        hi = min(upper, Z_CAP + 2) * st
        lo = max(lower, -Z_CAP - 2) * st if lower != -math.inf else self.theta * t - TAIL_SD * st
        lo = min(lo, hi - 1e-9)
        x, wx = _simpson(lo, hi, max(min(sd / GRID_PER_SD, GRID_STEP), (hi - lo) / MAX_GRID))
        prev = self.grid if self.grid is not None else np.zeros(1)
        pw = self.dens if self.dens is not None else np.ones(1)
        kern = norm.pdf((x[:, None] - prev[None, :] - self.theta * d) / sd) / sd
        self.grid, self.dens, self.t = x, (kern @ pw) * wx, t


def _solve(f: Callable[[float], float]) -> float:
    """The z in [0, Z_CAP] where the decreasing ``f`` crosses 0 (Z_CAP if it never does)."""
    from scipy.optimize import brentq

    if f(Z_CAP) >= 0:
        return Z_CAP
    if f(0.0) <= 0:
        return 0.0
    return float(brentq(f, 0.0, Z_CAP, xtol=1e-10))


def spending_boundaries(fractions: Sequence[float], spent: Sequence[float], sides: int) -> tuple[float, ...]:
    """z boundaries at increasing ``fractions`` such that under the null the probability
    of first crossing at look k is ``spent[k] - spent[k-1]`` (two-sided: symmetric, half
    each side; one-sided: upper only). Cached by its arguments."""
    return _boundaries_cached(tuple(float(f) for f in fractions), tuple(float(s) for s in spent), sides)


@functools.lru_cache(maxsize=256)
def _boundaries_cached(fractions: tuple[float, ...], spent: tuple[float, ...], sides: int) -> tuple[float, ...]:
    rec, out, before = _Recursion(), [], 0.0
    for t, cum in zip(fractions, spent, strict=True):
        target = cum - before
        before = cum

        def gap(b: float, t: float = t, target: float = target) -> float:
            up, down = rec.exit(t, b, -b if sides == 2 else -math.inf)
            return up + down - target
        b = _solve(gap)
        out.append(b)
        rec.advance(t, b, -b if sides == 2 else -math.inf)
    return tuple(out)


def crossing(fractions: Sequence[float], bounds: Sequence[float], sides: int, theta: float = 0.0) -> np.ndarray:
    """Probability of stopping first at each look (shape (K,)) when the z statistic's mean
    at t = 1 is ``theta`` and look k stops beyond z ``bounds[k]`` (two-sided: either side)."""
    rec, out = _Recursion(theta), []
    for t, b in zip(fractions, bounds, strict=True):
        lower = -b if sides == 2 else -math.inf
        up, down = rec.exit(t, b, lower)
        out.append(up + down)
        rec.advance(t, b, lower)
    return np.asarray(out)


def constant_boundaries(k: int, alpha: float, kind: Literal["pocock", "obf"], sides: int = 2) -> tuple[float, ...]:
    """The classical designs with ``k`` equally spaced looks: Pocock (1977) stops beyond
    the same z at every look; O'Brien & Fleming (1979) beyond ``C sqrt(k / j)`` at look j.
    The constant solves "total crossing probability under the null = alpha" by the same
    recursion; these are what Jennison & Turnbull's (2000) Tables 2.1 and 2.3 list."""
    from scipy.optimize import brentq

    t = [(j + 1) / k for j in range(k)]
    shape = [1.0] * k if kind == "pocock" else [math.sqrt(k / (j + 1)) for j in range(k)]

    def gap(c: float) -> float:
        return float(crossing(t, [c * s for s in shape], sides).sum()) - alpha
    c = float(brentq(gap, 0.5, 6.0, xtol=1e-10))
    return tuple(c * s for s in shape)


def expected_prompts(design: Design, effect: float) -> tuple[float, np.ndarray]:
    """(expected prompts generated, probability of stopping at each look) if the true
    standardised effect per prompt is ``effect`` ((mean - null) / per-prompt SD, positive
    on the better side; a two-sided design reads its size only), under the
    normal approximation with known variance: the z statistic at N prompts then has mean
    ``effect * sqrt(N)``. A study that never crosses runs to ``max_prompts``. The saving
    against the fixed design of ``max_prompts`` is ``1 - expected / max_prompts``; at
    small N it is optimistic (``simulated_prompts`` decides with the verdicts' test)."""
    f, b = design.fractions, design.boundaries()
    drift = (abs(effect) if design.sides == 2 else effect) * math.sqrt(design.max_prompts)  # one-sided: signed
    p = crossing(f, b, design.sides, drift)
    stop = p.copy()
    stop[-1] = 1.0 - float(p[:-1].sum())  # the last look ends every study
    return float(np.dot(stop, design.looks)), stop


def simulated_prompts(design: Design, effect: float, reps: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """(mean prompts generated, probability of a verdict) over ``reps`` simulated studies
    whose per-prompt values are normal with standardised mean ``effect``, decided by the
    verdicts' test at each look's nominal level (``stop_looks``). At 10-60 prompts this is
    the figure to plan with: the t-based test needs more prompts than the known-variance
    ``expected_prompts`` says (about 2 of 40 for O'Brien-Fleming-type spending at an effect
    of half an SD; tests/test_groupseq.py)."""
    x = np.random.default_rng(seed).normal(effect, 1.0, (reps, design.max_prompts))
    stop = stop_looks(x, design, 0.0, continuous=True, seed=seed)
    n = np.where(stop < 0, design.max_prompts, np.asarray(design.looks)[np.maximum(stop, 0)])
    return float(n.mean()), float(np.mean(stop >= 0))


@dataclass(frozen=True)
class Look:
    """One look at one question: ``prompts`` analysed (fraction ``fraction`` of the plan),
    its z ``boundary`` and two-sided nominal level ``nominal_p``, the test's ``p`` of
    ``mean = null`` (None below 2 prompts or at zero spread), the ``estimate`` and the
    ``decision`` (``reject``: decided here; ``continue``: the next look is needed;
    ``final``: the planned maximum, undecided)."""

    prompts: int
    fraction: float
    boundary: float
    nominal_p: float
    p: float | None
    estimate: float
    decision: Decision


@dataclass(frozen=True)
class Outcome:
    """A question's course over the looks the data reach, stopping at the first that
    rejects. ``decided``: it rejected ``null``; ``stopped``: no further look is needed (it
    rejected, or the planned maximum was reached); ``interval``: the repeated confidence
    interval at the last look analysed, at confidence ``level`` (= 1 - its nominal p; None
    bounds where the test bounds no interval, with ``why``)."""

    design: Design
    null: float
    looks: tuple[Look, ...]
    decided: bool
    stopped: bool
    estimate: float
    interval: tuple[float | None, float | None]
    level: float
    why: str | None

    @property
    def prompts(self) -> int:
        """Prompts analysed at the last look."""
        return self.looks[-1].prompts

    @property
    def saved(self) -> int:
        """Planned prompts not needed (0 unless it stopped before the maximum)."""
        return self.design.max_prompts - self.prompts if self.stopped else 0


def fractions_reached(design: Design, n: int) -> list[float]:
    """The planned information fractions of the looks whose prompts ``n`` prompts cover
    (the last, at ``max_prompts``, is 1)."""
    return [f for m, f in zip(design.looks, design.fractions, strict=True) if m <= n]


def decide_z(z: Sequence[float], fractions: Sequence[float], design: Design) -> list[Decision]:
    """The decision at each look from z statistics already formed (known variance, or
    a caller's own statistic): ``z[k]`` at information fraction ``fractions[k]`` (observed;
    need not be the planned ones, 1 at the last). ``reject`` at the first look beyond its
    boundary (two-sided: |z|; one-sided: z above, so orient z with the better side
    positive), and nothing after it; ``final`` at a
    last look of fraction 1 that does not reject. Raises StatsError if the lengths differ."""
    if len(z) != len(fractions):
        raise StatsError(f"{len(z)} z statistics for {len(fractions)} look fractions; give one z per look")
    out: list[Decision] = []
    for zk, t, b in zip(z, fractions, design.boundaries(fractions), strict=True):
        if (abs(zk) if design.sides == 2 else zk) >= b:
            out.append("reject")
            break
        out.append("final" if t >= 1.0 else "continue")
    return out


def monitor(values: np.ndarray, design: Design, null: float = 0.0, sign: int = 1, seed: int = 0) -> Outcome:
    """Walk one question's looks over per-prompt ``values`` (1-D, in release order:
    look k analyses the first ``design.looks[k]``) and stop at the first that rejects
    ``mean = null``: the verdicts' test (``inference.Cell``) at the look's nominal level.
    ``sign`` +1 if higher is better (one-sided designs reject only on the better side).
    Raises StatsError if ``values`` has fewer prompts than the first look or holds NaN."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise StatsError(f"per-prompt values must be a 1-D array of finite numbers; got shape {x.shape} "
                         f"with {int(np.sum(~np.isfinite(x)))} non-finite")
    f = fractions_reached(design, len(x))
    if not f:
        raise StatsError(f"{len(x)} prompts do not reach the first look ({design.looks[0]} prompts); "
                         "monitor after the first look's prompts are scored")
    bounds = design.boundaries(f)
    looks: list[Look] = []
    for j, (t, b) in enumerate(zip(f, bounds, strict=True)):
        n = design.looks[j]
        cell = inference.Cell(x[:n], inference.signflip_signs(n, SIGNFLIPS, seed))
        nominal = design.nominal(b)
        p = cell.p(null)
        right_side = design.sides == 2 or sign * (cell.mean - null) > 0
        reject = p is not None and p < nominal and right_side
        last = j == len(design.fractions) - 1
        looks.append(Look(n, t, b, nominal, p, cell.mean, "reject" if reject else "final" if last else "continue"))
        if reject:
            break
    level = 1 - looks[-1].nominal_p
    lo, hi, why = inference.Cell(x[:looks[-1].prompts],
                                 inference.signflip_signs(looks[-1].prompts, SIGNFLIPS, seed)).interval(level)
    decided = looks[-1].decision == "reject"
    return Outcome(design, null, tuple(looks), decided, decided or looks[-1].decision == "final",
                   looks[-1].estimate, (lo, hi), level, why)


def monitor_questions(values: Mapping[str, np.ndarray], nulls: Mapping[str, float], design: Design,
                      signs: Mapping[str, int] | None = None, seed: int = 0,
                      multiplicity: Family = "bonferroni") -> tuple[dict[str, Outcome], bool]:
    """Every pre-registered question at once, each with its own spending boundary at a
    share of ``design.alpha``: ``bonferroni``, alpha / m over the m questions; ``holm``,
    alpha / r over the r questions not yet decided, re-walking every look so far whenever a
    question is decided (the graphical group-sequential Holm procedure of Maurer & Bretz
    2013: a decided question's alpha passes to the rest, whose earlier looks are re-read at
    the larger share). Returns (outcome per question, whether the study stops: every
    question decided, or the maximum reached). Raises ConfigError if a question has no
    null or ``multiplicity`` is unknown."""
    missing = sorted(set(values) - set(nulls))
    if missing:
        raise ConfigError(f"questions {missing} have no null value; give each question its null "
                          "(0, the loss edge -margin, or its floor)")
    if multiplicity not in FAMILIES:
        raise ConfigError(f"multiplicity {multiplicity!r} is unknown for group-sequential looks; use one of {FAMILIES}")
    out: dict[str, Outcome] = {}
    remaining = sorted(values)
    while remaining:
        share = _share(design, len(values) if multiplicity == "bonferroni" else len(remaining))
        walked = {q: monitor(values[q], share, nulls[q], (signs or {}).get(q, 1), seed) for q in remaining}
        out.update(walked)
        remaining = [q for q in remaining if not walked[q].decided]
        if multiplicity == "bonferroni" or len(remaining) == len(walked):
            break
    return dict(sorted(out.items())), all(o.stopped for o in out.values())


def _share(design: Design, m: int) -> Design:
    """``design`` at ``alpha / m``."""
    return Design(design.fractions, design.max_prompts, design.alpha / max(m, 1), design.spending, design.sides,
                  design.gamma)


def family_stops(xs: Sequence[np.ndarray], nulls: Sequence[float], design: Design, continuous: bool,
                 multiplicity: Family = "bonferroni", seed: int = 0) -> np.ndarray:
    """Vectorised ``monitor_questions`` for simulation: ``xs[i]`` is question i's
    per-prompt values (studies, max_prompts); returns (questions, studies) the look at
    which each question was decided (-1: never), as ``monitor_questions`` decides it."""
    m = len(xs)
    at = {r: np.stack([stop_looks(x, _share(design, r), mu, continuous, seed) for x, mu in zip(xs, nulls, strict=True)])
          for r in ({m} if multiplicity == "bonferroni" else set(range(1, m + 1)))}
    stop = at[m].copy()
    if multiplicity == "holm":
        for _ in range(m - 1):  # each round, re-read the undecided at alpha / (number undecided)
            left = (stop < 0).sum(axis=0)
            for r in range(1, m):
                rows = left == r
                stop[:, rows] = np.where(stop[:, rows] >= 0, stop[:, rows], at[r][:, rows])
    return np.asarray(stop)


def stop_looks(x: np.ndarray, design: Design, null: float, continuous: bool, seed: int = 0,
               sign: int = 1) -> np.ndarray:
    """Vectorised ``monitor`` for simulation: per row of ``x`` (studies, max_prompts) the
    index of the look that rejects first (-1: none); a one-sided design rejects only with
    the mean on the ``sign`` side of ``null`` (+1: above). ``continuous``
    rows (never flat or quantised) take ``inference.parametric_p`` past
    ``inference.SIGNFLIP_ALWAYS_UP_TO`` prompts, as planning does; others ``union_p``."""
    stop = np.full(x.shape[0], -1)
    for j, b in enumerate(design.boundaries()):
        n = design.looks[j]
        p = _rows_p(x[:, :n], null, continuous, seed)
        hit = (stop < 0) & (p < design.nominal(b))
        if design.sides == 1:
            hit &= sign * (x[:, :n].mean(axis=1) - null) > 0
        stop[hit] = j
    return stop


def _rows_p(x: np.ndarray, mu: float, continuous: bool, seed: int) -> np.ndarray:
    if continuous and x.shape[1] > inference.SIGNFLIP_ALWAYS_UP_TO:
        return np.asarray(inference.parametric_p(x, mu))
    return inference.union_p(x, mu, inference.signflip_signs(x.shape[1], SIGNFLIPS, seed))


def covers(x: np.ndarray, design: Design, stop: np.ndarray, truth: float, continuous: bool,
           seed: int = 0) -> np.ndarray:
    """Per row: whether the repeated confidence interval at the row's stopping look (the
    last look where ``stop`` is -1) holds ``truth``: the test at that look does not reject
    ``truth`` at the look's nominal level."""
    out = np.zeros(x.shape[0], dtype=bool)
    last = len(design.fractions) - 1
    at = np.where(stop < 0, last, stop)
    for j, b in enumerate(design.boundaries()):
        rows = at == j
        if rows.any():
            n = design.looks[j]
            out[rows] = _rows_p(x[rows, :n], truth, continuous, seed) >= design.nominal(b)
    return out

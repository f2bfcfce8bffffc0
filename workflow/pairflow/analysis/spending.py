"""Group-sequential boundaries: the alpha-spending functions, the Armitage-McPherson-Rowe
recursion that turns them into z boundaries, the classical constant designs, crossing
probabilities and the expected prompts a design needs. The mathematics of a plan, read
from no data; ``groupseq`` decides with it at each look.

A ``Design`` plans looks at increasing information fractions ``t_k = n_k / N`` of the
planned maximum ``N`` prompts, for one question at level ``alpha``.

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
(tests/test_spending.py names each table).

The boundaries are for a z statistic with known variance: ``nominal_p`` turns a look's
boundary into the nominal level at which ``groupseq`` reads the verdicts' own test (its
docstring says why that keeps the error rate). Pure functions; numpy and scipy only; no
torch, no I/O.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import ConfigError, StatsError

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
    small N it is optimistic (``groupseq.simulated_prompts`` decides with the verdicts' test)."""
    f, b = design.fractions, design.boundaries()
    drift = (abs(effect) if design.sides == 2 else effect) * math.sqrt(design.max_prompts)  # one-sided: signed
    p = crossing(f, b, design.sides, drift)
    stop = p.copy()
    stop[-1] = 1.0 - float(p[:-1].sum())  # the last look ends every study
    return float(np.dot(stop, design.looks)), stop

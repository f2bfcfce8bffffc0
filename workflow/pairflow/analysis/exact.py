"""The exact test of paired proportions, for 0/1 metrics (e.g. VBench's dynamic_degree).

Where both arms score 0 or 1 and every prompt's difference is -1, 0 or +1 (one seed per
prompt, or seeds that agree), the differences follow a trinomial law: +1 with probability
p+, -1 with p-, 0 otherwise, and the mean difference is delta = p+ - p-. For "delta = d0"
the test orders the outcomes (b prompts +1, c prompts -1 of n) by Tango's (1998) score
statistic, ``(b - c - n d0) / sqrt(n (2 q + d0 (1 - d0)))`` with q the maximum-likelihood
p- under delta = d0 (McNemar's z at d0 = 0), and its one-sided p is the largest
probability of an outcome at least as extreme over every p- the null allows (an exact
unconditional test, Suissa and Shuster 1991; the supremum over ``NUISANCE_GRID`` equal
steps of p-, both ends included): exact at any n, no symmetry assumed, and defined at zero spread,
where the sign-flip test is not (seven prompts all 0 against 0 do not show a mean above
-0.2: a loss of 1 on one prompt in five leaves them all 0 with probability 0.21). The
two-sided p is twice the smaller one-sided p; the interval is every d0 it accepts.
McNemar's exact conditional test (a binomial on the discordant prompts) is the usual
alternative; it tests only d0 = 0 and has less power (BENCHMARKS.md). Imports without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np

from .inference import Cell

NUISANCE_GRID = 200
"""Equal steps over the nuisance p-, from its smallest to its largest value under the null
(NUISANCE_GRID + 1 points, both ends included), for the supremum."""
PROCEDURE = ("exact unconditional test of paired proportions (Tango's score statistic, supremum over the nuisance "
             "probability; Suissa and Shuster 1991), inverted into the interval")


def is_binary(control: list[float], treatment: list[float], x: np.ndarray) -> bool:
    """Whether a cell is a 0/1 metric the exact test fits: every control and treatment
    value is 0 or 1 and every per-prompt difference ``x`` is -1, 0 or +1."""
    values = set(control) | set(treatment)
    return bool(values) and values <= {0.0, 1.0} and len(x) >= 2 and bool(np.all(np.isin(x, (-1.0, 0.0, 1.0))))


@cache
def _outcomes(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every trinomial outcome of n prompts: (b, c, log multinomial coefficient)."""
    b, c = (a.ravel() for a in np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij"))
    keep = b + c <= n
    b, c = b[keep], c[keep]
    lg = np.vectorize(math.lgamma)
    return b, c, lg(n + 1) - lg(b + 1) - lg(c + 1) - lg(n - b - c + 1)


def score(b: np.ndarray, c: np.ndarray, n: int, d0: float) -> np.ndarray:
    """Tango's score statistic of delta = d0 for outcomes (b, c) of n prompts."""
    b, c = np.asarray(b, dtype=np.float64), np.asarray(c, dtype=np.float64)
    a = n - b - c
    lin = b * (1 - d0) + c * (1 - 3 * d0) - 2 * a * d0
    q = (lin + np.sqrt(np.maximum(lin * lin + 8 * n * c * d0 * (1 - d0), 0.0))) / (4 * n)
    q = np.clip(q, max(0.0, -d0), (1 - d0) / 2)
    var = n * (2 * q + d0 * (1 - d0))
    num = b - c - n * d0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 1e-12, num / np.sqrt(np.maximum(var, 1e-300)), np.sign(num) * np.inf)
    return np.asarray(np.where(np.abs(num) < 1e-9, 0.0, z), dtype=np.float64)


def one_sided(b: int, c: int, n: int, d0: float) -> tuple[float, float]:
    """(p of delta > d0, p of delta < d0): the largest null probability, over the
    nuisance p-, of a score at least (at most) the observed one."""
    if d0 < -1 or d0 > 1:  # no delta lies beyond -1 or 1: every one is on the near side
        return (1.0, 0.0) if d0 > 1 else (0.0, 1.0)
    ob, oc, logc = _outcomes(n)
    z = score(ob, oc, n, d0)
    z_obs = float(score(np.array([b]), np.array([c]), n, d0)[0])
    lo, hi = max(0.0, -d0), (1 - d0) / 2
    q = np.linspace(lo, hi, NUISANCE_GRID + 1)[:, None]
    # p+ = q + d0 is exactly 0 at q = -d0, the first point; p0 at the last point can round below 0.
    plus, zero = q + d0, np.maximum(1 - 2 * q - d0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # A probability of 0 has log -inf: an outcome that needs it has probability exactly 0 (at
        # delta = +-1 the null is the one outcome every prompt +1 or -1); a count of 0 adds 0.
        logp = (logc + np.where(ob > 0, ob * np.log(plus), 0.0) + np.where(oc > 0, oc * np.log(q), 0.0)
                + np.where(n - ob - oc > 0, (n - ob - oc) * np.log(zero), 0.0))
    prob = np.exp(logp)
    tol = 1e-9 * max(1.0, abs(z_obs)) if math.isfinite(z_obs) else 0.0
    upper = float(np.max(prob[:, z >= z_obs - tol].sum(axis=1)))
    lower = float(np.max(prob[:, z <= z_obs + tol].sum(axis=1)))
    return min(1.0, upper), min(1.0, lower)


def two_sided(b: int, c: int, n: int, d0: float) -> float:
    """Two-sided exact p of delta = d0: twice the smaller one-sided p, at most 1."""
    up, down = one_sided(b, c, n, d0)
    return min(1.0, 2 * min(up, down))


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact conditional p of delta = 0: two-sided binomial on the b + c
    discordant prompts (1 with none)."""
    # lazy: scipy.stats is slow to import (seconds on a busy node); every rule script imports this via steps.
    from scipy.stats import binomtest

    return 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5).pvalue)


class BinaryCell(Cell):
    """A cell of a 0/1 metric (``is_binary``): its p and interval are the exact paired
    proportions test's, for any mean difference in [-1, 1], zero spread included."""

    @property
    def counts(self) -> tuple[int, int]:
        """(prompts where the treatment gained 1, prompts where it lost 1)."""
        return int(np.sum(self.x > 0.5)), int(np.sum(self.x < -0.5))

    @property
    def flat(self) -> bool:
        """Never: the exact test needs no spread."""
        return False

    @property
    def uses_signflip(self) -> bool:
        return False

    def p(self, mu: float) -> float | None:
        """Two-sided exact p of "mean difference = mu" (None below 2 prompts)."""
        if self.n < 2:
            return None
        b, c = self.counts
        return two_sided(b, c, self.n, float(mu))

    def interval(self, level: float) -> tuple[float | None, float | None, str | None]:
        """Every mu in [-1, 1] the exact test accepts at 1 - ``level`` (its hull, each edge
        found by bisection from the estimate outward)."""
        if self.n < 2:
            return None, None, "no interval: fewer than 2 prompts"
        alpha = 1 - level
        b, c = self.counts

        def edge(out: float) -> float:
            # The end (-1 or 1) is rejected unless every prompt sits at it, and then the
            # estimate is that end: the bisection returns it either way.
            inside = self.mean
            for _ in range(40):
                mid = (inside + out) / 2
                if two_sided(b, c, self.n, mid) >= alpha:
                    inside = mid
                else:
                    out = mid
            return inside

        return edge(-1.0), edge(1.0), None


def rejection_rate(n: int, p_plus: float, p_minus: float, rejects: Callable[[int, int], bool]) -> float:
    """The exact probability that a test rejects, with ``n`` prompts whose differences are
    +1 with probability ``p_plus`` and -1 with ``p_minus`` (power, or size on the null):
    the sum over every outcome (b, c) of its trinomial probability where ``rejects(b, c)``."""
    ob, oc, logc = _outcomes(n)
    p_zero = 1.0 - p_plus - p_minus
    total = 0.0
    for b, c, lc in zip(ob.tolist(), oc.tolist(), logc.tolist(), strict=True):
        a = n - b - c
        if (b and p_plus <= 0) or (c and p_minus <= 0) or (a and p_zero <= 0):
            continue
        logp = lc + (b * math.log(p_plus) if b else 0.0) + (c * math.log(p_minus) if c else 0.0) + (
            a * math.log(p_zero) if a else 0.0)
        if rejects(b, c):
            total += math.exp(logp)
    return total

"""Timing that stops when the speedup is tight: Stein's two-stage procedure over prompts.

The timed pass (``timing.pairs: auto``, the default) does not time every pair. It times a
pilot of ``timing.pilot_prompts`` prompts (every seed of each, every arm), and from the
spread of each arm's per-prompt log latency ratio in the pilot it fixes how many prompts
that arm needs for its speedup interval's half-width to reach ``timing.precision``
(relative: a 2% precision is a half-width of log(1.02) on the log scale), capped by
``timing.max_prompts`` and by the prompts the study has. Then it times that many, in
the same seeded order, and stops.

Why two stages and not "stop when the running interval is narrow enough": stopping the
first time the interval looks tight selects the runs whose sample spread happened to be
small, and the interval then covers less often than it says. Simulated at a nominal 0.95
with a 5-prompt minimum (tests/test_sequential.py), that rule covered 0.918 for normal
data. Stein's procedure (Stein 1945, "A two-sample test for a linear hypothesis whose
power is independent of the variance") decides N from the pilot alone: under normality
the mean of all N prompts is independent of the pilot's spread ``s0``, so
(mean - mu) * sqrt(N) / s0 follows Student's t with n0 - 1 degrees of freedom exactly,
whatever N the pilot chose. The reported interval is therefore the wider of Stein's
(``q(n0 - 1) * s0 / sqrt(N)``) and the ordinary t-interval over the N prompts: at least
as wide as an exact one. Coverage is shown by simulation in the tests (normal, t3 and a
latency-like mixture; at least 0.95 there, against the issue's bar of 0.93).

The unit is a prompt (``panel/prompt id``) with all its seeds, the unit the speedup's
interval is computed over (``stats._per_prompt``). The order is a seeded hash rank of
each prompt (xxh3 of ``timing.seed``, panel and prompt id), so adding a prompt to a panel
inserts it somewhere in the order without reshuffling the others' places.
Pure functions; no torch, no I/O.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..identity import digest_obj

DESIGN = "stein-two-stage"
"""The name the timing records carry for this design."""


@dataclass(frozen=True)
class Plan:
    """One arm's timing plan after the pilot: ``prompts`` to time in all (the pilot's
    included), why it stops there (``precision``: the planned half-width reaches the
    target; ``ceiling``: ``timing.max_prompts`` caps it; ``exhausted``: the study has no
    more prompts), and the pilot's figures it came from."""

    prompts: int
    stopped: str
    pilot_prompts: int
    pilot_sd: float | None
    planned_half_width: float | None


def order(units: Iterable[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
    """The (panel, prompt id) units in the order the timed pass takes them: by the xxh3
    digest of (seed, panel, prompt id). Independent of input order."""
    return sorted(set(units), key=lambda u: (digest_obj([seed, u[0], u[1]]), u))


@functools.lru_cache(maxsize=256)
def _t_quantile(df: int, level: float) -> float:
    from scipy.stats import t  # lazy: scipy.stats takes seconds to import

    return float(t.ppf(1 - (1 - level) / 2, df))


def plan(pilot_log_ratios: np.ndarray, level: float, precision: float, pilot_prompts: int, available: int,
         max_prompts: int) -> Plan:
    """How many prompts an arm needs, from its pilot's per-prompt log latency ratios.

    ``pilot_log_ratios``: the pilot prompts' mean log(control / treatment) latency (over
    seeds), as many as were timed cleanly; ``precision``: the relative half-width wanted
    (0.02: 2%); ``pilot_prompts``: the pilot's planned size; ``available``: prompts the
    study has; ``max_prompts``: the ceiling. With fewer than 2 clean pilot prompts the
    spread is unknown and every prompt up to the ceiling is timed."""
    cap = min(available, max_prompts)
    x = np.asarray(pilot_log_ratios, dtype=np.float64)
    n0 = len(x)
    if n0 < 2:
        return Plan(cap, "exhausted" if cap == available else "ceiling", n0, None, None)
    sd = float(x.std(ddof=1))
    q = _t_quantile(n0 - 1, level)
    d = math.log1p(precision)
    need = max(pilot_prompts, n0, math.ceil((q * sd / d) ** 2 - 1e-9))
    n = min(need, cap)
    stopped = "precision" if need <= cap else ("exhausted" if cap == available else "ceiling")
    return Plan(n, stopped, n0, sd, q * sd / math.sqrt(n))


def stein_half_width(pilot_log_ratios: np.ndarray, n: int, level: float) -> float | None:
    """Stein's half-width on the log scale for the mean of ``n`` prompts whose number was
    chosen from ``pilot_log_ratios`` (None with fewer than 2 pilot prompts)."""
    x = np.asarray(pilot_log_ratios, dtype=np.float64)
    if len(x) < 2 or n < 1:
        return None
    return _t_quantile(len(x) - 1, level) * float(x.std(ddof=1)) / math.sqrt(n)

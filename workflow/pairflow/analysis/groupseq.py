"""Group-sequential stopping over prompts: the decision at each look, the interval after a
stop, several questions at once, and the prompts a stop saves under the verdicts' test.
The boundaries it reads are ``spending``'s (alpha spending, the Armitage-McPherson-Rowe
recursion). ``looks`` binds it to a study (config ``sequential``): rule look_panel and
checkpoint look call it between looks (docs/metrics-and-verdicts.md, "Group-sequential looks").

A study that declares looks releases its prompts in stages: look k analyses the first
``n_k`` prompts of the release order, at information fraction ``t_k = n_k / N`` of the
planned maximum ``N``. Each pre-registered question (a cell's test of ``mean = null``, the
same null the verdict tests: 0, the loss edge -margin, or a floor) is tested at every look
against a boundary that spends its alpha over the looks, and the study stops once every
question is decided or at ``N``.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import ConfigError, StatsError
from . import inference
from .spending import Design

SIGNFLIPS = 2000
"""Random sign vectors of the sign-flip test at a look (as the verdicts use)."""
Decision = Literal["reject", "continue", "final"]
Family = Literal["bonferroni", "holm"]
FAMILIES: tuple[Family, ...] = ("bonferroni", "holm")


def simulated_prompts(design: Design, effect: float, reps: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """(mean prompts generated, probability of a verdict) over ``reps`` simulated studies
    whose per-prompt values are normal with standardised mean ``effect``, decided by the
    verdicts' test at each look's nominal level (``stop_looks``). At 10-60 prompts this is
    the figure to plan with: the t-based test needs more prompts than the known-variance
    ``spending.expected_prompts`` says (about 2 of 40 for O'Brien-Fleming-type spending at
    an effect of half an SD; tests/test_groupseq.py)."""
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

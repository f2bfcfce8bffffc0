"""A group-sequential study's looks (config ``sequential``): the design over the study's
prompts, the pre-registered questions, the decision at each look, and what a stop saved.
``spending`` gives the boundaries and ``groupseq`` decides with them; this module binds
them to a study. Pure functions over records and the config; the look jobs and the
checkpoint call them through ``stages.steps`` (``look_panel``, ``decide_look``).

Release: look k releases each panel's first ``ceil(f_k * planned)`` prompts of its sheet
(the sheet's order is the pre-registered release order; ``plan.config.look_counts``). The
study is one design over every panel's prompts pooled, as the study table pools them:
its information fraction at look k is the prompts released by then over every planned
prompt, so uneven panels are handled by the fractions, not by rounding.

Questions: every cell of the study's family (a declared treatment against control on an
NR metric, at its margin or against 0, or an FR metric with a floor): the same null the
table's verdict tests, each against its own spending boundary at its share of alpha (1 -
``stats/level``), shared as ``sequential/multiplicity`` says. The iso-compute controls'
comparisons are outside the family (as in the table) and do not hold a study open.

A question whose prompts are not every released prompt (the static filter left some out)
is not monitored: its looks would fall on other counts than the design's. It is read at
the planned maximum, so it holds the study open to the end: stopping early on fewer
prompts than planned would spend alpha the design did not allow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..metrics import metric_spec
from ..plan.config import LOOK_FORMAT, StudySpec, look_counts, planned_digest
from . import groupseq
from .inference import Question
from .spending import SPENDING_NAMES, Design

Key = tuple[str, int]
"""A pair's key: ("<panel>/<prompt id>", seed), as ``analysis.stats`` indexes records."""


def questions(study: StudySpec) -> list[tuple[str, str, Question | None]]:
    """Each (treatment, metric) cell and its pre-registered question, as ``analysis.stats``
    will ask it: an NR metric with a margin tests non-inferiority at that margin, any
    other NR metric a difference from 0; an FR metric with a floor tests the floor, one
    without (None) is reported as a value only, outside the family."""
    s = study.stats
    out: list[tuple[str, str, Question | None]] = []
    for arm in study.treatments:
        for name in study.scorers:
            spec = metric_spec(name)
            sign = 1 if spec.higher_is_better else -1
            if spec.kind == "FR":
                q = Question("floor", sign, floor=s.floors[name]) if name in s.floors else None
            else:
                q = Question("margin", sign, margin=s.margins[name]) if name in s.margins else Question("difference",
                                                                                                         sign)
            out.append((arm.name, name, q))
    return out


def release_order(study: StudySpec) -> list[str]:
    """Every planned prompt's key (``<panel>/<prompt id>``) in release order: those of look
    1 (panel by panel, each in its sheet's order), then those look 2 adds, and so on."""
    order, before = [], {p.name: 0 for p in study.panels}
    for counts in look_counts(study):
        for p in study.panels:
            order += [f"{p.name}/{q.prompt_id}" for q in p.planned[before[p.name]:counts[p.name]]]
            before[p.name] = counts[p.name]
    return order


def design(study: StudySpec) -> Design:
    """The study's design: its looks at the released share of every planned prompt."""
    seq = study.sequential
    if seq is None:
        raise ConfigError("the study declares no sequential looks (sequential/enabled is false)")
    total = sum(len(p.planned) for p in study.panels)
    released = [sum(c.values()) for c in look_counts(study)]
    return Design(tuple(n / total for n in released), total, round(1 - study.stats.level, 12), seq.spending, 2,
                  seq.gamma)


def stopping_rule(study: StudySpec) -> dict[str, Any]:
    """What the claim card declares before generation: the looks (fractions and prompts),
    the spending function, alpha, how questions share it, and each look's boundary for a
    question at the first share (Holm's first share is Bonferroni's; a decided question's
    alpha then passes to the rest, so later boundaries can only be lower)."""
    seq = study.sequential
    if seq is None:
        raise ConfigError("the study declares no sequential looks (sequential/enabled is false)")
    d = design(study)
    m = max(1, sum(q is not None for *_, q in questions(study)))
    first = Design(d.fractions, d.max_prompts, d.alpha / m, d.spending, d.sides, d.gamma)
    bounds = first.boundaries()
    name = SPENDING_NAMES[seq.spending] + (f" (gamma {seq.gamma:g})" if seq.spending == "hsd" else "")
    return {"kind": "group-sequential",
            "text": f"{len(d.looks)} looks at {', '.join(str(n) for n in d.looks)} of {d.max_prompts} prompts; "
                    f"{name} alpha spending, alpha {d.alpha:g} over {m} question(s) ({seq.multiplicity}); "
                    "stop once every question is decided",
            "interim_looks": len(d.looks) - 1, "looks": list(seq.looks), "prompts_at_looks": list(d.looks),
            "max_prompts": d.max_prompts, "spending": seq.spending, "spending_name": name, "gamma": seq.gamma,
            "alpha": d.alpha, "multiplicity": seq.multiplicity, "questions": m,
            "boundaries_first_share": [round(b, 6) for b in bounds],
            "nominal_p_first_share": [float(f"{first.nominal(b):.6g}") for b in bounds],
            "interval": "repeated confidence interval at the stopping look (Jennison & Turnbull 1989)"}


def per_prompt(values: Mapping[Key, float], order: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """The per-prompt means over seeds of ``values``, in release ``order``; with the
    prompts that have values (the rest of ``order`` has none)."""
    by: dict[str, list[float]] = {}
    for (prompt, _seed), v in values.items():
        by.setdefault(prompt, []).append(float(v))
    have = [p for p in order if p in by]
    return np.array([np.mean(by[p]) for p in have], dtype=np.float64), have


def decide(study: StudySpec, look: int, cells: Mapping[tuple[str, str], tuple[Question, Mapping[Key, float]]]
           ) -> dict[str, Any]:
    """Look ``look``'s decision file (``Layout.look``) from ``cells``: (arm, metric) to its
    question and per-pair values (``analysis.stats.question_values`` over the prompts
    released by this look). Every question of ``questions`` must have a cell (a cell
    missing means its records are: ``stages.steps.decide_look`` refuses before). Stops
    when every monitored question is decided, or at the last look. Where some question is
    not monitored, the monitored ones share only their part of alpha (m'/m of it), so the
    family's error rate still counts every question."""
    seq = study.sequential
    if seq is None:
        raise ConfigError("the study declares no sequential looks (sequential/enabled is false)")
    d = design(study)
    counts = look_counts(study)
    n = sum(counts[look - 1].values())
    order = release_order(study)[:n]
    arrays, nulls, signs, unmonitored = {}, {}, {}, {}
    for (arm, metric), (q, values) in sorted(cells.items()):
        x, have = per_prompt(values, order)
        qid = f"{arm}/{metric}"
        if len(have) != n:
            unmonitored[qid] = (f"{n - len(have)} of the {n} released prompts have no value (the static filter); "
                                "read at the planned maximum")
            continue
        arrays[qid], nulls[qid], signs[qid] = x, q.null, q.sign
    part = d if not unmonitored else Design(d.fractions, d.max_prompts, d.alpha * len(arrays) / len(cells),
                                            d.spending, d.sides, d.gamma)
    outcomes, stopped = groupseq.monitor_questions(arrays, nulls, part, signs, study.stats.seed, seq.multiplicity) \
        if arrays else ({}, False)
    last = look == len(d.looks)
    stop = last or (bool(arrays) and stopped and not unmonitored)
    rows = []
    for (arm, metric), (q, _v) in sorted(cells.items()):
        qid = f"{arm}/{metric}"
        o = outcomes.get(qid)
        rows.append({"arm": arm, "metric": metric, "hypothesis": q.hypothesis, "null": q.null, "sign": q.sign,
                     "monitored": o is not None, "note": unmonitored.get(qid),
                     **(_outcome(o) if o is not None else {"decided": False, "stopped": False})})
    undecided = sum(not r["decided"] for r in rows)
    why = ("every question decided" if rows and not undecided
           else "no question to decide: the study runs to its planned maximum" if not rows and not last
           else f"the last look (the planned maximum), {undecided} of {len(rows)} question(s) undecided" if last
           else f"{undecided} of {len(rows)} question(s) undecided")
    return {"format": LOOK_FORMAT, "look": look, "looks": len(d.looks),
            "planned": planned_digest(study.panels, list(seq.looks)),
            "released": dict(counts[look - 1]), "prompts": n, "max_prompts": d.max_prompts,
            "fractions": list(d.fractions), "prompts_at_looks": list(d.looks), "spending": seq.spending,
            "gamma": seq.gamma, "alpha": d.alpha, "multiplicity": seq.multiplicity,
            "questions": rows, "stop": stop, "why": why}


def _outcome(o: groupseq.Outcome) -> dict[str, Any]:
    return {"decided": o.decided, "stopped": o.stopped, "estimate": o.estimate,
            "interval": [o.interval[0], o.interval[1]], "level": o.level, "interval_note": o.why,
            "alpha_share": o.design.alpha, "decided_at": len(o.looks) if o.decided else None,
            "looks": [{"prompts": k.prompts, "boundary": k.boundary, "nominal_p": k.nominal_p, "p": k.p,
                       "estimate": k.estimate, "decision": k.decision} for k in o.looks]}


def section(study: StudySpec, stop: Mapping[str, Any], estimate: Mapping[str, Any] | None,
            measured: Mapping[str, float] | None = None) -> dict[str, Any]:
    """stats.json's ``sequential``: the stopping look's decision, and what stopping there
    saved against the fixed design of every planned prompt: candidates not generated; the
    calibration estimate's slot-seconds for them (generation and scoring, pro rata; the
    timed pass too where it times every pair), None without a calibration; and, from the
    look jobs' own telemetry (``measured``: their summed ``work_s`` and ``slot_s``), the
    work seconds those candidates would have taken at the measured work per candidate:
    work only, no start-up or idle slot time, so the lower figure a sceptic would quote."""
    planned = sum(len(p.planned) * len(p.seeds) for p in study.panels)
    run = sum(len(p.prompts) * len(p.seeds) for p in study.panels)
    arms = len(study.arms)
    share = 1 - run / planned if planned else 0.0
    saved_s = fixed_s = None
    unit = None
    if estimate is not None:
        stages = ("generate", "score", "timing") if study.timing.pairs == "all" else ("generate", "score")
        fixed_s = float(estimate["total_slot_s"])
        saved_s = share * sum(float(estimate["stage_slot_s"][s]) for s in stages)
        unit = str(estimate["unit"])
    return {**{k: stop[k] for k in ("look", "looks", "released", "prompts", "max_prompts", "fractions",
                                    "prompts_at_looks", "spending", "gamma", "alpha", "multiplicity", "questions",
                                    "stop", "why")},
            "spending_name": SPENDING_NAMES[stop["spending"]],
            "interval": "repeated confidence interval at the look each question stopped at (Jennison & Turnbull "
                        "1989): valid however the stop was chosen; the table's fixed-sample intervals are not",
            "candidates": {"planned": planned * arms, "generated": run * arms, "saved": (planned - run) * arms},
            "saved_share": share, "saved_slot_s": saved_s, "fixed_slot_s": fixed_s, "unit": unit,
            "measured": None if not measured or run <= 0 else {
                **{k: float(v) for k, v in measured.items()},
                "work_s_per_candidate": float(measured["work_s"]) / (run * arms),
                "saved_work_s": float(measured["work_s"]) / (run * arms) * (planned - run) * arms},
            "saved_from": "the calibration estimate (study/estimate.json), pro rata to candidates not generated"
            if estimate is not None else "no calibration (fleet/calibrate: false): candidates only"}


def hours(s: float | None) -> str:
    """Slot-seconds as hours for a sentence (None: "not estimated")."""
    return "not estimated" if s is None else f"{s / 3600:.3g} h" if s >= 36 else f"{s:.3g} s"


def sentence(seq: Mapping[str, Any]) -> str:
    """The answer line's sentence: where the study stopped and what that saved."""
    c = seq["candidates"]
    where = (f"stopped at look {seq['look']} of {seq['looks']} ({seq['prompts']} of {seq['max_prompts']} prompts): "
             f"{seq['why']}")
    if c["saved"] <= 0:
        return f"Group-sequential: {where}; nothing saved against the fixed design"
    unit = seq.get("unit") or "slot-hours"
    cost = ("" if seq.get("saved_slot_s") is None else
            f", about {hours(seq['saved_slot_s'])} of {unit.replace('-hours', '')} time")
    return (f"Group-sequential: {where}; {c['saved']} of {c['planned']} candidates not generated "
            f"({100 * seq['saved_share']:.0f}%{cost})")


def boundary_text(b: float) -> str:
    """A z boundary for a table (the cap reads as "none": that look spends nothing)."""
    return "none" if b >= 8.4 else f"{b:.3f}"


def fmt_p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def rows(seq: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The report's table: per question and look analysed, the boundary, nominal level,
    p and decision; then the question's repeated confidence interval."""
    head = ["arm", "metric", "hypothesis", "look (prompts)", "z boundary", "nominal p", "p", "decision",
            "estimate", "repeated CI"]
    out = []
    for q in seq["questions"]:
        if not q["monitored"]:
            out.append([q["arm"], q["metric"], q["hypothesis"], "-", "-", "-", "-", q["note"] or "not monitored",
                        "-", "-"])
            continue
        lo, hi = q["interval"]
        low, high = "-inf" if lo is None else f"{lo:.4g}", "inf" if hi is None else f"{hi:.4g}"
        ci = "-" if lo is None and hi is None else f"[{low}, {high}] ({100 * q['level']:.2f}%)"
        for j, k in enumerate(q["looks"]):
            final = j == len(q["looks"]) - 1
            out.append([q["arm"], q["metric"], q["hypothesis"], f"{j + 1} ({k['prompts']})",
                        boundary_text(k["boundary"]), fmt_p(k["nominal_p"]), fmt_p(k["p"]), k["decision"],
                        f"{k['estimate']:.4g}" if final else "", ci if final else ""])
    return head, out

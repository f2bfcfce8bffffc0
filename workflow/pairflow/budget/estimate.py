"""What a study will cost before it starts, from the frozen calibration table and the
config, and the budget guard (``fleet/budget_gpu_hours``).

Slot-seconds (a slot is one GPU, or one CPU worker where no GPU is granted; GPU-hours are
slot-seconds / 3600 on GPUs) per stage and arm:

- ``generate``: candidates of the arm (prompts x seeds over every panel) x the table's
  seconds for one candidate (denoise, decode, encode; a search arm's N generations);
- ``score``: candidates x (reading the video + every scorer);
- ``warm-up``: every slot of every fan-out job imports and loads once (``import`` +
  the arms' ``load``), shared by the arms (split by their work, as the ledger does);
- ``timing``: the exclusive timed pass: per arm ``timing/warmup`` untimed runs, then
  ``timing/repeats`` runs of every timed pair (``timing/pairs`` per panel, or all; under
  ``auto``, the sequential design, at most ``timing/max_prompts`` prompts: an upper bound),
  each the arm's uncounted generation seconds (``timed_s``).

A group-sequential study (``sequential``) is estimated at its planned maximum, every
prompt of every sheet and a panel job per look: the budget guard is for the worst case;
the report states what a stop saved.

Wall time: the fan-out jobs at ``nodes x slots_per_node`` slots, one panel job after
another (as the local profile runs them; on a cluster they may overlap, so this is an
upper bound there), plus the timed pass on one slot. Not estimated: job start-up
(interpreter, Parsl pool), queueing and idle slot time; the ledger measures them, and
BENCHMARKS.md gives the estimate-to-ledger ratio of the default study.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import BudgetError
from ..plan.config import StudySpec
from .calibrate import load_table

log = logging.getLogger(__name__)

STAGES = ("generate", "score", "warm-up", "timing")


def _timed_pairs(study: StudySpec) -> int:
    """Pairs the timed pass times, over every panel."""
    pairs = study.timing.pairs
    if pairs == "auto":  # sequential: at most timing.max_prompts prompts (every seed of each); an upper bound
        units = sorted((len(p.seeds) for p in study.panels for _prompt in p.planned), reverse=True)
        return sum(units[:study.timing.max_prompts])
    return sum(len(p.planned) * len(p.seeds) if pairs == "all" else min(int(pairs), len(p.planned) * len(p.seeds))
               for p in study.panels)


def estimate(study: StudySpec, table: dict[str, Any], nodes: int = 1,
             slots_per_node: int | None = None) -> dict[str, Any]:
    """The study's estimated slot-seconds per stage and arm, total slot-hours and wall
    time (see the module docstring) from calibration ``table`` (``calibrate.read_table``).
    ``slots_per_node``: default the fan-out's slots on this table's device (one GPU on
    CUDA, ``fleet/cpu_workers`` on CPU)."""
    slots_node = slots_per_node or (1 if table["device"] == "cuda" else study.fleet.cpu_workers)
    slots = max(1, nodes) * slots_node
    arms = table["arms"]
    per_panel = {p.name: len(p.planned) * len(p.seeds) for p in study.panels}
    n = sum(per_panel.values())
    by: dict[str, dict[str, float]] = {s: {} for s in STAGES}
    for a in study.arms:
        t = arms[a.name]
        by["generate"][a.name] = n * float(t["generate_s"])
        by["score"][a.name] = n * float(t["score_s"])
        timed = float(t.get("timed_s", float(t["generate_s"]) - float(t["phases"]["encode"]["s"])))
        by["timing"][a.name] = (study.timing.warmup + study.timing.repeats * _timed_pairs(study)) * timed
    load = sum(float(t["phases"]["load"]["s"]) for t in arms.values())
    # a group-sequential study at its planned maximum: a job per panel at each look, and the final one
    looks = len(study.sequential.looks) + 1 if study.sequential else 1
    jobs = len(study.panels) * (1 if study.fleet.panel_jobs == "combined" else 2) * looks
    warm_job = slots * (float(table["import"]["s"]) + load)
    warm_total = jobs * warm_job
    work = {a: by["generate"][a] + by["score"][a] for a in by["generate"]}
    total_work = sum(work.values()) or 1.0
    by["warm-up"] = {a: warm_total * w / total_work for a, w in work.items()}
    total = sum(sum(v.values()) for v in by.values())
    fanout_wall = sum(
        (float(table["import"]["s"]) + load) * (1 if study.fleet.panel_jobs == "combined" else 2)
        + per_panel[p] * sum(float(arms[a.name]["generate_s"]) + float(arms[a.name]["score_s"])
                             for a in study.arms) / slots
        for p in per_panel)
    timing_wall = sum(by["timing"].values()) + float(table["import"]["s"]) + load
    return {
        "kind": "estimate", "study": study.study, "calibration": {"key": table["key"], "device": table["device"]},
        "nodes": nodes, "slots_per_node": slots_node, "slots": slots, "candidates_per_arm": n,
        "slot_s": {s: dict(sorted(v.items())) for s, v in by.items()},
        "stage_slot_s": {s: sum(v.values()) for s, v in by.items()},
        "arm_slot_s": {a.name: sum(by[s][a.name] for s in STAGES) for a in study.arms},
        "total_slot_s": total, "gpu_hours": total / 3600.0,
        "unit": "GPU-hours" if table["device"] == "cuda" else "CPU-worker-hours",
        "wall_s": fanout_wall + timing_wall, "fanout_wall_s": fanout_wall, "timing_wall_s": timing_wall,
        "drivers": drivers(study),
        # how many workers the table says would fit per GPU (per node on CPU); the slots above are what runs
        "packing": table.get("packing"),
        "not_estimated": "job start-up (interpreter, Parsl pool), queueing and idle slot time",
    }


def drivers(study: StudySpec) -> dict[str, Any]:
    """The settings the cost scales with, as a budget refusal names them: the declared arms
    (the iso-compute controls follow from them and the calibration table, rule estimate's
    input; ``iso_compute`` says whether they are added)."""
    return {"prompts": sum(len(p.planned) for p in study.panels), "panels": len(study.panels),
            "seeds": {p.name: len(p.seeds) for p in study.panels},
            "arms": sorted(a.name for a in study.declared_arms),
            **({"iso_compute": True} if study.iso_compute else {}),
            "search_n": {a.name: a.search.n for a in study.arms if a.search is not None},
            "timing.repeats": study.timing.repeats, "timing.warmup": study.timing.warmup,
            "timing.pairs": study.timing.pairs}


def check_budget(study: StudySpec, est: dict[str, Any], source: str = "the study config") -> None:
    """Raise BudgetError when ``est`` exceeds ``fleet/budget_gpu_hours`` (no budget: no check)."""
    budget = study.fleet.budget_gpu_hours
    if budget is None or est["gpu_hours"] <= budget:
        return
    d = est["drivers"]
    big = max(est["stage_slot_s"].items(), key=lambda kv: kv[1])
    search = f" (search n {d['search_n']})" if d["search_n"] else ""
    raise BudgetError(
        f"study {study.study!r} is estimated at {est['gpu_hours']:.3f} {est['unit']} (wall {_clock(est['wall_s'])} "
        f"at {est['nodes']} node(s) x {est['slots_per_node']} slot(s)), over fleet/budget_gpu_hours = {budget} in "
        f"{source}. The cost scales with: {d['prompts']} prompts over {d['panels']} panel(s), seeds {d['seeds']}, "
        f"arms {d['arms']}{search}, timing.repeats "
        f"{d['timing.repeats']}, timing.pairs {d['timing.pairs']}; the largest stage is {big[0]} "
        f"({big[1] / 3600:.3f} h). Fewer prompts, seeds or arms, a timing.pairs sample or fewer timing.repeats "
        "lower it; or raise the budget. 'pairflow estimate' shows every figure")


def _clock(s: float) -> str:
    h, rest = divmod(int(math.ceil(s)), 3600)
    return f"{h}h{rest // 60:02d}m{rest % 60:02d}s"


def summary_lines(est: dict[str, Any], budget: float | None) -> list[str]:
    """The estimate as a few lines (``pairflow estimate``, the dry run's header)."""
    lines = [f"PairFlow estimate for study {est['study']!r} on {est['calibration']['device']} "
             f"({est['nodes']} node(s) x {est['slots_per_node']} slot(s), calibration {est['calibration']['key']}):"]
    for stage in STAGES:
        arms = ", ".join(f"{a} {v:.1f}" for a, v in est["slot_s"][stage].items())
        lines.append(f"  {stage:<8} {est['stage_slot_s'][stage]:10.1f} slot-s  ({arms})")
    lines.append(f"  total    {est['total_slot_s']:10.1f} slot-s = {est['gpu_hours']:.4f} {est['unit']}; "
                 f"wall {_clock(est['wall_s'])} (not counted: {est['not_estimated']})")
    if budget is not None:
        lines.append(f"  budget   {budget} {est['unit']}: {'within' if est['gpu_hours'] <= budget else 'EXCEEDED'}")
    return lines


def write_estimate(study: StudySpec, table_path: Path, out: Path, source: str = "the study config") -> dict[str, Any]:
    """Rule ``estimate``: the estimate from the table at ``table_path``, logged, checked
    against the budget (BudgetError, naming every figure, before any panel job starts),
    then written to ``out`` (JSON). The budget is not written: it changes no output, so a
    changed budget does not remake this file (planning checks it whenever the table exists)."""
    est = estimate(study, load_table(table_path))
    for line in summary_lines(est, study.fleet.budget_gpu_hours):
        log.info("%s", line)
    check_budget(study, est, source)
    write_text(Path(out), json.dumps(est, indent=1, sort_keys=True) + "\n")
    return est


def estimate_or_refuse(study: StudySpec, table_path: Path, out: Path, source: str = "the study config") -> int:
    """Rule ``estimate``'s step: ``write_estimate``, returning the job's exit status: 0, or
    3 over ``fleet/budget_gpu_hours``, the refusal logged as one line (``refused: ...``, in
    the rule's log) rather than raised: a refusal is no crash, so no traceback; the
    workflow then says it once and exits 3 (``common.smk``)."""
    try:
        write_estimate(study, table_path, out, source)
    except BudgetError as e:
        log.error("refused: %s", e)
        return 3
    return 0

"""A panel job's start-up, as a timeline: from the job's start to each slot's first task.

What the operator pays before any work: the job process starting (Snakemake's script,
its imports), the driver preparing (config, lock, contexts), Parsl's interchange and
worker pool starting, each worker process spawning, importing torch, diffusers,
transformers and pyiqa, and loading the model and the scorer models; then its first real task. Marks are
epoch seconds: the driver's come from ``mark`` (first time each is reached in this
process), a worker's from ``worker_marks`` plus what its warm-up task adds, carried back
in the warm-up span (``warm_up.marks``). ``timeline`` turns a job's telemetry record
into offsets from the job's start, so the ratio to a floor (a fresh ``python`` importing
torch, diffusers and pyiqa and loading the model) is read from the same record as the
busy share (``benchmarks/utilisation_local.py``).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from .telemetry import process_start, slot_key
from .workerpool import MANAGER_PID_VAR

MARKS: dict[str, float] = {}
"""This job process's start-up marks (epoch seconds), in the order first reached."""

DRIVER_MARKS = ("driver_imported", "driver_ready", "parsl_imported", "interchange_started", "pool_loaded",
                "tasks_prepared")
"""The driver's marks, in order: the rule script's imports done (``steps.study_for_rule``),
``run_tasks`` entered (config typed, lock held, panel swept, contexts and candidates
found), Parsl imported, the interchange process started, ``parsl.load`` returned, the
tasks prepared (``TaskHooks.start_early``: while the pool starts)."""

WORKER_MARKS = ("manager_started", "worker_started", "warm_up_started", "torch_diffusers_imported",
                "pipeline_imported", "model_loaded", "scorers_imported", "scorers_loaded")
"""A worker's marks, in order: its pool manager (``process_worker_pool``) started, the
worker process spawned, its warm-up task began (Parsl's worker imports, registration,
dispatch, unpickling the task done), torch and diffusers imported, the pipeline's lazily
imported modules (transformers, the model's classes) imported, the model loaded, pyiqa
and the scorers imported, the study's scorer models loaded on the slot's device (the
warm-up's end)."""


def mark(name: str, at: float | None = None, again: bool = False) -> None:
    """Record that this job process reached ``name`` now (or at ``at``); the first time
    counts, unless ``again`` (a pool's marks: a process that starts a second pool, or a
    test process, reports the pool it just started)."""
    if again or name not in MARKS:
        MARKS[name] = time.time() if at is None else at


def worker_marks() -> dict[str, float]:
    """The start of this worker's timeline: when its Parsl pool manager (the parent
    process) and the worker process itself started (``/proc``), and now (its warm-up
    task began). The warm-up adds when each phase ends."""
    # A forked worker's parent is the pool's fork server (workerpool): the manager names itself.
    manager = int(os.environ.get(MANAGER_PID_VAR) or os.getppid())
    return {"manager_started": process_start(manager), "worker_started": process_start(),
            "warm_up_started": time.time()}


def timeline(record: dict[str, Any]) -> dict[str, Any]:
    """A job's start-up from its telemetry record: each mark as seconds after the job's
    start (``record['job']['start']``; a worker mark is the median over the job's
    warm-ups), and per slot the start of its first real task (warm-ups and failed
    attempts are not tasks). ``first_task_s``: the first slot ready to work and working
    (the job's start-up); ``last_slot_s``: the last slot's. None where the record holds
    no such mark or task."""
    start = float(record["job"]["start"])
    driver = record.get("startup_marks") or {}
    offsets: dict[str, float | None] = {k: (driver[k] - start if k in driver else None) for k in DRIVER_MARKS}
    warm = [s["warm_up"]["marks"] for s in record.get("spans", [])
            if s.get("kind") == "warm-up" and isinstance((s.get("warm_up") or {}).get("marks"), dict)]
    for k in WORKER_MARKS:
        vals = [m[k] - start for m in warm if k in m]
        offsets[k] = statistics.median(vals) if vals else None
    first: dict[str, float] = {}
    for s in record.get("spans", []):
        if s.get("started") is None or s.get("kind") == "warm-up" or s.get("failure") or s.get("attempt"):
            continue
        k = slot_key(s)
        first[k] = min(first.get(k, s["started"]), s["started"])
    firsts = sorted(v - start for v in first.values())
    return {"marks": offsets, "first_task_s": firsts[0] if firsts else None,
            "last_slot_s": firsts[-1] if firsts else None, "slots": len(firsts), "warm_ups": len(warm)}

"""The ``slots`` section of ``benchmarks/run.py``. Parsl slots: busy share on a heterogeneous
workload, and no-op task throughput."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _sleep_task(payload: dict[str, Any]) -> dict[str, Any]:
    import time as _t

    _t.sleep(payload["s"])
    return {}


def bench_slots(runs: int, quick: bool = False) -> dict[str, Any]:
    """Share of slot time spent running tasks on a heterogeneous synthetic workload, and
    no-op task throughput, through the project's own fleet config and its telemetry."""
    from pairflow.fleet.pool import Grant, TaskHooks, noop, run_tasks
    from pairflow.fleet.telemetry import slot_key
    from pairflow.plan.config import FleetSpec

    requested = 4
    rng = np.random.default_rng(0)
    durations = rng.uniform(0.05, 1.0, 8 if quick else 240).round(3).tolist()
    run_dir = Path(tempfile.mkdtemp())
    run_tasks(_sleep_task, [{"s": d} for d in durations], run_dir, FleetSpec(requested, 0), Grant(), "slots",
              TaskHooks(run_dir / "tel.json"))
    t = json.loads((run_dir / "tel.json").read_text())
    spans = t["spans"]
    # Parsl caps workers at the cores it sees (cores_per_worker=1), so count the slots that
    # really ran tasks rather than trusting the request.
    slots = {slot_key(s) for s in spans}
    first, last = min(s["started"] for s in spans), max(s["finished"] for s in spans)
    busy = sum(s["finished"] - s["started"] for s in spans)
    per_slot_end: dict[str, float] = {}
    for s in spans:
        per_slot_end[slot_key(s)] = max(per_slot_end.get(slot_key(s), 0.0), s["finished"])
    n = 50 if quick else 2000
    tick = time.perf_counter()
    run_tasks(noop, [{}] * n, run_dir, FleetSpec(requested, 0), Grant(), "noop", TaskHooks(run_dir / "noop.json"))
    noop_wall = time.perf_counter() - tick
    noop = json.loads((run_dir / "noop.json").read_text())
    noop_first = min(s["started"] for s in noop["spans"])
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"slots_requested": requested, "slots": len(slots), "tasks": len(durations),
            "task_seconds": sum(durations), "busy_share_of_makespan": busy / (len(slots) * (last - first)),
            "busy_share_of_window": busy / (len(slots) * (t["window"]["end"] - t["window"]["start"])),
            "tail_idle_slot_s": sum(last - e for e in per_slot_end.values()),
            "startup_s": first - t["window"]["start"], "noop_tasks": n,
            "noop_tasks_per_s_incl_startup": n / noop_wall,
            "noop_tasks_per_s_after_startup": n / (noop["window"]["end"] - noop_first)}

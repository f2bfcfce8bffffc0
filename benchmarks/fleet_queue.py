"""The study-wide fleet job's driver at scale (``fleet.allocation: study``): can one
driver feed 16 nodes x 4 GPUs? Saved into benchmarks/fleet_queue.json.

No-op tasks (``fleet.noop``) go through the real driver path of ``stages/study``:
``fleet.run_tasks`` with its heartbeats, spans, progress lines and telemetry record, a
real HighThroughputExecutor with a few local CPU workers, and the driver's own queue fed
as tasks settle with the window a 64-slot allocation gets (``WINDOW_PER_SLOT`` x 64). A
no-op body leaves only the queue's own cost, so the figures are the driver's ceiling:

* tasks/s after the pool started, and the driver's CPU time per task after it (all
  its threads: Parsl's submit, result and strategy threads included; the driver
  saturates at 1 / that, whatever the number of workers);
* the driver's resident memory at every 10% of the tasks (it keeps one payload, result
  and span per task for the telemetry record) and at the end.

    python benchmarks/fleet_queue.py [TASKS] [WORKERS]     # default 100000 tasks, 2 workers
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from pairflow.fleet.pool import Grant, Task, noop, run_tasks
from pairflow.plan.config import FleetSpec
from pairflow.stages.study import WINDOW_PER_SLOT

ROOT = Path(__file__).resolve().parents[1]
SLOTS_16X4 = 16 * 4


def rss_mb() -> float:
    """This process's resident set now, in MiB (Linux ``/proc``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise OSError("no VmRSS line in /proc/self/status")


def measure(tasks: int, workers: int) -> dict[str, Any]:
    window = WINDOW_PER_SLOT * SLOTS_16X4
    queue: deque[Task] = deque((noop, {"n": i}) for i in range(tasks))
    state = {"in_flight": 0, "settled": 0, "first": 0.0, "first_cpu": 0.0}
    samples: list[tuple[int, float]] = [(0, rss_mb())]

    def refill() -> list[Task]:
        out = []
        while state["in_flight"] < window and queue:
            out.append(queue.popleft())
            state["in_flight"] += 1
        return out

    def settle(payload: dict[str, Any], result: dict[str, Any] | None = None) -> list[Task]:
        state["in_flight"] -= 1
        state["settled"] += 1
        if not state["first"]:
            state["first"], state["first_cpu"] = time.perf_counter(), time.process_time()
        if state["settled"] % max(1, tasks // 10) == 0:
            samples.append((int(state["settled"]), rss_mb()))
        return refill()

    fleet = FleetSpec(cpu_workers=workers, retries=0, idle_timeout_s=600, nvml_interval_s=3600,
                      stall_timeout_s=600, startup_timeout_s=600)
    with tempfile.TemporaryDirectory(prefix="pairflow-fleet-queue-") as tmp:
        cpu0, t0 = time.process_time(), time.perf_counter()
        out = run_tasks(noop, refill, Path(tmp) / "run", fleet, Grant(), "fleet-queue",
                        Path(tmp) / "telemetry.json", follow=settle, settle_failed=settle, start_early=True)
        t1, cpu1 = time.perf_counter(), time.process_time()
        telemetry_mb = (Path(tmp) / "telemetry.json").stat().st_size / 2**20
    if len(out) != tasks:
        raise SystemExit(f"fleet_queue: {len(out)} of {tasks} tasks returned")
    after = t1 - state["first"]
    return {"tasks": tasks, "workers": workers, "window": window, "wall_s": t1 - t0,
            "startup_s": state["first"] - t0, "tasks_per_s": (tasks - 1) / after if after else None,
            "driver_cpu_s": cpu1 - cpu0,
            # after the pool started: what each further task costs the driver (all its threads)
            "driver_cpu_ms_per_task": 1000 * (cpu1 - state["first_cpu"]) / max(tasks - 1, 1),
            "rss_mb": samples + [(tasks, rss_mb())], "telemetry_mb": telemetry_mb}


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    r = measure(tasks, workers)
    (ROOT / "benchmarks" / "fleet_queue.json").write_text(json.dumps(r, indent=1, sort_keys=True) + "\n")
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()

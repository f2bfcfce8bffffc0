"""The honest busy share of a finished study's panel jobs and their start-up against a
floor measured now (issue 25 item 3), saved into benchmarks/results.json (``utilisation_local``);
BENCHMARKS.md's section on it is written by hand from those runs (several runs compared side by side).

The floor is a fresh ``python`` importing torch, diffusers and pyiqa and loading the
study's model (the least any panel job must spend before its first task), timed from
before the interpreter starts to the model loaded (not to the process's exit), three
times (the median counts). A
panel job's start-up is from its process's start (``/proc``) to the first real task
starting on a slot (so a worker's imports and model load are in it), read with the
phases between from the job's telemetry record (``pairflow.fleet.startup.timeline``). Run it
right after the panel jobs, on the same machine, so both see the same load:

    snakemake --profile profiles/local && python benchmarks/utilisation_local.py [--label L] [SCRATCH]

or, to measure the panel jobs again without the rest of the study:

    rm -rf results/scratch/panels && snakemake --profile profiles/local --until generate_score_panel \\
        && python benchmarks/utilisation_local.py --label L

Each run is appended to ``runs`` (the last ``KEEP``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pairflow.fleet.startup import DRIVER_MARKS, WORKER_MARKS, timeline
from pairflow.fleet.telemetry import utilisation

ROOT = Path(__file__).resolve().parents[1]
KEEP = 6

FLOOR = """
import time, sys
t0 = float(sys.argv[2])
t = time.time()
import torch, diffusers, pyiqa
from pairflow.plan.config import ModelSpec
from pairflow.generation.generate import load_pipeline, pipeline_imports
from pathlib import Path
m = ModelSpec('embedded-tiny', Path(sys.argv[1]))
pipeline_imports(m)
t1 = time.time()
load_pipeline(m, 'float32', 1)
t2 = time.time()
print(t - t0, t1 - t, t2 - t1)
"""


def floor(model: Path) -> dict[str, float]:
    """One fresh process: interpreter start, imports (torch, diffusers, pyiqa, the
    pipeline's lazy modules), model load; seconds each, ``floor_s`` from before the
    process starts to the model loaded (its exit, 1.8-2.3 s of teardown here, is not
    start-up: counting it would flatter the ratio) and ``total_s`` with the exit."""
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", FLOOR, str(model), repr(t0)], check=True, capture_output=True,
                         text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    total = time.time() - t0
    interp, imports, load = (float(x) for x in out.stdout.split()[-3:])
    return {"floor_s": interp + imports + load, "total_s": total, "interpreter_s": interp, "import_s": imports,
            "load_s": load}


PHASES = (("driver_imported", "rule script's imports (Snakemake's job object, pairflow)"),
          ("driver_ready", "driver prepares (config, lock, contexts, packing)"),
          ("parsl_imported", "driver imports Parsl"),
          ("manager_started", "pool manager process starts (its block is launched as the interchange starts: "
                              "`fleet.executor`)"),
          ("pool_loaded", "`parsl.load` returns: the interchange process has started and bound"),
          ("worker_started", "worker process starts (spawn: after the manager's Parsl import and Manager server; "
                             "forkserver: forked once the fork server's imports are done)"),
          ("warm_up_started", "worker registers, gets and unpickles its warm-up (spawn: after importing Parsl)"),
          ("torch_diffusers_imported", "worker imports torch and diffusers"),
          ("pipeline_imported", "worker imports the pipeline's modules (transformers, ...)"),
          ("model_loaded", "worker loads the model"),
          ("scorers_imported", "worker imports pyiqa and the scorers"),
          ("scorers_loaded", "worker imports the study's metric modules and loads their models"))
"""The start-up phases in order (``pairflow.fleet.startup`` marks), each ending at its mark."""


def startup_rows(runs: list[dict]) -> list[str]:
    """Each phase's end, seconds after the job's start (median over the run's panel jobs)."""
    def at(run: dict, k: str) -> float | None:
        vals = [v for v in (j["timeline"]["marks"].get(k) for j in run["jobs"]) if v is not None]
        return statistics.median(vals) if vals else None

    def cell(v: float | None) -> str:
        return "" if v is None else f"{v:.1f}"

    lines = ["| phase ends (s after job start; a worker's phases: median over its job's workers; each: median "
             "over the run's panel jobs) | "
             + " | ".join(f"{r.get('label') or ''} ({r['when'][11:16]} UTC)" for r in runs) + " |",
             "|---|" + "---|" * len(runs)]
    for k, what in PHASES:
        lines.append(f"| {what} | " + " | ".join(cell(at(r, k)) for r in runs) + " |")
    for key, what in (("startup_s", "**first task on a slot (start-up)**"), ("last_slot_s", "last slot's first task")):
        lines.append(f"| {what} | " + " | ".join(cell(r["floor"].get(key)) for r in runs) + " |")
    lines.append("| floor: fresh python to the model loaded | " + " | ".join(cell(r["floor"]["floor_s"]) for r in runs)
                 + " |")
    lines.append("| **ratio** (first slot; last slot) | " + " | ".join(
        f"**{r['floor']['ratio']:.2f}x**; {r['floor']['last_slot_ratio']:.2f}x" if r["floor"].get("ratio") else ""
        for r in runs) + " |")
    lines.append("| study busy share | " + " | ".join(f"{r['study']['busy_share']:.1%}" for r in runs) + " |")
    lines.append("| load average (1 min), before; after | " + " | ".join("; ".join(r["load_1min"]) for r in runs)
                 + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scratch", nargs="?", type=Path, default=ROOT / "results" / "scratch")
    ap.add_argument("--label", default="", help="what this run measures (e.g. the commit's change)")
    ap.add_argument("--table", action="store_true", help="print the kept runs' start-up phase table (markdown, "
                    "for BENCHMARKS.md) and measure nothing")
    args = ap.parse_args()
    if args.table:
        runs = json.loads((ROOT / "benchmarks" / "results.json").read_text())["utilisation_local"]["runs"]
        print("\n".join(startup_rows(runs)))
        return
    load_before = Path("/proc/loadavg").read_text().split()[0]
    records = {f"{p.parent.parent.name}/{p.stem}": json.loads(p.read_text())
               for p in sorted(args.scratch.glob("panels/*/telemetry/*.json"))}
    records = {k: r for k, r in records.items() if r.get("job")}
    floors = [floor(ROOT / "resources" / "tiny-wan") for _ in range(3)]
    fl = statistics.median(f["floor_s"] for f in floors)
    u = utilisation(records)
    jobs = []
    for name, r in records.items():
        j, tl = r["job"], timeline(r)
        jobs.append({"job": name, "job_s": j["job_s"], "work_s": j["work_s"], "startup_s": j["startup_s"],
                     "warmup_s": j["warmup_s"], "idle_s": j["idle_s"], "failed_s": j["failed_s"],
                     "busy_share": j["busy_share"], "workers": (r.get("packing") or {}).get("workers_per_node"),
                     "timeline": tl})
    firsts = [j["timeline"]["first_task_s"] for j in jobs if j["timeline"]["first_task_s"] is not None]
    lasts = [j["timeline"]["last_slot_s"] for j in jobs if j["timeline"]["last_slot_s"] is not None]
    run = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "label": args.label,
           "load_1min": [load_before, Path("/proc/loadavg").read_text().split()[0]],
           "study": {k: u[k] for k in ("busy_share", "window_busy_share", "work_s", "startup_s", "warmup_s",
                                       "idle_s", "failed_s", "slot_s")},
           "jobs": jobs, "floor": {"floor_s": fl, "runs": floors}}
    if firsts:
        med = statistics.median(firsts)
        run["floor"].update({"startup_s": med, "startups_s": firsts, "ratio": med / fl,
                             "last_slot_s": statistics.median(lasts), "last_slot_ratio": statistics.median(lasts) / fl})
    path = ROOT / "benchmarks" / "results.json"
    results = json.loads(path.read_text())
    old = results.get("utilisation_local") or {}
    runs = [*old.get("runs", []), run][-KEEP:]
    results["utilisation_local"] = {**old, "runs": runs, "marks": [*DRIVER_MARKS, *WORKER_MARKS]}
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(json.dumps(run, indent=1))


if __name__ == "__main__":
    main()

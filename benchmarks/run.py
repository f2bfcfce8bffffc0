"""PairFlow benchmark suite. One command: ``.venv/bin/python benchmarks/run.py``; one
section: ``.venv/bin/python benchmarks/run.py metrics`` (others keep their last figures).

Writes ``benchmarks/results.json`` with the machine, versions and commit. Timings are
medians over several runs; every ratio is measured side by side in one run. Sections:
encode/decode (writer vs bare ffmpeg), hashing (xxh3 vs sha256), planning at 31,000
candidates, model loads (once per worker vs per candidate), Parsl slot busy share and
no-op task rate, metric throughput, the default study's time by stage, (``stats``) the
coverage and false-positive rate of the statistics at 3 to 30 prompts, (``power``) the power
the sample-size plans deliver at the N they state, and (``archive``,
in ``archive_bench.py``) packed against plain archive snapshots at 31,000 and 100,000
candidates, and (``cost``) the CPU a candidate costs the whole study against the floor of
its own work in one warm process.

Each section is one module of ``benchmarks/sections/`` (``hash`` is ``hashing.py``; what
they share is in ``common.py``); this file is the one command that runs them.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sections package, also when imported as `run`

from sections.archive import bench_archive
from sections.common import ROOT, machine
from sections.compute import bench_compute
from sections.cost import bench_cost
from sections.e2e import bench_e2e
from sections.hashing import bench_hash
from sections.loads import bench_loads
from sections.metrics import bench_metrics
from sections.payload import bench_payload
from sections.plan import bench_plan
from sections.power import bench_power
from sections.records import bench_records
from sections.slots import bench_slots
from sections.slurm import bench_slurm
from sections.slurm_study import bench_slurm_study
from sections.stats import bench_stats
from sections.video import bench_video

__all__ = ["ROOT", "SECTIONS", "main"]


SECTIONS = {"video": bench_video, "hash": bench_hash, "plan": bench_plan, "payload": bench_payload,
            "records": bench_records, "loads": bench_loads, "compute": bench_compute,
            "slots": bench_slots, "metrics": bench_metrics,
            "slurm": bench_slurm, "slurm_study": bench_slurm_study, "stats": bench_stats, "power": bench_power,
            "e2e": bench_e2e,
            "archive": bench_archive, "cost": bench_cost}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("sections", nargs="*", default=list(SECTIONS), help=f"any of {', '.join(SECTIONS)}")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, one run: checks every section still runs (the test suite does this)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results.json")
    ap.add_argument("--mirror", type=Path, default=None,
                    help="weight mirror for the metrics section (default: a random-init test mirror)")
    ap.add_argument("--scratch", type=Path, default=None,
                    help="the study run the e2e section reads (default: results/scratch)")
    ap.add_argument("--key", default=None,
                    help="with one section: where its figures go in the results instead of its name, to render "
                         "side by side (e2e_per_stage: a run with fleet.panel_jobs: per-stage; e2e_before, "
                         "slurm_study_before: an earlier commit's runs)")
    ap.add_argument("--note", default="", help="cost: a note kept with this run in the section's table of runs "
                                               "(e.g. provisional, shared machine)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section(s) {unknown}; sections: {', '.join(SECTIONS)}")
    if args.key and len(args.sections) != 1:
        ap.error("--key names where one section's figures go: give exactly one section")
    import torch

    torch.set_num_threads(1)
    runs = 1 if args.quick else args.runs
    # Sections not rerun keep their last figures (rerun everything for a new machine).
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update({"machine": machine(), "runs": runs, "quick": args.quick})
    for name in args.sections:
        t = time.perf_counter()
        section, name = name, args.key or name
        if section == "e2e":
            results[name] = bench_e2e(runs, args.quick, args.scratch)
        elif section == "cost":  # keeps its earlier runs for the table of runs
            results[name] = bench_cost(runs, args.quick, history=(results.get(name) or {}).get("history", []),
                                       note=args.note)
        elif section == "metrics":
            results[name] = bench_metrics(runs, args.quick, args.mirror)
        else:
            results[name] = SECTIONS[section](runs if section != "plan" else min(runs, 3), args.quick)
        results[name]["section_s"] = time.perf_counter() - t
        print(f"{name}: {time.perf_counter() - t:.1f}s {json.dumps(results[name])[:400]}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} (peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")
    for name in args.sections:  # a section's one-line summary, last (cost: marginal/floor R fixed S CPU-s)
        if results[args.key or name].get("line"):
            print(results[args.key or name]["line"])


if __name__ == "__main__":
    main()

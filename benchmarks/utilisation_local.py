"""The honest busy share of a finished study and its panel jobs' start-up against a floor
measured now (issue 25 item 3), saved into benchmarks/results.json for render.py.

The floor is a fresh ``python`` importing torch, diffusers and pyiqa and loading the
study's model (the least any panel job must spend before its first task). Run it right
after the study, on the same machine, so both see the same load:

    snakemake --profile profiles/local && python benchmarks/utilisation_local.py [SCRATCH]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOOR = """
import time, sys
t = time.perf_counter()
import torch, diffusers, pyiqa
from pairflow.config import ModelSpec
from pairflow.generate import load_pipeline, pipeline_imports
from pathlib import Path
m = ModelSpec('embedded-tiny', Path(sys.argv[1]))
pipeline_imports(m)
load_pipeline(m, 'float32', 1)
print(time.perf_counter() - t)
"""


def main() -> None:
    scratch = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results" / "scratch"
    u = json.loads((scratch / "study" / "utilisation.json").read_text())
    tick = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR, str(ROOT / "resources" / "tiny-wan")], check=True,
                   capture_output=True, text=True)
    floor = time.perf_counter() - tick  # the whole fresh process: interpreter start included
    jobs, startups = [], []
    for p in sorted(scratch.glob("panels/*/telemetry/*.json")):
        t = json.loads(p.read_text())
        j = t.get("job")
        if not j:
            continue
        tasks = [s["started"] for s in t["spans"] if s.get("started") is not None and s.get("kind") != "warm-up"]
        if tasks:
            startups.append(min(tasks) - j["start"])
        jobs.append({"job": f"{p.parent.parent.name}/{p.stem}", "job_s": j["job_s"], "work_s": j["work_s"],
                     "startup_s": j["startup_s"], "warmup_s": j["warmup_s"], "idle_s": j["idle_s"],
                     "failed_s": j["failed_s"], "busy_share": j["busy_share"]})
    out = {"how": (f"`snakemake --profile profiles/local` on the default study, then "
                   f"`benchmarks/utilisation_local.py` ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}). "
                   f"Study busy share (task work over whole-job slot time): **{u['busy_share']:.1%}** of "
                   f"{u['slot_s']:.0f} slot-seconds; the Parsl-window share with warm-up counted busy, as reported "
                   f"before: {u['window_busy_share']:.1%}. Per panel job (slot-seconds):"),
           "jobs": jobs, "study": {k: u[k] for k in ("busy_share", "window_busy_share", "work_s", "startup_s",
                                                       "warmup_s", "idle_s", "failed_s", "slot_s")}}
    if startups:
        med = statistics.median(startups)
        out["floor"] = {"floor_s": floor, "startup_s": med, "startups_s": startups, "ratio": med / floor}
    path = ROOT / "benchmarks" / "results.json"
    results = json.loads(path.read_text())
    results["utilisation_local"] = out
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

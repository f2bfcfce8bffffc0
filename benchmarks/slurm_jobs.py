"""What a finished Slurm run of the study spent around its work (issues 25 and 27), read
from the project it ran in, within ``MinJobAge`` of its first job's end (the CI cluster
keeps finished jobs an hour): run it right after ``snakemake --profile profiles/slurm``.

    python benchmarks/slurm_jobs.py PROJECT [LABEL]

For every panel job (a telemetry record naming a Slurm allocation) it prints one JSON
line per job and a Markdown table, from three sources:

- Slurm (``scontrol show job``): submit, start and end of the allocation;
- the job's telemetry: when the rule's Python process started (``job.start`` where
  Slurm < 23.02 sets no ``SLURM_JOB_START_TIME``), each span (warm-up tasks marked);
- Snakemake's log: when it reported the job finished.

Start-up is split into queue (submit to allocation start), Snakemake inside the job
(allocation start to the rule's Python process), pool start and warm-up (that process to
the first task's start); *notice lag* is the allocation's end to Snakemake's "Finished".
The busy share is the honest one (``telemetry.honest_share``: task work, warm-up and
failed tasks excluded, over every slot for the whole allocation, start to end).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from pairflow.fleet.telemetry import honest_share

SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
FINISHED = re.compile(r"Finished jobid: (\d+)")


def slurm_times(job_id: str) -> dict[str, float]:
    """Submit, start and end of a Slurm job (epoch s; Slurm prints local time)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    fields = dict(t.split("=", 1) for t in out.split() if "=" in t)
    return {k: time.mktime(time.strptime(fields[f"{k.title()}Time"], "%Y-%m-%dT%H:%M:%S"))
            for k in ("submit", "start", "end")}


def finished_at(log: str) -> dict[str, float]:
    """Slurm job id → when Snakemake's log reported its Snakemake job finished."""
    slurm_of, when, stamp = {}, {}, None
    for line in log.splitlines():
        if m := SUBMITTED.search(line):
            slurm_of[m[1]] = m[2]
        if m := STAMP.match(line):
            stamp = time.mktime(time.strptime(m[1], "%a %b %d %H:%M:%S %Y"))
        if (m := FINISHED.search(line)) and stamp is not None and m[1] in slurm_of:
            when[slurm_of[m[1]]] = stamp
    return when


def job_figures(tel: dict, slurm: dict[str, float], finished: float | None) -> dict:
    spans = tel["spans"]
    tasks = [s["started"] for s in spans if s.get("started") is not None and s.get("kind") != "warm-up"]
    first = min(tasks)
    share = honest_share(spans, (slurm["start"], slurm["end"]), [])
    return {"slurm_job": tel["allocation"]["job_id"], "nodes": tel["allocation"]["nodes"],
            "queue_s": slurm["start"] - slurm["submit"],
            "snakemake_in_job_s": tel["job"]["start"] - slurm["start"],
            "pool_and_warmup_s": first - tel["job"]["start"],
            "start_to_first_task_s": first - slurm["start"],
            "submit_to_first_task_s": first - slurm["submit"],
            "notice_lag_s": None if finished is None else finished - slurm["end"],
            "allocation_s": slurm["end"] - slurm["start"], "slots": share["slots"],
            "work_s": share["work_s"], "warmup_s": share["warmup_s"], "failed_s": share["failed_s"],
            "busy_share": share["busy_share"]}


def main() -> None:
    project = Path(sys.argv[1])
    label = sys.argv[2] if len(sys.argv) > 2 else project.name
    logs = sorted((project / ".snakemake/log").glob("*.snakemake.log"))
    extra = project / "snakemake.log"  # the test's copy of stdout and stderr
    text = "\n".join(p.read_text() for p in logs) + (extra.read_text() if extra.exists() else "")
    finished = finished_at(text)
    rows = []
    for p in sorted(project.glob("results/scratch/panels/*/telemetry/*.json")):
        tel = json.loads(p.read_text())
        job = (tel.get("allocation") or {}).get("job_id")
        if not job or not tel.get("job"):
            continue
        row = {"job": f"{p.parent.parent.name}/{p.stem}", **job_figures(tel, slurm_times(job), finished.get(job))}
        print(json.dumps(row, sort_keys=True))
        rows.append(row)
    slot_s = sum(r["allocation_s"] * r["slots"] for r in rows)
    work = sum(r["work_s"] for r in rows)
    print(f"\n{label}: busy share over whole allocations {work / slot_s:.1%} ({work:.0f} of {slot_s:.0f} "
          "slot-seconds)\n")
    print("| job | nodes x slots | queue s | Snakemake in job s | pool + warm-up s | allocation start to first "
          "task s | notice lag s | allocation s | busy share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lag = "n/a" if r["notice_lag_s"] is None else f"{r['notice_lag_s']:.0f}"
        print(f"| {r['job']} | {r['nodes']} x {r['slots'] // max(r['nodes'], 1)} | {r['queue_s']:.0f} | "
              f"{r['snakemake_in_job_s']:.1f} | {r['pool_and_warmup_s']:.1f} | {r['start_to_first_task_s']:.1f} | "
              f"{lag} | {r['allocation_s']:.0f} | {r['busy_share']:.1%} |")


if __name__ == "__main__":
    main()

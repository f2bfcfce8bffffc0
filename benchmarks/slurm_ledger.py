"""The ledger against the scheduler (issue 38), per job, read from a project right after
``snakemake --profile profiles/slurm`` ran in it (within ``MinJobAge``: the CI cluster
keeps finished jobs an hour).

    python benchmarks/slurm_ledger.py PROJECT

For every Slurm job Snakemake's log says it submitted, Slurm's own figures are read here
with ``scontrol show job -d`` (independently of the ledger's reader,
``fleet.sites.slurmacct``): the GPUs the job held (``JOB_GRES``, every node's; Slurm
22.05 without gres/gpu in AccountingStorageTRES shows them nowhere else), its start and
end; the GPU-seconds it held are their product. Beside them: the ledger's entry for that
job (``study/ledger.json``), and the ratio. Local jobs (Snakemake's localrules) are listed
with the core-seconds the ledger gives them. Prints one JSON line per job, then a
Markdown table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")


def slurm_held(job: str) -> dict[str, float]:
    """GPUs, start, end (epoch s; Slurm prints local time) and GPU-seconds of Slurm job ``job``."""
    out = subprocess.run(["scontrol", "show", "job", "-d", "-o", job], check=True, capture_output=True, text=True,
                         timeout=30).stdout
    fields = dict(t.split("=", 1) for t in out.split() if "=" in t)
    gres = fields.get("JOB_GRES", "(null)")
    gpus = int(gres.rsplit(":", 1)[1]) if gres.startswith("gpu") else 0
    start, end = (time.mktime(time.strptime(fields[k], "%Y-%m-%dT%H:%M:%S")) for k in ("StartTime", "EndTime"))
    return {"gpus": gpus, "start": start, "end": end, "gpu_s": gpus * (end - start)}


def compare(project: Path) -> list[dict[str, Any]]:
    """One row per job of the run: Slurm's figures (Slurm jobs) beside the ledger's."""
    log = (project / "snakemake.log").read_text()
    submitted = {m[2] for m in SUBMITTED.finditer(log)}
    ledger = json.loads((project / "results/scratch/study/ledger.json").read_text())
    rows = []
    for entry in sorted(ledger["jobs"].values(), key=lambda j: j["held"]["start"]):
        job = entry.get("slurm_job")
        if job and job not in submitted:
            continue  # an earlier run's (a copied project keeps its ledger)
        row: dict[str, Any] = {"job": entry["job"], "status": entry["status"], "slurm_job": job,
                               "ledger_gpus": entry["held"]["gpus"], "ledger_gpu_s": entry["held"]["gpu_s"],
                               "ledger_slot_s": entry["held"]["slot_s"], "busy_share": entry.get("busy_share")}
        if job:
            ref = slurm_held(job)
            row.update(slurm_gpus=ref["gpus"], slurm_gpu_s=ref["gpu_s"],
                       ratio=entry["held"]["gpu_s"] / ref["gpu_s"] if ref["gpu_s"] else None)
        rows.append(row)
    missing = submitted - {r["slurm_job"] for r in rows}
    for job in sorted(missing):
        rows.append({"job": "(missing from the ledger)", "slurm_job": job, **slurm_held(job)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| job | status | Slurm job | Slurm GPUs | Slurm GPU-s | ledger GPUs | ledger GPU-s | ledger / Slurm "
             "| ledger slot-s | busy |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio, busy = r.get("ratio"), r.get("busy_share")
        lines.append(f"| {r['job']} | {r.get('status', '')} | {r.get('slurm_job') or 'local'} "
                     f"| {r.get('slurm_gpus', '')} | {r.get('slurm_gpu_s', 0.0):.1f} | {r.get('ledger_gpus', '')} "
                     f"| {r.get('ledger_gpu_s', 0.0):.1f} | {'' if ratio is None else f'{ratio:.3f}'} "
                     f"| {r.get('ledger_slot_s', 0.0):.1f} | {'' if busy is None else f'{busy:.1%}'} |")
    return "\n".join(lines) + "\n"


def main(project: Path) -> list[dict[str, Any]]:
    rows = compare(project)
    for r in rows:
        print(json.dumps(r, sort_keys=True))
    print(markdown(rows))
    return rows


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd())

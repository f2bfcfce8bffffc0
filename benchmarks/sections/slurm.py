"""The ``slurm`` section of ``benchmarks/run.py``. Slurm: per-task overhead inside an
allocation (needs a cluster)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import (
    no_cluster,
)


def bench_slurm(runs: int, quick: bool = False) -> dict[str, Any]:
    """Per-task overhead inside a Slurm allocation: ``pairflow probe-slots`` in an sbatch
    job granted two GPUs (srun starts the pool; one worker per GPU). Needs a cluster
    (``bash .ci/slurm-up``)."""
    if (why := no_cluster()) is not None:
        return {"skipped": why}
    out_dir = Path(tempfile.mkdtemp())
    out = out_dir / "probe.json"
    n = 50 if quick else 2000
    cmd = f"{Path(sys.executable).with_name('pairflow')} probe-slots --tasks {n} --out {out}"
    subprocess.run(["sbatch", "--wait", "--quiet", "--gres=gpu:2", "--cpus-per-task=2", "--time=10",
                    f"--output={out_dir / 'probe.log'}", "--wrap", cmd], check=True, timeout=900)
    t = json.loads(out.read_text())
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"slots": sorted(t["slots"]), "launcher": "SrunLauncher (srun --overlap)", **t["probe"],
            "allocation": t["allocation"]}

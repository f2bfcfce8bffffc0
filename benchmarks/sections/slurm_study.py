"""The ``slurm_study`` section of ``benchmarks/run.py``. The default study through
profiles/slurm (needs a cluster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import (
    ROOT,
    no_cluster,
)


def bench_slurm_study(runs: int, quick: bool = False) -> dict[str, Any]:
    """The default study through ``snakemake --profile profiles/slurm`` (the shipped
    profile, unchanged) in a fresh project copy: wall time and the slot busy share its
    utilisation report computes from per-task spans. Needs a cluster (``.ci/slurm-up``)."""
    if (why := no_cluster()) is not None:
        return {"skipped": why}
    if quick:  # measured: 147 s at 6 candidates on the CI VM, almost all of it per-job start-up
        return {"skipped": "quick: a study through Slurm takes minutes at any size (job start-up dominates); "
                           "tests/test_slurm.py runs this study through profiles/slurm in CI"}
    project = Path(tempfile.mkdtemp()) / "project"
    project.mkdir()
    for name in ("Snakefile", "workflow", "envs", "profiles", "config"):
        src = ROOT / name
        (shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy(src, project / name))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    tick = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--profile", "profiles/slurm"], cwd=project,
                   env=env, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - tick
    u = json.loads((project / "results/scratch/study/utilisation.json").read_text())
    shutil.rmtree(project.parent, ignore_errors=True)
    return {"wall_s": wall, "busy_share": u["busy_share"], "allocated_slot_s": u["allocated_slot_s"],
            "jobs": {j["job"]: {"window_s": j["window_s"], "tasks": j["tasks"],
                                "slots": {k: v["share"] for k, v in j["slots"].items()}} for j in u["jobs"]}}

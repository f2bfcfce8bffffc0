"""Calibration on the kind of device the panel jobs run on, on a real Slurm (``bash
.ci/slurm-up``: pf-node1 and pf-node2, two fake GPUs each, torch without CUDA behind them).

Rule calibrate runs as a Slurm job on the panel jobs' partition (``profiles/slurm``: ``gpu:
1``) and measures the table there; the panel job, granted a GPU slot whose torch sees no
CUDA, computes on the CPU like the calibrate job's worker did, and packs from that table.
Skipped where ``sinfo`` gets no answer, unless ``PAIRFLOW_REQUIRE_SLURM=1`` (``.ci/run``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_project, slurm_env, small_config, write_config

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent



def test_the_panel_job_packs_from_the_table_the_calibrate_job_measured(slurm, tiny_model: Path,
                                                                       tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    # fleet.site slurm: the preparing job (check_arms, on this machine) leaves the table to
    # rule calibrate, as it would under site auto after measuring one of its own (then not
    # copied: made on another host); this saves that measurement here.
    cfg = small_config(project, tiny_model, fleet={"calibrate": True, "site": "slurm", "cpu_workers": 2,
                                                   "retries": 1})
    write_config(project, cfg)
    env = slurm_env()
    scratch = project / "results" / "scratch"
    target = scratch / "panels" / "t" / "generation.json"  # one panel job: calibrate, estimate, that job
    run = subprocess.run([str(BIN / "snakemake"), str(target.relative_to(project)), "--profile", "profiles/slurm",
                          "--configfile", "config/config.yaml"], cwd=project, env=env, capture_output=True, text=True,
                         timeout=900)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-6000:]
    assert "rule calibrate:" in text and "rule generate_score_panel:" in text and "rule timed_pass:" not in text
    [path] = (scratch / "calibration").glob("*.json")
    table = json.loads(path.read_text())
    # measured by the calibrate job's fresh worker on a cluster node, on what its GPU slot computes on
    assert table["measured_in"] == "fresh worker" and table["made"]["host"] in ("pf-node1", "pf-node2")
    assert table["device"] == "cpu" and "device" not in table["keyed_by"]
    [tel] = (scratch / "panels" / "t" / "telemetry").glob("*.json")
    packed = json.loads(tel.read_text())["packing"]
    assert packed["source"] == f"calibration {table['key']}", packed
    assert packed["device"] == "cpu" and packed["measured_in"] == "fresh worker"
    # one granted slot without CUDA: the node's CPU workers from the table, capped by fleet.cpu_workers
    assert packed["workers_per_gpu"] == min(int(table["packing"]["combined"]["workers"]), 2), packed
    assert "packing:" not in (scratch / "logs" / "generate-score" / "t.log").read_text()  # no fallback warning

"""The ``plan`` section of ``benchmarks/run.py``. Planning large studies: dry run and no-op
rerun at 31,000 and 100,006 candidates."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from pairflow.budget.calibrate import FORMAT

from .common import (
    scale_project,
    timed_cmd,
    write_evidence,
)

PLAN_SIZES = {"31k": 500, "100k": 1613}
"""Panels of 31 prompts x 1 seed x 2 arms: 31,000 and 100,006 candidates."""


def _slurm_probe_s() -> float | None:
    """Seconds ``scontrol show config`` takes here, or None without Slurm's client. The
    Slurm executor plugin runs it when Snakemake imports its plugins, in every Snakemake
    process whatever the executor; where a Slurm client is installed but no controller
    answers, it waits about 10 s (a fixed cost of every invocation, not of planning)."""
    if shutil.which("scontrol") is None:
        return None
    t = time.perf_counter()
    try:
        subprocess.run(["scontrol", "show", "config"], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return time.perf_counter() - t


def _finish(proj: Path, snake: str) -> tuple[list[str], int, float]:
    """Give the project a finished study: valid evidence (``write_evidence``), then every
    other output Snakemake lists for it (``--summary``, so the list cannot fall behind the
    rules) as a placeholder, all outputs with one mtime later than every source (sheets,
    config, model). That is what Snakemake's up-to-date check reads (no input newer than
    its output; jobs without metadata records have no params/code triggers to fire), as
    ``--touch`` would leave it, at a fraction of the cost. Returns the outputs, the
    evidence files written and the seconds spent."""
    _, _, summary = timed_cmd([snake, "--summary", "--cores", "2", "all"], proj)
    tick = time.perf_counter()
    files = write_evidence(proj)
    outs = [line.split("\t", 1)[0] for line in summary.splitlines()[1:] if "\t" in line]
    for rel in outs:
        path = proj / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # The calibration table is read while planning (the estimate, the budget
            # guard): a synthetic one of the right format, with a figure per arm.
            path.write_text(json.dumps(_calibration_table(proj)) if path.parent.name == "calibration" else "{}")
    done = time.time() + 1  # after every source, also on filesystems with coarse mtimes
    for rel in outs:
        os.utime(proj / rel, (done, done))
    return outs, files, time.perf_counter() - tick


def _calibration_table(proj: Path) -> dict[str, Any]:
    """A calibration table in ``calibrate``'s format for the scale project's arms (1 s
    phases): what planning reads of it, not a measurement."""
    phase = {"s": 1.0, "peak_rss_mb": 100.0, "peak_device_mb": None}
    arms = yaml.safe_load((proj / "config" / "config.yaml").read_text())["arms"]
    return {"kind": "calibration", "format": FORMAT, "key": "synthetic", "device": "cpu", "import": phase,
            "arms": {a: {"generate_s": 1.0, "score_s": 1.0, "timed_s": 1.0,
                         "phases": {"load": phase, "encode": phase}} for a in arms}}


def _plan_point(panels: int, prompts: int, runs: int) -> dict[str, Any]:
    """Dry run and no-op rerun of a study of ``panels`` x ``prompts`` x 1 seed x 2 arms:
    the dry run over an empty tree, the no-op rerun over one whose every output exists."""
    proj = scale_project(panels, prompts)
    snake = str(Path(sys.executable).with_name("snakemake"))
    probe = _slurm_probe_s()
    dry = [timed_cmd([snake, "-n", "--cores", "2", "--quiet", "all"], proj) for _ in range(runs)]
    n = panels * prompts * 2
    point: dict[str, Any] = {
        # One job per panel (fleet.panel_jobs: combined, the default config's) and seven
        # study-level ones: build_tiny_model, check_arms, timed_pass, study_stats, plots,
        # utilisation, archive (rule all counts as a job too, the model is built: 7 net).
        "candidates": n, "panels": panels, "snakemake_jobs": panels + 7,
        "slurm_probe_s": probe,
        "dry_runs": [{"s": d[0], "peak_rss_mib": d[1]} for d in dry],
        "dry_run_median_s": statistics.median(d[0] for d in dry),
        "dry_run_peak_rss_mib": max(d[1] for d in dry),
        "dry_run_after_first_peak_rss_mib": max((d[1] for d in dry[1:]), default=None),
        "planning_ms_per_candidate": statistics.median(d[0] for d in dry) / n * 1e3}
    outs, files, write_s = _finish(proj, snake)
    # The first plan over the finished tree checks every record and hashes every video (the
    # plan-time evidence check) and remembers what it found clean: a real run, since a dry
    # run writes nothing (so would check everything every time). Later plans hash the
    # records and stat the videos, and read in full only what changed since.
    noop = [timed_cmd([snake, *([] if i == 0 else ["-n"]), "--cores", "2", "all"], proj) for i in range(runs + 1)]
    # Count what the check made the plan redo instead of pretending it planned nothing.
    planned = 0 if "Nothing to be done" in noop[-1][2] else int(
        next((ln.split()[-1] for ln in noop[-1][2].splitlines() if ln.startswith("total")), "-1"))
    shutil.rmtree(proj)
    return {**point, "outputs": len(outs), "evidence_files": files, "write_tree_s": write_s,
            "noop_first_s": noop[0][0], "noop_first_peak_rss_mib": noop[0][1],
            "noop_runs": [{"s": d[0], "peak_rss_mib": d[1]} for d in noop[1:]],
            "noop_rerun_median_s": statistics.median(d[0] for d in noop[1:]),
            "noop_rerun_peak_rss_mib": max(d[1] for d in noop),
            "noop_rerun_planned_jobs": planned}


def bench_plan(runs: int, quick: bool = False) -> dict[str, Any]:
    """Planning (dry run, no-op rerun, peak RSS) at 31,000 and 100,006 candidates; quick:
    10 panels of 5 prompts, one run."""
    if quick:
        return {"points": {"quick": _plan_point(10, 5, 1)}}
    return {"points": {k: _plan_point(p, 31, runs) for k, p in PLAN_SIZES.items()}}

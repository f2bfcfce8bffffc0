"""benchmarks/gpu_check.py on CPU: what it reports from a hand-made results folder (a
failed study, a worker that fell back to the CPU, uncounted FLOPs, an atomic writer's
temp file, a corrupt record), and its outer-timeout path (SIGTERM while a fake
Snakemake runs: the study's process group is killed and the JSON says what it had)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402  (benchmarks/gpu_check.py, on the path just above)
from render import _gpu  # noqa: E402


def _json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def _timing(arm: str, latency: float, clock: str = "cuda_events", throttled: dict | None = None) -> dict:
    return {"sampled": True, "arm": {"name": arm}, "matches_bulk_frames": True,
            "timing": {"latency_s": latency, "phases_s": {"denoise": latency * 0.8, "decode": latency * 0.2},
                       "cv": 0.01, "clock": clock, "peak_device_mb": 900.0},
            "gpu": [{"throttled": throttled or {"status": "watched", "polls": 5, "reasons": []},
                     "gpu_before": {"temperature_c": 50}, "gpu_after": {"temperature_c": 54}}]}


def _scratch(project: Path) -> Path:
    """A study that failed half-way on two panels: one worker fell back to the CPU."""
    s = project / "results" / "scratch"
    rec = s / "panels" / "smoke" / "records"
    _json(rec / "control" / "a.json", {"arm": {"name": "control"}, "worker": {"device": "cuda"},
                                       "compute": {"total_flops": -1}})  # not counted: no MFU, not a negative one
    _json(rec / "treat" / "a.json", {"arm": {"name": "treat"}, "worker": {"device": "cpu"},
                                     "compute": {"total_flops": 2e12}})
    _json(rec / "treat" / ".tmp-b.json.0123abcd.json", "{\"arm\": ")  # an atomic writer mid-write
    tim = s / "panels" / "smoke" / "timing"
    _json(tim / "control" / "a.json", _timing("control", 0.5, throttled={"status": "not watched: no poll answered",
                                                                          "polls": 0, "reasons": []}))
    _json(tim / "treat" / "a.json", _timing("treat", 0.25))
    _json(tim / "treat" / "c.json", "{corrupt")
    for panel, n in (("smoke", 12), ("motion", 3)):  # the same job name in two panels
        _json(s / "panels" / panel / "telemetry" / "generate-score.json",
              {"nvml": {"status": "NVML 1 GPU(s)", "summary": {"GPU-1": {"samples": n}}}})
    _json(s / "study" / "utilisation.json", {"busy_share": 0.5, "jobs": [
        {"job": "generate-score:smoke", "window_s": 10.0, "tasks": 4, "nvml": "NVML 1 GPU(s)",
         "slots": {"n/gpu0": {"share": 0.5}}}, {"job": "broken"}]})
    _json(s / "logs" / "generate" / "smoke.log", "Traceback ...\nRuntimeError: CUDA error: an illegal memory access\n")
    return s


def test_a_failed_study_reports_what_it_measured_and_why_it_is_not_complete(tmp_path: Path) -> None:
    """Audit r6 items 3, 4, 5, 9, 10, 16: rule logs kept, CUDA verified from the records,
    NVML keyed per panel with sample counts, uncounted FLOPs give no MFU, temp and corrupt
    files skipped, and the render says 'study failed (rc 1)'."""
    project = tmp_path / "tmp" / "project"
    _scratch(project)
    out = tmp_path / "out" / "gpu_check.json"
    (tmp_path / "out").mkdir()
    log = out.with_name("gpu_check.snakemake.log")
    log.write_text("Error in rule generate_score_panel:\n    jobid: 3\n")
    result: dict[str, Any] = {"kind": "gpu_check", "complete": False, "driver_check": {"ok": True},
                              "gpu": {"name": "NVIDIA H200", "driver": "580.65.06", "cuda": "13.0"},
                              "dtype": "bfloat16", "study_started": time.time() - 30, "study_wall_s": 30.0,
                              "snakemake_rc": 1, "timed_out": False}
    gpu_check._finish(result, {"project": project, "log": log, "keep": out.with_name("gpu_check_logs")}, out)
    g = json.loads(out.read_text())
    assert not project.parent.exists()  # the copy is removed, its logs kept
    assert (out.parent / "gpu_check_logs" / "logs" / "generate" / "smoke.log").is_file()
    assert "illegal memory access" in g["rule_logs"]["generate/smoke.log"]
    assert "Error in rule generate_score_panel" in g["snakemake_tail"]
    assert g["complete"] is False and "the study failed (snakemake rc 1)" in g["incomplete"]
    assert g["cuda_check"]["ok"] is False and "1 of 2 generation records not generated on cuda" in g["incomplete"]
    assert set(g["nvml_summary"]) == {"smoke/generate-score", "motion/generate-score"}
    assert g["nvml_min_samples"] == {"smoke/generate-score": 12, "motion/generate-score": 3}
    assert g["nvml_samples_ok"] is False
    assert g["per_arm"]["control"]["mfu"] is None and g["per_arm"]["control"]["flops"] is None
    assert g["per_arm"]["treat"]["mfu"]["mfu"] == pytest.approx(2e12 / 0.25 / 989e12)
    assert g["per_arm"]["control"]["speedup"] == 1.0 and g["per_arm"]["treat"]["speedup"] == 2.0
    # the temp file is no error; a corrupt record and a malformed job are named, the rest reported
    assert set(g["unreadable"]) == {"panels/smoke/timing/treat/c.json", "utilisation job 'broken'"}
    assert g["timing"]["control"]["throttle_runs_watched"] == 0 and g["timing"]["treat"]["throttle_runs_watched"] == 1
    assert g["jobs"] == {"generate-score:smoke": {"window_s": 10.0, "tasks": 4, "nvml": "NVML 1 GPU(s)",
                                                  "slots": {"n/gpu0": 0.5}}}
    text = "\n".join(_gpu(g))
    assert "wall 30.0 s (**study failed (rc 1): partial figures**)" in text
    assert "motion/generate-score: 3 samples (NVML 1 GPU(s))" in text and "per panel job: **no**" in text
    assert "| not watched |" in text and "illegal memory access" in text


def test_a_check_stopped_before_the_study_says_so() -> None:
    g = {"kind": "gpu_check", "complete": False, "driver_check": {"ok": True}, "gpu": {"name": "NVIDIA H200"},
         "stopped": "outer timeout: SIGTERM", "timed_out": True}
    assert "**stopped before the study reported**" in "\n".join(_gpu(g))
    g = {"kind": "gpu_check", "complete": False, "driver_check": {"ok": True},
         "error": "no snakemake beside /x/python (/x/snakemake)"}
    assert "Not measured: no snakemake beside /x/python" in "\n".join(_gpu(g))


def test_a_mig_slice_or_uncounted_flops_give_no_mfu_and_say_why(tmp_path: Path) -> None:
    s = tmp_path / "scratch"
    _json(s / "panels" / "p" / "records" / "control" / "a.json", {"arm": {"name": "control"},
                                                                   "compute": {"total_flops": 4e12}})
    timing = {"control": {"latency_s": 0.5, "peak_device_mb": 10.0}}
    per = gpu_check.mfu_by_arm(s, timing, "NVIDIA H200 MIG 1g.18gb")
    assert per["control"]["mfu"] is None and "MIG slice" in per["control"]["mfu_absent"]
    assert gpu_check.mfu_by_arm(s, timing, "NVIDIA H200")["control"]["mfu"]["gpu"] == "H200 SXM"


FAKE_SNAKEMAKE = """#!/usr/bin/env bash
# A study that hangs: it writes a rule log, starts a long child and waits for it.
mkdir -p results/scratch/logs/generate
echo "RuntimeError: CUDA error: fake" > results/scratch/logs/generate/smoke.log
echo "fake snakemake started"
sleep 120 &
echo $! > "$PIDFILE"
wait
"""

DRIVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {benchmarks!r})
import gpu_check
gpu_check.driver_check = lambda: {{"ok": True, "driver": "580.65.06", "torch": "2.14", "torch_cuda": "13.0",
                                   "driver_needed": "R580+", "cuda_available": True}}
gpu_check.gpu_info = lambda: {{"name": "NVIDIA H200", "bf16_supported": True, "uuid": None}}
gpu_check.snakemake_command = lambda: Path({fake!r})
sys.exit(gpu_check.main(["--out", {out!r}, "--deadline", str(time.time() + 300)]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_sigterm_kills_the_study_and_writes_the_json_with_its_logs(tmp_path: Path) -> None:
    """Audit r6 item 2: gpu_check.sh's timeout SIGTERMs gpu_check.py; it used to die at
    once, leaving Snakemake (its own session) running and the JSON without wall, log tail
    or timed_out. Now it kills the study's process group, writes what it had with
    ``stopped`` and exits 124."""
    fake = tmp_path / "snakemake"
    fake.write_text(FAKE_SNAKEMAKE)
    fake.chmod(0o755)
    out, pidfile = tmp_path / "out" / "gpu_check.json", tmp_path / "sleep.pid"
    script = DRIVER.format(benchmarks=str(ROOT / "benchmarks"), fake=str(fake), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env={**os.environ, "PIDFILE": str(pidfile)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(600):  # the study is running once its child wrote its pid
            if (pidfile.is_file() and pidfile.read_text().strip()) or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[0]
        sleeper = int(pidfile.read_text())
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 124, output
    for _ in range(50):
        if not _alive(sleeper):
            break
        time.sleep(0.1)
    assert not _alive(sleeper), "the study's process group outlived the check"
    g = json.loads(out.read_text())
    assert g["complete"] is False and g["timed_out"] is True and g["stopped"].startswith("outer timeout")
    assert g["study_wall_s"] > 0 and "fake snakemake started" in g["snakemake_tail"]
    assert "CUDA error: fake" in g["rule_logs"]["generate/smoke.log"]
    assert (out.parent / "gpu_check.snakemake.log").is_file()
    assert (out.parent / "gpu_check_logs" / "logs" / "generate" / "smoke.log").is_file()
    assert "outer timeout" in g["incomplete"]

"""fleet: Parsl slots, spans, failure classes, idle release, model reuse across tasks.

Every test runs the real HighThroughputExecutor with local workers (no scheduler)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pairflow.config import FleetSpec
from pairflow.errors import TaskFailedError
from pairflow.fleet import Grant, classify_failure, grant_from_env, make_config, run_tasks
from pairflow.slurm import allocation


@pytest.fixture(autouse=True)
def workers_import_this_module(monkeypatch):
    """Parsl workers unpickle tasks by module name; let them import this test module."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


def sleep_task(p: dict) -> dict:
    time.sleep(p["s"])
    return {"pid": os.getpid()}


def pid_then_sleep(p: dict) -> dict:
    Path(p["dir"], f"{os.getpid()}.pid").write_text("")
    time.sleep(p["s"])
    return {}


def failing_task(p: dict) -> dict:
    """Fails the way the payload says: host OOM, device OOM, a bug, a killed worker."""
    how = p["how"]
    time.sleep(0.2)
    if how == "host_oom":
        raise MemoryError("cannot allocate 64 GiB for frames")
    if how == "device_oom":
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    if how == "bug":
        raise ValueError("a bug in the task")
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"ok": True}


def test_grant_maps_visible_devices_to_physical_gpus():
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "3,5",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu07", "SLURM_CPUS_ON_NODE": "16"}
    g = grant_from_env(env)
    assert g.accelerators == ("0", "1") and g.gpus == {"0": "3", "1": "5"}
    assert g.allocation is not None and g.allocation.job_id == "42" and g.allocation.cpus_on_node == 16
    local = grant_from_env({"CUDA_VISIBLE_DEVICES": "-1"})
    assert local == Grant() and allocation({}) is None


def test_failures_are_classified_and_spans_recorded(tmp_path):
    hows = ["ok", "host_oom", "device_oom", "bug", "killed", "ok"]
    payloads = [{"how": h, "i": i, "identity": {"candidate_id": f"c{i}", "arm": "pab", "prompt_id": "a1", "seed": i}}
                for i, h in enumerate(hows)]
    with pytest.raises(TaskFailedError) as e:
        run_tasks(failing_task, payloads, tmp_path / "run", FleetSpec(2, 0), Grant(), "faults",
                  tmp_path / "tel.json", lambda p: tmp_path / "failures" / f"{p['i']}.json")
    assert "4 of 6 tasks failed" in str(e.value)
    got = {int(f.stem): json.loads(f.read_text())["class"] for f in (tmp_path / "failures").glob("*.json")}
    assert got == {1: "host_oom_or_killed", 2: "device_oom", 3: "other", 4: "host_oom_or_killed"}
    bug = json.loads((tmp_path / "failures" / "3.json").read_text())  # a failure record names its task
    assert {k: bug[k] for k in ("candidate_id", "arm", "prompt_id", "seed", "attempts")} == {
        "candidate_id": "c3", "arm": "pab", "prompt_id": "a1", "seed": 3, "attempts": 1}
    assert bug["message"] == "a bug in the task" and bug["slot"]["host"]
    assert json.loads((tmp_path / "failures" / "4.json").read_text())["slot"]  # the lost worker's host
    t = json.loads((tmp_path / "tel.json").read_text())
    assert sum(1 for s in t["spans"] if s.get("failure")) == 4 and len(t["spans"]) == 6
    ran = [s for s in t["spans"] if not s.get("failure")]
    for s in ran:  # spans come from the tasks: queued at the driver, started/finished at the worker
        assert s["queued"] <= s["started"] <= s["finished"] and s["rank"] is not None
    assert {f"{s['host']}/cpu{s['rank']}" for s in ran} <= set(t["slots"])
    busy = sum(v["busy_s"] for v in t["slots"].values())
    assert busy == pytest.approx(sum(s["finished"] - s["started"] for s in ran))
    assert all(0 <= v["share"] < 1 for v in t["slots"].values())
    assert t["nvml"]["status"]  # a reason when NVML is absent, the GPU count when present


def test_classify_failure_by_message():
    assert classify_failure(RuntimeError("CUDA error: out of memory")) == "device_oom"
    assert classify_failure(OSError("disk")) == "other"


def test_idle_block_is_released(tmp_path):
    """After ``idle_timeout_s`` with no tasks, Parsl scales the block in: its workers exit."""
    import parsl

    app = parsl.python_app(sleep_task, executors=["slots"])
    dfk = parsl.load(make_config(tmp_path, FleetSpec(1, 0, idle_timeout_s=2), Grant()))
    try:
        pid = app({"s": 0}).result()["pid"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"worker {pid} still alive 60 s after its last task; idle timeout 2 s")
    finally:
        dfk.cleanup()
        parsl.clear()


DRIVER = """
import sys
from pathlib import Path
from pairflow.config import FleetSpec
from pairflow.fleet import Grant, run_tasks
from test_fleet import pid_then_sleep
d = Path(sys.argv[1])
run_tasks(pid_then_sleep, [{"dir": str(d), "s": 600}] * 2, d / "run", FleetSpec(2, 0), Grant(), "long")
"""


def test_sigterm_to_the_driver_takes_its_workers_down(tmp_path):
    """Slurm sends SIGTERM at walltime or scancel: the driver cleans Parsl up, so no worker
    keeps running (and holding the allocation) after it."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=dict(os.environ))
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2, "workers did not start"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) != 0
    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.2)
    assert not alive, f"workers {alive} outlived their driver"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"

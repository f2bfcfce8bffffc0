"""fleet: Parsl slots, spans, failure classes, idle release, model reuse across tasks.

Every test runs the real HighThroughputExecutor with local workers (no scheduler)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pairflow.errors import TaskFailedError
from pairflow.fleet.pool import Grant, TaskHooks, classify_failure, make_config, run_tasks
from pairflow.fleet.sites import Packing, grant_from_env
from pairflow.fleet.startup import timeline, worker_marks
from pairflow.plan.config import FleetSpec


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


class NeedsTwoArgs(Exception):
    """Like ffmpeg.Error: pickles, but cannot be rebuilt from its args on the driver."""

    def __init__(self, cmd: str, stderr: bytes) -> None:
        super().__init__(f"{cmd} error")
        self.stderr = stderr


def encode_task(p: dict) -> dict:
    """A real encode with a real ffmpeg failure (an x264 preset that does not exist)."""
    import numpy as np

    from pairflow.media.video import encode
    from pairflow.plan.config import EncoderSpec

    spec = EncoderSpec(ffmpeg=p.get("ffmpeg", ""), codec="libx264", crf=18, preset=p["preset"],
                       pix_fmt="yuv420p", gop=9, threads=1, lossless=False, fail_on_flat=False)
    encode(np.zeros((5, 16, 16, 3), np.uint8), Path(p["out"]), spec, 8)
    return {}


def unpicklable_task(p: dict) -> dict:
    try:
        raise NeedsTwoArgs("ffmpeg", b"boom")
    except NeedsTwoArgs as e:
        raise RuntimeError("wrapped") from e


def test_ffmpeg_failure_in_a_worker_reaches_the_driver_with_its_stderr(tmp_path):
    """Injected: a real ffmpeg run that fails inside a real Parsl worker. ffmpeg-python's
    Error cannot be rebuilt on the driver; before the fix the job waited forever."""
    payloads = [{"preset": "frobnicate", "out": str(tmp_path / "v.mp4"), "i": 0}, {"i": 1}]
    fns = {0: encode_task, 1: unpicklable_task}
    started = time.monotonic()
    with pytest.raises(TaskFailedError) as e:
        run_tasks(dispatch, [{**p, "fn": fns[p["i"]].__name__} for p in payloads], tmp_path / "run",
                  FleetSpec(2, 0, stall_timeout_s=30), Grant(), "ffmpeg",
                  TaskHooks(failure_out=lambda p: tmp_path / "failures" / f"{p['i']}.json"))
    assert time.monotonic() - started < 60
    assert "2 of 2 tasks failed" in str(e.value)
    enc = json.loads((tmp_path / "failures" / "0.json").read_text())
    assert enc["exception"] == "EncodeError" and "frobnicate" in enc["message"]  # ffmpeg's own words
    assert "stderr ends" in enc["message"]
    other = json.loads((tmp_path / "failures" / "1.json").read_text())
    assert other["exception"] == "RuntimeError" and "wrapped" in other["message"]
    assert not list(tmp_path.glob("v.mp4*")) and not list(tmp_path.glob(".tmp-*"))


def dispatch(p: dict) -> dict:
    return globals()[p["fn"]](p)


def test_portable_errors_pickle_and_keep_class_message_and_traceback():
    import pickle

    from pairflow.errors import EncodeError, TaskError
    from pairflow.fleet.pool import portable

    try:
        try:
            raise NeedsTwoArgs("ffmpeg", b"x")
        except NeedsTwoArgs as cause:
            raise EncodeError("ffmpeg failed writing v.mp4; its stderr ends:\nNo such preset") from cause
    except EncodeError as err:
        got = pickle.loads(pickle.dumps(portable(err)))
    assert type(got) is EncodeError and "No such preset" in str(got) and got.__cause__ is None
    assert "NeedsTwoArgs" in got.remote_traceback  # the cause chain travels as text
    oom = pickle.loads(pickle.dumps(portable(MemoryError("64 GiB"))))
    assert isinstance(oom, TaskError) and str(oom) == "MemoryError: 64 GiB"
    assert classify_failure(oom) == "host_oom_or_killed"


def test_failures_are_classified_and_spans_recorded(tmp_path):
    hows = ["ok", "host_oom", "device_oom", "bug", "killed", "ok"]
    payloads = [{"how": h, "i": i, "identity": {"candidate_id": f"c{i}", "arm": "pab", "prompt_id": "a1", "seed": i}}
                for i, h in enumerate(hows)]
    with pytest.raises(TaskFailedError) as e:
        run_tasks(failing_task, payloads, tmp_path / "run", FleetSpec(2, 0), Grant(), "faults",
                  TaskHooks(tmp_path / "tel.json", lambda p: tmp_path / "failures" / f"{p['i']}.json"))
    assert "4 of 6 tasks failed" in str(e.value)
    got = {int(f.stem): json.loads(f.read_text())["class"] for f in (tmp_path / "failures").glob("*.json")}
    assert got == {1: "host_oom_or_killed", 2: "device_oom", 3: "other", 4: "host_oom_or_killed"}
    bug = json.loads((tmp_path / "failures" / "3.json").read_text())  # a failure record names its task
    assert {k: bug[k] for k in ("candidate_id", "arm", "prompt_id", "seed", "attempts")} == {
        "candidate_id": "c3", "arm": "pab", "prompt_id": "a1", "seed": 3, "attempts": 1}
    assert bug["exception"] == "ValueError" and bug["message"] == "ValueError: a bug in the task" and bug["slot"]["host"]
    lost = json.loads((tmp_path / "failures" / "4.json").read_text())["slot"]  # the lost worker's own slot
    assert lost["source"] == "heartbeat" and lost["device"].startswith("cpu") and lost["name"] == (
        f"{lost['host']}/{lost['device']}") and lost["pid"]
    assert bug["slot"]["source"] == "task" and bug["slot"]["device"].startswith("cpu")
    t = json.loads((tmp_path / "tel.json").read_text())
    assert sum(1 for s in t["spans"] if s.get("failure") and not s.get("attempt")) == 4 and len(t["spans"]) == 9
    # the failed attempts' slot time is kept (the ledger's "failed"), with their task's arm; the
    # killed worker wrote none (its time is the slot's idle time)
    tried = [s for s in t["spans"] if s.get("attempt")]
    assert sorted(s["failure"] for s in tried) == ["device_oom", "host_oom_or_killed", "other"]
    assert all(s["arm"] == "pab" and s["finished"] - s["started"] >= 0.2 for s in tried)
    assert t["job"]["failed_s"] >= 0.6 and t["job"]["retried_s"] == 0.0
    ran = [s for s in t["spans"] if not s.get("failure")]
    for s in ran:  # spans come from the tasks: queued at the driver, started/finished at the worker
        assert s["queued"] <= s["started"] <= s["finished"] and s["rank"] is not None
    assert {f"{s['host']}/cpu{s['rank']}" for s in ran} <= set(t["slots"])
    busy = sum(v["busy_s"] for v in t["slots"].values())
    assert busy == pytest.approx(sum(s["finished"] - s["started"] for s in ran + tried))


def flaky_task(p: dict) -> dict:
    """Fails on its first attempt only (a marker file remembers the attempt)."""
    marker = Path(p["dir"], f"{p['i']}.tried")
    time.sleep(0.2)
    if not marker.exists():
        marker.write_text("")
        raise ValueError("first attempt fails")
    return {"ok": True}


def test_retried_attempts_keep_their_slot_time_as_retried(tmp_path):
    """An attempt Parsl retried is not dropped: its span is kept as ``retried``, with its
    task's stage and arm, and the job's ``retried_s`` counts it apart from work."""
    payloads = [{"dir": str(tmp_path), "i": i, "stage": "generate",
                 "identity": {"candidate_id": f"c{i}", "arm": "fewstep", "prompt_id": "a", "seed": i}}
                for i in range(2)]
    out = run_tasks(flaky_task, payloads, tmp_path / "run", FleetSpec(2, 1), Grant(), "flaky",
                    TaskHooks(tmp_path / "tel.json"))
    assert out == [{"ok": True}] * 2
    t = json.loads((tmp_path / "tel.json").read_text())
    tried = [s for s in t["spans"] if s.get("attempt")]
    assert len(tried) == 2 and {s["failure"] for s in tried} == {"retried"}
    assert {(s["stage"], s["arm"]) for s in t["spans"] if s.get("kind") != "warm-up"} == {("generate", "fewstep")}
    assert t["job"]["retried_s"] >= 0.4 and t["job"]["failed_s"] == 0.0 and t["job"]["work_s"] >= 0.4
    assert all(0 <= v["share"] < 1 for v in t["slots"].values())
    assert t["nvml"]["status"]  # a reason when NVML is absent, the GPU count when present


def lost_once(p: dict) -> dict:
    """Killed mid-write on its first attempt (a temp of its output left behind, as a
    killed encoder leaves one); the retry writes (the job's end sweeps the temp:
    ``jobs.sweep_after``, once the pool is down)."""
    out = Path(p["dir"], f"{p['i']}.json")
    marker = Path(p["dir"], f"{p['i']}.tried")
    time.sleep(0.3)
    if not marker.exists():
        marker.write_text("")
        Path(p["dir"], f".tmp-{out.name}.k1lledwr1ter0001.json").write_text("half")
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    out.write_text("{}")
    return {"pid": os.getpid()}


def test_a_lost_attempt_is_a_retried_span_and_a_warning_and_its_temp_goes(tmp_path, caplog):
    """Regression (issue 38 faults, item 2, CI cluster): a SIGKILLed pool's two busy tasks were
    retried on the other node correctly, but ``retried_s`` read 0.0, the log said nothing
    and the killed writers' temp videos stayed. A lost attempt is now a span (its start to
    when Parsl took the loss, failure ``retried``), one WARNING names the task, where it was
    lost, where it was redone and what it cost; its temp stays for the job's end to sweep."""
    payloads = [{"dir": str(tmp_path), "i": i, "stage": "generate",
                 "identity": {"candidate_id": f"c{i}", "arm": "fewstep", "prompt_id": "a", "seed": i}}
                for i in range(2)]
    with caplog.at_level(logging.WARNING, logger="pairflow.fleet.pool"):
        out = run_tasks(lost_once, payloads, tmp_path / "run", FleetSpec(2, 1), Grant(), "lost",
                        TaskHooks(tmp_path / "tel.json", describe=lambda p: f"fewstep/a-s{p['i']}"))
    assert len(out) == 2 and {o["pid"] for o in out}
    t = json.loads((tmp_path / "tel.json").read_text())
    lost = [s for s in t["spans"] if s.get("lost")]
    assert len(lost) == 2 and {s["failure"] for s in lost} == {"retried"}, t["spans"]
    assert all(s["finished"] - s["started"] >= 0.8 and s["arm"] == "fewstep" and s["pid"] for s in lost)
    assert t["job"]["retried_s"] >= 1.6 and t["job"]["failed_s"] == 0.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and " was lost on " in
                r.getMessage()]
    assert len(warnings) == 2, caplog.text  # one per lost attempt
    for i, w in enumerate(sorted(warnings)):
        assert f"lost: fewstep/a-s{i} was lost on " in w and "redone on " in w and "slot-s" in w, w
    # the killed writers' temps stay while tasks run (a retry may race a live first attempt);
    # the job's end removes them once its pool is down (jobs.sweep_after, tests/test_jobs.py)
    assert len(list(tmp_path.glob(".tmp-*"))) == 2
    assert sorted(p.name for p in tmp_path.glob("[!.]*.json")) == ["0.json", "1.json", "tel.json"]


WARMED: dict[str, float] = {}


def warm_up(p: dict) -> dict:
    """An import-only warm-up: what the worker spent, kept for its later tasks."""
    started = time.perf_counter()
    import numpy  # noqa: F401

    WARMED["s"] = time.perf_counter() - started
    return {"import_s": WARMED["s"], "marks": worker_marks()}


def report_warm(p: dict) -> dict:
    return {"warmed": bool(WARMED), "pid": os.getpid()}


def test_warm_up_runs_while_the_driver_prepares_and_tasks_find_the_worker_warm(tmp_path, caplog):
    prepared = []

    def prepare() -> list[dict]:
        time.sleep(3)  # the driver hashing videos; the pool starts meanwhile
        prepared.append(time.time())
        return [{"i": i} for i in range(4)]

    with caplog.at_level("INFO", logger="pairflow.fleet.sites"):
        out = run_tasks(report_warm, prepare, tmp_path / "run", FleetSpec(1, 0), Grant(), "warm",
                        TaskHooks(tmp_path / "tel.json", warm=(warm_up, {}), start_early=True))
    assert [r["warmed"] for r in out] == [True] * 4 and len({r["pid"] for r in out}) == 1
    t = json.loads((tmp_path / "tel.json").read_text())
    # The Parsl config that ran, verbatim (its constructor call), in the job log and the telemetry record.
    assert t["site"] == "local" and t["parsl_config"].startswith("Config(") and "SingleNodeLauncher(" in t["parsl_config"]
    assert t["parsl_config"] in caplog.text
    warm = [s for s in t["spans"] if s.get("kind") == "warm-up"]
    assert len(warm) == 1 and "import_s" in warm[0]["warm_up"]
    assert warm[0]["queued"] < prepared[0]  # queued before preparation ended
    assert sum(v["tasks"] for v in t["slots"].values()) == 4  # a warm-up is busy time, not a task
    # The start-up timeline: the driver's marks in order, the pool loaded before the tasks were
    # prepared (they overlap), and start-up ends at the first real task, after the warm-up.
    m = t["startup_marks"]
    assert m["driver_ready"] <= m["parsl_imported"] <= m["pool_loaded"] <= m["tasks_prepared"]
    assert m["parsl_imported"] <= m["interchange_started"] + 0.05 <= m["pool_loaded"] + 0.05  # /proc ticks: 10 ms
    # The pool was launched while the interchange started, not after parsl.load (fleet.executor).
    assert warm[0]["warm_up"]["marks"]["manager_started"] < m["pool_loaded"]
    tl = timeline(t)
    assert tl["first_task_s"] >= warm[0]["finished"] - t["job"]["start"] and tl["slots"] == 1
    # Nothing to do: no pool starts when the work is found before starting it.
    tick = time.perf_counter()
    assert run_tasks(report_warm, lambda: [], tmp_path / "run2", FleetSpec(1, 0), Grant(), "none",
                     TaskHooks(warm=(warm_up, {}))) == []
    assert time.perf_counter() - tick < 1 and not (tmp_path / "run2" / "parsl").exists()


def test_the_job_window_closes_after_the_pools_cleanup(tmp_path, monkeypatch):
    """Audit of issue 25, defect 4: the job's end was taken before Parsl's cleanup, so the
    pool's shutdown was no one's slot time. The telemetry record is written after the
    cleanup, and its job ends after it."""
    from pairflow.fleet import pool as fleet

    cleaned: list[float] = []
    real = fleet._cleanup

    def slow_cleanup(dfk):  # type: ignore[no-untyped-def]
        real(dfk)
        time.sleep(0.5)  # a slow interchange shutdown
        cleaned.append(time.time())

    monkeypatch.setattr(fleet, "_cleanup", slow_cleanup)
    run_tasks(report_warm, [{"i": 0}], tmp_path / "run", FleetSpec(1, 0), Grant(), "window",
              TaskHooks(tmp_path / "tel.json"))
    t = json.loads((tmp_path / "tel.json").read_text())
    assert len(cleaned) == 1 and t["job"]["end"] >= cleaned[0] >= t["window"]["end"] + 0.5
    assert t["job"]["end_is"] == "after the worker pool's cleanup"
    assert t["job"]["start_is"] == "job process start (/proc/self/stat)"  # no Slurm here


def double_task(p: dict) -> dict:
    if p.get("fail"):
        raise ValueError("this one fails")
    return {"n": p["n"], "twice": 2 * p["n"]}


def test_two_task_kinds_in_one_pool_and_followers_submitted_as_tasks_succeed(tmp_path):
    """One pool runs two kinds of task; ``follow`` submits a task's followers when it
    succeeds (as a panel job scores a candidate once its video lands), none when it fails."""
    seen = []

    def follow(payload: dict, result: dict) -> list:
        seen.append(payload["n"])
        return [(report_warm, {"n": result["twice"], "stage": "after"})] if payload["stage"] == "first" else []

    payloads = [{"n": n, "stage": "first", "fail": n == 2, "i": n} for n in range(4)]
    with pytest.raises(TaskFailedError, match="1 of 7 tasks failed"):
        run_tasks(double_task, payloads, tmp_path / "run", FleetSpec(2, 0), Grant(), "kinds",
                  TaskHooks(tmp_path / "tel.json", lambda p: tmp_path / "failures" / f"{p['i']}.json", follow=follow))
    assert sorted(seen) == [0, 0, 1, 2, 3, 6]  # every success: the three firsts and their followers (2n)
    spans = json.loads((tmp_path / "tel.json").read_text())["spans"]
    assert sorted(s.get("stage", "") for s in spans if not s.get("failure")) == ["after"] * 3 + ["first"] * 3
    after = [s for s in spans if s.get("stage") == "after"]
    firsts = [s for s in spans if s.get("stage") == "first"]
    assert all(a["queued"] >= min(f["finished"] for f in firsts) for a in after)  # submitted after a first finished
    assert [f.name for f in (tmp_path / "failures").iterdir()] == ["2.json"]  # the failed task, no followers


def test_classify_failure_by_message():
    assert classify_failure(RuntimeError("CUDA error: out of memory")) == "device_oom"
    assert classify_failure(OSError("disk")) == "other"


def test_a_killed_block_is_classed_host_oom_or_killed():
    """Regression (issue 22): a SIGKILLed pool manager ends its block with exit 137; Parsl
    fails every task with its bad-state error naming that exit code, which was classed
    ``other``."""
    from parsl.executors.errors import BadStateException
    from parsl.jobs.errors import TooManyJobFailuresError

    from pairflow.fleet.pool import ADVICE, make_config

    executor = make_config(Path("/nonexistent"), FleetSpec(1, 0), Grant()).executors[0]
    for code in (137, -9):
        err = BadStateException(executor, TooManyJobFailuresError(f"Error 1:\n\tEXIT CODE: {code}\n"))
        assert classify_failure(err) == "host_oom_or_killed"
    assert classify_failure(BadStateException(executor, TooManyJobFailuresError("Error 1:\n\tEXIT CODE: 1\n"))) == (
        "other")
    assert "exit 137" in ADVICE["host_oom_or_killed"] and "oom-kill" in ADVICE["host_oom_or_killed"]


def test_a_failure_record_that_cannot_be_written_is_reported_in_the_log_and_on_stderr(tmp_path, capfd, caplog):
    """A full disk (here: a failure folder that cannot be created, the same OSError path)
    must not lose the failure: the log and stderr carry the record's content."""
    blocker = tmp_path / "failures"
    blocker.write_text("a file where the failure folder should be")
    with pytest.raises(TaskFailedError):
        run_tasks(failing_task, [{"how": "bug", "identity": {"candidate_id": "c0"}}], tmp_path / "run",
                  FleetSpec(1, 0), Grant(), "unwritable",
                  TaskHooks(failure_out=lambda p: blocker / "sub" / "0.json"))
    err = capfd.readouterr().err
    assert "cannot write the failure record" in err and str(blocker / "sub" / "0.json") in err
    assert '"candidate_id": "c0"' in err and '"class": "other"' in err and "a bug in the task" in err
    assert any("cannot write the failure record" in r.getMessage() and '"candidate_id": "c0"' in r.getMessage()
               for r in caplog.records)


def slow_warm_up(p: dict) -> dict:
    """A warm-up that takes longer than the stall timeout (a slow torch import)."""
    time.sleep(p["s"])
    return {"import_s": p["s"]}


def reporting_task(p: dict) -> dict:
    """Works for ``s`` seconds, reporting progress every 0.5 s (like denoising steps)."""
    from pairflow import progress

    for i in range(int(p["s"] * 2)):
        time.sleep(0.5)
        progress.report(f"step {i}")
    return {"pid": os.getpid()}


def test_a_slow_start_is_not_a_stall_and_reported_progress_keeps_a_long_task_alive(tmp_path):
    """Regression (issue 22): with stall_timeout_s 30 a healthy job was killed as stalled
    while its workers still imported torch. The stall clock starts when a worker is ready,
    and a task reporting progress runs past the stall timeout."""
    started = time.monotonic()
    out = run_tasks(reporting_task, [{"s": 4}, {"s": 0.5}], tmp_path / "run", FleetSpec(1, 0, stall_timeout_s=2.5),
                    Grant(), "slow start", TaskHooks(warm=(slow_warm_up, {"s": 5})))
    assert len(out) == 2 and time.monotonic() - started > 9  # 5 s warm-up + 4.5 s of tasks, each over 2.5 s: no stall


def test_a_silent_task_fails_as_stalled_after_the_stall_timeout(tmp_path):
    """A task that reports nothing (blocked: a hung tool) fails the job within
    stall_timeout_s plus the driver's poll period, counted from the worker ready."""
    from pairflow.errors import StalledError

    started = time.monotonic()
    with pytest.raises(StalledError) as e:
        run_tasks(sleep_task, [{"s": 120}], tmp_path / "run", FleetSpec(1, 0, stall_timeout_s=3), Grant(), "silent",
                  TaskHooks(describe=lambda p: f"sleep {p['s']}"))
    took = time.monotonic() - started
    assert "stalled: no task finished and no worker reported progress" in str(e.value)
    assert "silent: sleep 120" in str(e.value) and "/cpu" in str(e.value)  # the slot, host/device
    assert took < 60, took


def test_a_start_up_past_its_own_limit_fails_as_stalled_in_start_up(tmp_path):
    from pairflow.errors import StalledError

    with pytest.raises(StalledError, match=r"no worker became ready .*\(fleet/startup_timeout_s: 4\)"):
        run_tasks(sleep_task, [{"s": 0}], tmp_path / "run", FleetSpec(1, 0, stall_timeout_s=60, startup_timeout_s=4),
                  Grant(), "stuck start", TaskHooks(warm=(slow_warm_up, {"s": 120})))


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
from pairflow.plan.config import FleetSpec
from pairflow.fleet.pool import Grant, run_tasks
from test_fleet import pid_then_sleep
d = Path(sys.argv[1])
run_tasks(pid_then_sleep, [{"dir": str(d), "s": 600}] * 2, d / "run", FleetSpec(2, 0), Grant(), "long")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_driver_death_takes_its_interchange_and_workers_down(tmp_path, sig):
    """Slurm sends SIGTERM at walltime or scancel: the driver cleans Parsl up. A SIGKILL
    leaves no cleanup to the driver: the interchange (parent-death signal) and the pool's
    watchdog (its process group: manager, workers, multiprocessing helpers) end themselves."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=dict(os.environ))
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2, "workers did not start"
    pool = _pool_of(tmp_path)
    started = [*_children_of(proc.pid), pool, *_descendants(pool)]  # interchange, pool, its children
    assert len(started) >= 5
    proc.send_signal(sig)
    assert proc.wait(timeout=60) != 0
    deadline = time.monotonic() + 30
    alive = started
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.2)
    assert not alive, f"processes {alive} outlived their driver"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


STALL_DRIVER = """
import sys
from pathlib import Path
from pairflow.plan.config import FleetSpec
from pairflow.fleet.pool import Grant, run_tasks
from test_fleet import pid_then_sleep
d = Path(sys.argv[1])
run_tasks(pid_then_sleep, [{"dir": str(d), "s": 1}] * 400, d / "run",
          FleetSpec(2, 0, stall_timeout_s=30, worker_start="spawn"), Grant(), "stall")
"""


def _start_driver(code: str, tmp_path: Path) -> subprocess.Popen[str]:
    """Start a driver script (``code``) and wait up to 120 s for its two workers' pid
    files (the caller asserts they came)."""
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=dict(os.environ),
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    return proc


def _pool_of(tmp_path: Path) -> int:
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmd.read_bytes()
        except OSError:
            continue
        if (b"process_worker_pool" in text or b"pairflow.fleet.workerpool" in text) and str(tmp_path).encode() in text:
            return int(cmd.parent.name)
    raise AssertionError("no worker pool found")


def _children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        out += [int(x) for x in task.read_text().split()]
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a forked worker's parent is the pool's fork server)."""
    out = []
    for child in _children_of(pid):
        out += [child, *_descendants(child)]
    return out


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid`` (a worker pool's: LocalProvider
    starts each block in a group of its own)."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = d.joinpath("stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(d.name))
    return out


def _manager_server(pool: int, workers: set[int]) -> int:
    """Parsl's Manager server: the pool's child beside the workers, or with workers forked
    from a fork server (workerpool), the server's child beside them."""
    forkserver = [p for p in _children_of(pool) if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()]
    manager = [p for p in (_children_of(forkserver[0]) if forkserver else _children_of(pool)) if p not in workers
               and b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(manager) == 1, manager
    return manager[0]


KILL_DRIVER = """
import sys
from pathlib import Path
from pairflow.plan.config import FleetSpec
from pairflow.fleet.pool import Grant, TaskHooks, run_tasks
from test_fleet import pid_then_sleep
d, start, s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
out = run_tasks(pid_then_sleep, [{"dir": str(d), "s": s, "i": i} for i in range(3)], d / "run",
                FleetSpec(2, 1, stall_timeout_s=120, worker_start=start), Grant(), "kill",
                TaskHooks(failure_out=lambda p: d / "failures" / f"{p['i']}.json"))
print("results", len(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_killed_worker_is_retried_once_and_replaced_and_the_pool_ends_clean(tmp_path, start):
    """Injected: SIGKILL to the process running a task (a worker, found by the pid file its
    task writes: by role, not by its place in the tree). Under ``forkserver`` its parent is
    the pool's fork server, which forks its replacement; under spawn, Parsl's pool. Parsl
    fails the task as lost and retries it (retries: 1): every task succeeds, the killed
    one twice started, and nothing of the pool outlives the job."""
    proc = subprocess.Popen([sys.executable, "-c", KILL_DRIVER, str(tmp_path), start, "2"], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        victim = min(int(p.stem) for p in tmp_path.glob("*.pid"))
        server = _parent(victim)
        assert (b"multiprocessing.forkserver" in Path(f"/proc/{server}/cmdline").read_bytes()) == (start == "forkserver")
        group = os.getpgid(victim)
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "results 3" in out, err[-3000:]
    assert not (tmp_path / "failures").exists()
    (log,) = (tmp_path / "run" / "workers").rglob("manager.log")
    assert "has died" in log.read_text() and "has been restarted" in log.read_text()  # a replacement was started
    time.sleep(1)
    assert not _group(group), f"pool processes {_group(group)} outlived the job"


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["fork server", "Manager server"])
def test_a_killed_fork_server_or_manager_server_ends_the_pool_at_once_and_leaves_nothing(tmp_path, victim):
    """Injected (``fleet.worker_start: forkserver``): SIGKILL to the pool's fork server, or
    to Parsl's Manager server (forked from it). Before, the first made Parsl fork new workers
    from a second fork server while the old ones ran on; the second left the pool spinning
    on a broken pipe until the stall timeout. Now the pool manager names what ended and
    exits at once as a killed pool: the tasks fail as host_oom_or_killed (a rerun or
    another node's pool takes them), well inside the stall timeout (120 s), and the
    workers end with their fork server (the pool's process group is empty)."""
    proc = subprocess.Popen([sys.executable, "-c", KILL_DRIVER, str(tmp_path), "forkserver", "600"],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        workers = {int(p.stem) for p in tmp_path.glob("*.pid")}
        assert len(workers) == 2, f"workers did not start (driver exit {proc.poll()})"
        server = _parent(next(iter(workers)))
        pool = _parent(server)
        group = os.getpgid(pool)
        os.kill(server if victim == "fork server" else _manager_server(pool, workers), signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - killed < 30, err[-3000:]
    assert proc.returncode != 0 and "TaskFailedError" in err, err[-3000:]
    assert f"{victim} (pid" in err and "Ending this worker pool (exit 137" in err, err[-3000:]
    assert ("(exit status -9)" in err) == (victim == "Manager server"), err[-3000:]  # the fork server reports it
    records = [json.loads(f.read_text()) for f in (tmp_path / "failures").glob("*.json")]
    assert len(records) == 3 and {r["class"] for r in records} == {"host_oom_or_killed"}, records
    time.sleep(1)
    assert not _group(group), f"pool processes {_group(group)} outlived the job"


@pytest.mark.slow
def test_killed_pool_manager_fails_the_job_as_stalled_and_tears_the_pool_down(tmp_path):
    """Injected (``fleet.worker_start: spawn``, Parsl's own pool): SIGKILL to the worker
    pool's multiprocessing Manager server (not a task worker). Its workers die as zombies
    while the pool keeps heartbeating to the interchange, so Parsl never declares it lost
    (and its log grows by MB/s): the stall check must end it. (Under forkserver the pool
    ends itself at once: the test above.)"""
    proc = _start_driver(STALL_DRIVER, tmp_path)
    try:
        workers = {int(p.stem) for p in tmp_path.glob("*.pid")}
        assert len(workers) == 2, f"workers did not start (driver exit {proc.poll()})"
        pool = _pool_of(tmp_path)
        tree = [pool, *_descendants(pool)]
        manager = [_manager_server(pool, workers)]
        os.kill(manager[0], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "StalledError" in err and "stalled: no task finished" in err and "stall_timeout_s: 30" in err
    assert time.monotonic() - killed < 60
    time.sleep(3)
    assert not [p for p in tree if _alive(p)], "the pool outlived the stalled job"
    size = _tree_bytes(tmp_path / "run")
    time.sleep(5)
    assert _tree_bytes(tmp_path / "run") == size, "a log still grows after the job ended"


LOST_DRIVER = """
import sys
from pathlib import Path
from pairflow.plan.config import FleetSpec
from pairflow.fleet.pool import Grant, TaskHooks, run_tasks
from test_fleet import pid_then_sleep
d = Path(sys.argv[1])
run_tasks(pid_then_sleep, [{"dir": str(d), "s": 600, "i": i} for i in range(3)], d / "run",
          FleetSpec(2, 0, stall_timeout_s=120), Grant(), "lost",
          TaskHooks(failure_out=lambda p: d / "failures" / f"{p['i']}.json"))
"""


@pytest.mark.slow
def test_a_sigkilled_pool_fails_its_tasks_as_host_oom_or_killed_with_their_slots(tmp_path):
    """Injected: SIGKILL to the worker pool's main process (what the kernel's OOM killer
    does to the largest process). Regression (issue 22): its block's exit 137 reached the
    tasks as Parsl's bad-state error, classed ``other``, with ``slot: null``."""
    proc = _start_driver(LOST_DRIVER, tmp_path)
    try:
        assert len(list(tmp_path.glob("*.pid"))) == 2, f"workers did not start (driver exit {proc.poll()})"
        os.kill(_pool_of(tmp_path), signal.SIGKILL)
        _, err = proc.communicate(timeout=110)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "TaskFailedError" in err, err[-3000:]
    records = {int(f.stem): json.loads(f.read_text()) for f in (tmp_path / "failures").glob("*.json")}
    assert len(records) == 3, err[-3000:]
    assert {r["class"] for r in records.values()} == {"host_oom_or_killed"}, records
    assert all("exit 137" in r["advice"] for r in records.values())
    running = [r["slot"] for r in records.values() if r["slot"]["source"] == "heartbeat"]
    assert len(running) == 2  # the two tasks that were running: their worker's host and device
    assert all(s["host"] and s["device"].startswith("cpu") and s["pid"] for s in running)


def _interchange_of(driver: int) -> int:
    """Parsl's interchange: the driver's child whose command line names it (found by role)."""
    found = [p for p in _children_of(driver) if b"interchange" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.slow
def test_a_killed_interchange_ends_the_job_at_once_and_leaves_nothing(tmp_path):
    """Injected (issue 38): SIGKILL to Parsl's interchange, the broker between the driver
    and its pool. Before, nothing noticed: the pool manager exited after its heartbeat
    threshold (20 s), the job waited out the stall timeout (here 120 s), then Parsl's
    cleanup, asking the dead interchange, its 60 s limit: it ended 185 s after the kill.
    Now the driver sees the interchange's exit at its next poll (``HEARTBEAT_S``) and ends
    the job with InterchangeLostError naming it (9-12 s after the kill), and nothing of the
    job's pool (manager, workers, fork server, Manager server, resource_tracker, watchdog)
    outlives it."""
    proc = _start_driver(LOST_DRIVER, tmp_path)
    try:
        assert len(list(tmp_path.glob("*.pid"))) == 2, f"workers did not start (driver exit {proc.poll()})"
        interchange, pool = _interchange_of(proc.pid), _pool_of(tmp_path)
        group = os.getpgid(pool)
        started = {interchange, *_group(group), *_descendants(pool)}
        assert len(started) >= 6, started  # interchange, pool, fork server, Manager server, two workers
        os.kill(interchange, signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=110)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ended - killed < 20, (ended - killed, err[-3000:])  # the driver polls every HEARTBEAT_S (5 s)
    assert proc.returncode != 0 and "InterchangeLostError" in err, err[-3000:]
    assert f"interchange (pid {interchange}) ended (exit status -9)" in err, err[-3000:]
    assert "3 of 3 tasks unfinished" in err, err[-3000:]
    alive = started
    while alive and time.monotonic() < ended + 20:
        alive = {p for p in alive if _alive(p)}
        time.sleep(0.2)
    assert not alive, f"processes {sorted(alive)} outlived the job by 20 s"
    assert not _group(group), f"pool processes {_group(group)} outlived the job"


def test_a_multi_node_allocation_starts_its_pools_across_the_whole_allocation(tmp_path: Path) -> None:
    """Regression (issue 27, fleet.allocation: study on the two-node cluster): Snakemake's
    Slurm plugin starts the rule as a one-node step with the job's SLURM_* removed; the
    pools' srun ran in that step's environment and failed ("More processors requested
    than permitted"). Across nodes it names the allocation and unsets the step's SLURM_*."""
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODELIST": "n[1-2]", "CUDA_VISIBLE_DEVICES": "0,1"}
    provider = make_config(tmp_path, FleetSpec(1, 0), grant_from_env(env)).executors[0].provider
    overrides = provider.launcher.overrides
    assert "--jobid=77" in overrides and "--nodes=2" in overrides and provider.nodes_per_block == 2
    assert 'grep "^SLURM_"' in provider.worker_init and "orphans" not in provider.worker_init
    one = make_config(tmp_path, FleetSpec(1, 0), grant_from_env({**env, "SLURM_JOB_NUM_NODES": "1"}))
    assert "--jobid" not in one.executors[0].provider.launcher.overrides  # one node: as before
    assert "SLURM_" not in one.executors[0].provider.worker_init


PROBE = """
import json, os, sys
import torch
calls = []
for owner, name in ((torch._C, "_cuda_getDeviceCount"), (torch.cuda, "_lazy_init")):
    real = getattr(owner, name)
    def probe(*a, real=real, name=name, **k):
        calls.append(name)
        return real(*a, **k)
    setattr(owner, name, probe)
os.environ["CUDA_VISIBLE_DEVICES"] = "3"
if sys.argv[1] == "hidden":
    from pairflow.fleet.preload import gpus_hidden
    with gpus_hidden():
        import diffusers, pyiqa, pairflow.metrics, pairflow.stages.combined
else:
    import diffusers, pyiqa, pairflow.metrics, pairflow.stages.combined
print(json.dumps({"calls": calls, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")}))
"""


@pytest.mark.slow
def test_the_fork_server_imports_without_asking_cuda_anything(tmp_path):
    """A process forked after CUDA was initialised cannot use CUDA. Imported plainly,
    diffusers and pyiqa ask the CUDA runtime for its devices (which initialises CUDA on a
    GPU node; this torch is a CUDA build, so the question is asked here too); under
    ``preload.gpus_hidden`` nothing reaches it, and the workers' environment comes back."""
    out = {}
    for mode in ("plain", "hidden"):
        r = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    assert "_cuda_getDeviceCount" in out["plain"]["calls"]  # the probe sees the question when it is asked
    assert out["hidden"] == {"calls": [], "visible": "3", "nvml_check": None}


def test_what_imports_memoised_while_the_gpus_were_hidden_is_forgotten_for_the_workers():
    """A probe memoised under ``gpus_hidden`` ("is CUDA available?": no) would tell every
    forked worker the same: transformers' and diffusers' memoised answers are cleared."""
    from diffusers.utils.torch_utils import get_device
    from transformers.utils import import_utils

    from pairflow.fleet.preload import gpus_hidden

    with gpus_hidden():
        import_utils.is_torch_cuda_available()
        get_device()
        assert import_utils.is_torch_cuda_available.cache_info().currsize == 1
    assert import_utils.is_torch_cuda_available.cache_info().currsize == 0
    from diffusers.utils.torch_utils import TorchDeviceBackend
    assert TorchDeviceBackend._detect_device_type.cache_info().currsize == 0


def test_preload_imports_the_warm_ups_modules_and_the_models_pipeline_modules(tiny_model, tmp_path):
    """What the fork server holds (pairflow.fleet.preload): every listed module and each library
    the model's ``model_index.json`` names; a missing model folder imports no pipeline module.
    Its phase goes to the job's phases folder, where the driver's PhaseWatch logs it."""
    from pairflow.fleet import preload, telemetry, workerpool

    # A pool whose tasks do not warm up (no PAIRFLOW_PRELOAD) imports nothing and says nothing.
    assert preload.preload({workerpool.PRELOAD_PHASES_VAR: str(tmp_path / "phases")}) == []
    assert not (tmp_path / "phases").exists()
    on = {workerpool.PRELOAD_VAR: "1"}
    assert preload.preload({**on, workerpool.PRELOAD_MODEL_VAR: "/nonexistent"}) == []
    assert preload.preload({**on, workerpool.PRELOAD_MODEL_VAR: str(tiny_model),
                            workerpool.PRELOAD_PHASES_VAR: str(tmp_path / "phases")}) == []
    (phase,) = tmp_path.joinpath("phases").glob(telemetry.FORK_SERVER + "-*.json")
    assert json.loads(phase.read_text())["phase"] == "imports done: forking the workers"
    index = json.loads((tiny_model / "model_index.json").read_text())
    libraries = {v[0] for v in index.values() if isinstance(v, list) and len(v) == 2 and v[0]}
    assert libraries and libraries | set(preload.MODULES) <= set(sys.modules)


def visible_device(p: dict) -> dict:
    time.sleep(p["s"])
    return {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "parent": Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode(),
            "torch": "torch" in sys.modules}


def test_two_workers_per_gpu_each_see_only_their_device_past_parsls_mps_rewrite(tmp_path, monkeypatch):
    """Parsl's worker divides an integer device name by workers // ``nvidia-smi -L``'s count
    (its MPS convention): two workers listed on device 1 of a one-GPU listing would both get
    1 // 2 = device 0. A stand-in ``nvidia-smi`` listing one GPU makes the worker take that
    branch on this machine (Parsl also caps a pool at one worker per core: two here)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    grant = Grant(accelerators=("1",), gpus={"1": "1"})
    out = run_tasks(visible_device, [{"s": 1.0}] * 6, tmp_path / "run", FleetSpec(1, 0, worker_start="forkserver"),
                    grant, "pack",
                    TaskHooks(tmp_path / "tel.json", warm=(sleep_task, {"s": 0})),
                    Packing(per_gpu=2, record={"source": "test"}))
    seen = {r["pid"]: r["visible"] for r in out}
    assert sorted(seen.values()) == ["1,-1", "1,-1"], seen  # two workers, both on device 1 alone
    # fleet.worker_start: forkserver (by name: auto spawns on a GPU job): forked from the pool's
    # fork server, which imported torch for them (the job warms up), pinned after the fork
    assert all("multiprocessing.forkserver" in r["parent"] and r["torch"] for r in out), out
    t = json.loads((tmp_path / "tel.json").read_text())
    assert t["packing"] == {"source": "test", "workers_per_gpu": 2, "workers_per_node": 2}
    assert {s["gpu_index"] for s in t["spans"]} == {"1"} and list(t["slots"]) == [f"{t['spans'][0]['host']}/gpu1"]


TWO_AT_ONCE = """
import sys
from pathlib import Path
import pairflow.fleet.sites.base as base
from pairflow.plan.config import FleetSpec
from pairflow.fleet.pool import Grant, noop, run_tasks
d, low = Path(sys.argv[1]), int(sys.argv[2])
base.WORKER_PORTS = (low, low + 5)  # five ports, one held by the test
out = run_tasks(noop, [{}] * 4, d / "run", FleetSpec(1, 0), Grant(), "ports")
print("results", len(out), (d / "run" / "workers").glob("worker-port-*").__next__().read_text())
"""


@pytest.mark.slow
def test_two_executors_started_at_once_on_one_host_never_collide_on_a_port(tmp_path):
    """Regression (issue 38 faults, item 3): ports were chosen by bind-then-close and bound by the
    interchange a second later, and another job's socket took one in between (1 of 16 CI
    jobs failed). Now each interchange binds a port of its range itself, trying the next
    when one is taken: two jobs started at once, in a range of five ports of which the
    test holds one, both run, on different ports."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        low = held.getsockname()[1] - 1  # the range holds the taken port in its middle
        procs = []
        for n in range(2):
            (tmp_path / str(n)).mkdir()
            procs.append(subprocess.Popen([sys.executable, "-c", TWO_AT_ONCE, str(tmp_path / str(n)), str(low)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    ports = {o.split()[-1] for o, _ in outs}
    assert all("results 4" in o for o, _ in outs) and len(ports) == 2, outs
    assert str(low + 1) not in ports and ports <= {str(q) for q in range(low, low + 5)}

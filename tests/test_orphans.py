"""orphans: processes identified by PID and start time; a job ends when its parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pairflow.fleet.orphans import alive, end_group, group_members, start_time

CHILD = """
import sys, time
from pairflow.fleet.orphans import snakemake_ancestors, watch_ancestors
watched = snakemake_ancestors()
watch_ancestors(watched)
print(len(watched), flush=True)
time.sleep(120)
"""


def test_a_reused_pid_is_not_the_watched_process() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        started = start_time(proc.pid)
        assert started is not None and alive(proc.pid, started)
        assert not alive(proc.pid, started + 1)  # same PID, another process
    finally:
        proc.kill()
        proc.wait()
    assert not alive(proc.pid, started)


def test_a_job_whose_parent_is_sigkilled_ends_itself(tmp_path: Path) -> None:
    """Injected: SIGKILL to the parent (standing in for Snakemake) of a process that
    watches its ancestors; it must end within seconds instead of running on."""
    out = tmp_path / "child.pid"
    parent = subprocess.Popen(["bash", "-c", f'{sys.executable} -c "$0" & echo $! > {out}; wait', CHILD],
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdout.readline().strip() == "1"  # watches bash, its parent
    child = int(out.read_text())
    assert alive(child, None)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while alive(child, None) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(child, None), "the child outlived its parent by 15 s"


# --- a pool manager killed while its job runs on ---------------------------------------

KILLED_MANAGER = """
import sys
from pathlib import Path
from pairflow.plan.config import FleetSpec
from pairflow.fleet.pool import Grant, run_tasks
from test_fleet import pid_then_sleep
d, start = Path(sys.argv[1]), sys.argv[2]
try:
    run_tasks(pid_then_sleep, [{"dir": str(d), "s": 600, "i": i} for i in range(2)], d / "run",
              FleetSpec(2, 0, stall_timeout_s=120, worker_start=start), Grant(), "orphans")
finally:
    print("job ended", flush=True)
"""


def _tree(pid: int) -> dict[int, int | None]:
    """``pid`` and every process below it (PID -> start time), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(stat.parent.name))
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        out[p] = start_time(p)
        todo += children.get(p, [])
    return out


def _pool(tmp_path: Path) -> int:
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmd.read_bytes()
        except OSError:
            continue
        if b"pairflow.fleet.workerpool" in text and str(tmp_path).encode() in text:
            return int(cmd.parent.name)
    raise AssertionError("no worker pool found")


@pytest.mark.slow
@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_a_sigkilled_pool_manager_leaves_no_process_of_its_pool_behind(tmp_path: Path, start: str) -> None:
    """Regression (issue 38 faults, item 1, CI cluster): a SIGKILL of one node's pool manager left its
    ``resource_tracker`` and a ``spawn_main`` child (a busy worker, the Manager server) alive
    for 8 min after the job ended, holding the Slurm step's pipes. Now every process the
    manager starts gets the parent-death signal and the job ends its pool's process group:
    nothing of the pool is left 20 s after the job ends (measured: none left at the end)."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MANAGER, str(tmp_path), start], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))})
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(list(tmp_path.glob("*.pid"))) == 2, f"workers did not start (driver exit {proc.poll()})"
        manager = _pool(tmp_path)
        tree = _tree(manager)  # workers, Manager server, resource_tracker (and the fork server)
        assert len(tree) >= 4 and any(b"resource_tracker" in Path(f"/proc/{p}/cmdline").read_bytes() for p in tree)
        os.kill(manager, signal.SIGKILL)
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "job ended" in out and "TaskFailedError" in err, err[-3000:]  # retries 0: the tasks fail as killed
    deadline = time.monotonic() + 20
    left = tree
    while left and time.monotonic() < deadline:
        left = {p: s for p, s in left.items() if alive(p, s)}
        time.sleep(0.2)
    assert not left, {p: Path(f"/proc/{p}/cmdline").read_bytes() for p in left}


def test_end_group_ends_a_process_group_and_never_its_own() -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert group_members(proc.pid) == [proc.pid]
        assert end_group(os.getpgrp()) == []  # this process's own group: untouched
        assert end_group(proc.pid, grace_s=5) == [proc.pid]
        proc.wait(timeout=5)
        assert proc.returncode == -signal.SIGTERM and group_members(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_die_with_parent_arms_the_signal_and_says_whether_the_parent_is_still_there() -> None:
    code = ("import os, sys; from pairflow.fleet.orphans import die_with_parent; "
            "print(die_with_parent(os.getppid()), die_with_parent(os.getppid() + 1))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


def test_the_rule_of_a_job_process_is_read_from_its_command_line(tmp_path: Path) -> None:
    """What Snakemake's interrupt line names: a rule script runs as
    ``.snakemake/scripts/tmp<random>.<rule>.py``, under a shell or not."""
    from pairflow.fleet.orphans import _rule_of, interrupted

    job = subprocess.Popen(["bash", "-c", f"sleep 30; : {tmp_path}/.snakemake/scripts/tmpq1w2e3.generate_score_panel.py"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert _rule_of(job.pid) == "generate_score_panel"
        assert _rule_of(other.pid) is None and _rule_of(2**22 + 1) is None  # not a job; no such process
    finally:
        for p in (job, other):
            p.kill()
            p.wait()
    assert interrupted() is None  # no signal stopped this process

"""orphans: processes identified by PID and start time; a job ends when its parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pairflow.fleet.orphans import alive, start_time

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

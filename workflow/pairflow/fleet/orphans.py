"""No process outlives the job that started it.

A panel job is a chain: Snakemake → the rule script (the Parsl driver) → Parsl's
interchange (a child of the driver) and one worker pool per block (started by Parsl's
LocalProvider in a process group of its own, reparented to init once its launching shell
exits). A SIGKILL to any link leaves the rest running, holding the panel lock and the
allocation. Each link therefore watches the one above it and ends itself:

* the rule script watches Snakemake (``watch_ancestors``) and on its death turns it into
  the SIGTERM that ``fleet.run_tasks`` already handles (Parsl cleaned up, lock released);
* the interchange gets ``PR_SET_PDEATHSIG`` (``python -m pairflow.fleet.orphans exec``), so the
  kernel signals it when the driver dies, and ignores SIGINT (a Ctrl-C reaches the whole
  process group; the driver shuts it down);
* each worker pool runs a watchdog (``python -m pairflow.fleet.orphans watch``) in its own
  process group that, when the driver is gone, signals that process group: the manager,
  its workers and multiprocessing's helper processes, and nothing else.
* below a pool manager, every process it starts (spawned workers, the Manager server, the
  fork server and what that forks) gets the parent-death signal (``die_with_parent``,
  ``workerpool``), so a SIGKILL of the manager ends its workers at once; multiprocessing's
  ``resource_tracker`` then reads the end of its pipe and exits. (Under Slurm with
  ``proctrack/linuxproc`` a reparented child escapes the step, holds its output pipes and
  keeps the job COMPLETING.)
* when the job ends, whatever is left of its pools' process groups is ended
  (``end_group``, from ``fleet.run_tasks``): by process group, which this job created.

Processes are identified by PID *and* start time (``/proc/<pid>/stat``), so a reused PID
is never mistaken for the watched process; nothing is ever found or killed by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from ..errors import ProcessError

log = logging.getLogger(__name__)

POLL_S = 1.0
"""How often a watcher looks at the process it watches."""
GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL when a watchdog ends its process group."""
PR_SET_PDEATHSIG = 1


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(pid: int, started: int | None) -> bool:
    """Whether process ``pid`` that started at ``started`` still runs (not a zombie, not a reused PID)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _is_snakemake(cmdline: bytes) -> bool:
    """Whether a command line runs Snakemake (``snakemake ...`` or ``python -m snakemake ...``)."""
    args = [a for a in cmdline.split(b"\0") if a][:3]
    return any(os.path.basename(a) == b"snakemake" for a in args)


def snakemake_ancestors(max_depth: int = 6) -> list[tuple[int, int | None]]:
    """This process's ancestors up to and including the outermost Snakemake process within
    ``max_depth`` levels (only the parent when there is none). Snakemake may start a rule
    script directly, through ``bash -c`` or through a job-runner Snakemake of its own;
    each link must be watched."""
    chain: list[tuple[int, int | None]] = []
    last = 0
    pid = os.getpid()
    for _ in range(max_depth):
        try:
            pid = _parent(pid)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            break
        if pid <= 1:
            break
        chain.append((pid, start_time(pid)))
        if _is_snakemake(cmd):  # identifies the process to watch; never a kill criterion
            last = len(chain)
    if last:
        return chain[:last]
    return chain[:1]  # empty when the parent is already gone (reparented to init)


def watch_ancestors(ancestors: list[tuple[int, int | None]] | None = None) -> threading.Thread:
    """Start a daemon thread that sends this process SIGTERM when any of ``ancestors``
    (default ``snakemake_ancestors()``) dies, and exits it hard ``GRACE_S`` * 3 seconds
    later if cleanup hangs. A rule script's SIGTERM handler (``fleet.run_tasks``) then
    shuts Parsl down and the panel lock is released."""
    watched = ancestors if ancestors is not None else snakemake_ancestors()

    def run() -> None:
        # No ancestor at all: reparented to init already, the parent died before we looked.
        while watched and all(alive(p, s) for p, s in watched):
            time.sleep(POLL_S)
        gone = [p for p, s in watched if not alive(p, s)]
        log.error("parent process %s died; stopping this job and its Parsl workers", gone)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S * 3)
        os._exit(128 + signal.SIGTERM)

    thread = threading.Thread(target=run, name="pairflow-parent-watch", daemon=True)
    thread.start()
    return thread


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            out += [int(x) for x in task.read_text().split()]
    return out


_INTERRUPTED: list[int] = []
"""The signal that stopped this Snakemake run, once one arrived (``stop_jobs_on_signal``)."""


def stop_jobs_on_signal(console: logging.Logger | None = None) -> None:
    """For Snakemake's own process (the workflow's ``onstart`` hook): on SIGTERM or SIGINT,
    say in one line what is stopped and how to resume, pass SIGINT to each running job's
    process and stop Snakemake as Ctrl-C does.

    Snakemake's own SIGTERM handler waits for the running jobs to finish (a panel job runs
    for hours) and its Ctrl-C handler waits for them too without telling them; each job
    (``fleet.run_tasks``) shuts its worker pool down and exits within seconds of SIGINT or
    SIGTERM, and another rule script ends at its KeyboardInterrupt.
    Snakemake starts a rule script as its own child; where a shell stands between them,
    the shell ends and the script follows its parent's death (``watch_ancestors``).
    After that line Snakemake's console says nothing more (``RuleException`` and
    ``WorkflowError`` for each job it stopped, "Terminating processes..."): ``console``,
    Snakemake's logger, keeps writing them to its log file only, and the workflow's
    ``onerror`` ends the run with ``interrupted``'s code."""

    def stop(signum: int, frame: object) -> None:
        if _INTERRUPTED:
            return
        _INTERRUPTED.append(signum)
        jobs = _children(os.getpid())
        rules = sorted({r for r in map(_rule_of, jobs) if r})
        what = (f"{len(jobs)} running job(s){' (' + ', '.join(rules) + ')' if rules else ''}, each with its "
                "Parsl workers" if jobs else "the run (no job left running)")
        print(f"pairflow: {signal.Signals(signum).name} received: stopped {what}; completed candidates are kept: "
              "run the same command again to resume (Snakemake's account: .snakemake/log/)", file=sys.stderr,
              flush=True)
        if console is not None:
            _quiet_console(console)
        for pid in jobs:
            # The rule script gets SIGINT, as from a terminal's Ctrl-C: a job says that in its
            # log only (this line is the console's). A shell between them gets SIGTERM (a
            # shell waits for its child on SIGINT); the script sees it die (watch_ancestors).
            shell = _comm(pid) in SHELLS
            for script in _children(pid) if shell else [pid]:
                with contextlib.suppress(OSError):
                    os.kill(script, signal.SIGINT)
            if shell:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


SHELLS = ("bash", "sh", "dash", "zsh")
"""Process names of the shell Snakemake may run a rule's script under."""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def interrupted() -> int | None:
    """The exit code of a run ``stop_jobs_on_signal`` stopped (128 + the signal), else None."""
    return 128 + _INTERRUPTED[0] if _INTERRUPTED else None


def _rule_of(pid: int) -> str | None:
    """The rule a job process runs, from its command line: Snakemake runs a rule's script as
    ``.snakemake/scripts/tmp<random>.<rule>.py`` (through a shell or not)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    found = re.search(r"\.snakemake/scripts/tmp[^/\s\x00.]*\.(\w+)\.py", argv)
    return found.group(1) if found else None


def _quiet_console(console: logging.Logger) -> None:
    """Drop whatever ``console`` logs to a stream from now on; its file handlers keep it."""
    for handler in console.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.addFilter(lambda record: False)


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies excluded) of process group ``pgid``, from ``/proc``: a group
    outlives its leader while any member runs, and a member reparented to init stays in it."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(stat.parent.name))
    return out


def end_group(pgid: int, grace_s: float = 3.0) -> list[int]:
    """End what is left of process group ``pgid`` (a worker pool's, which this job
    started: ``LocalProvider`` puts each block in a group of its own): SIGTERM, up to
    ``grace_s`` seconds to exit, then SIGKILL. Never this process's own group. Returns
    the members found at first (empty when the pool had already ended cleanly)."""
    if pgid == os.getpgrp():
        return []
    found = group_members(pgid)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            break
        with contextlib.suppress(OSError):
            os.killpg(pgid, signum)
        deadline = time.monotonic() + grace_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return found


def watch_command(pid: int) -> str:
    """Shell line (for Parsl's ``worker_init``) that starts a watchdog in the background
    for the worker pool's process group, watching process ``pid`` (the driver)."""
    started = start_time(pid)
    return f"{sys.executable} -m pairflow.fleet.orphans watch {pid} {started} &"


def exec_command(pid: int, argv: list[str]) -> list[str]:
    """argv that runs ``argv`` with the kernel's parent-death signal set (for the interchange)."""
    return [sys.executable, "-m", "pairflow.fleet.orphans", "exec", str(pid), *argv]


def _watch(pid: int, started: int | None) -> None:
    group = os.getpgid(0)
    while alive(pid, started):
        time.sleep(POLL_S)
    # The pool's own process group (Parsl's LocalProvider starts each block with setpgrp);
    # this watchdog is in it too and goes last.
    os.killpg(group, signal.SIGTERM)
    time.sleep(GRACE_S)
    os.killpg(group, signal.SIGKILL)


def die_with_parent(parent: int, signum: int = signal.SIGKILL, what: str = "this process") -> bool:
    """Have the kernel send this process ``signum`` when the thread that started it ends
    (``prctl(PR_SET_PDEATHSIG)``; Linux), and say whether ``parent`` is still this
    process's parent (False: it died before the signal was armed, and no signal will
    come: the caller exits). Raises ProcessError where prctl fails (not Linux). The
    signal survives ``exec``; it follows the *thread* that forked, so a parent must
    start such children from a thread that lives as long as they should."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise ProcessError(f"prctl(PR_SET_PDEATHSIG) failed for {what} ({os.strerror(errno)}, errno {errno}); "
                           "PairFlow's worker pools need Linux: run on a Linux host")
    return os.getppid() == parent


def _exec(pid: int, argv: list[str]) -> None:
    # A Ctrl-C reaches the whole foreground process group, the interchange included; the
    # driver then shuts Parsl down through the interchange, which must still be there.
    # (SIG_IGN survives exec; SIGTERM stays, as Parsl's shutdown ends the interchange with it.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not die_with_parent(pid, signal.SIGTERM, "the pool's interchange"):  # the driver died before it was armed
        sys.exit(1)
    os.execvp(argv[0], argv)


def main(argv: list[str]) -> None:
    if argv[:1] == ["watch"]:
        _watch(int(argv[1]), None if argv[2] == "None" else int(argv[2]))
    elif argv[:1] == ["exec"]:
        _exec(int(argv[1]), argv[2:])
    else:
        raise SystemExit("usage: python -m pairflow.fleet.orphans watch PID START | exec PID ARGV...")


if __name__ == "__main__":
    main(sys.argv[1:])

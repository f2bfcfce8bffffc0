"""Parsl's worker pool with its workers forked from a fork server that already holds the
work's imports (``fleet.worker_start: forkserver``, and ``auto``, the default, on jobs without
a GPU; ``spawn`` runs the same pool on the spawn context: fresh interpreters).

Parsl's ``process_worker_pool`` starts its multiprocessing Manager server and every worker
with ``parsl.multiprocessing.SpawnContext``: each is a fresh interpreter that imports Parsl,
then the warm-up imports torch, diffusers, the pipeline's modules and pyiqa, one process
after another. Measured 2026-12-02 on the local study (BENCHMARKS.md, issue 25): the
manager's Parsl import plus its spawned Manager server took 1.6-2.0 s and each spawned
worker's Parsl import and registration 1.1-1.5 s, all before the 4-8 s of warm-up imports.

``python -m pairflow.fleet.workerpool <Parsl's pool arguments>`` (the executor's ``launch_cmd``,
``sites.base.launch_command``) instead starts a ``forkserver`` at once, preloading
``pairflow.fleet.preload`` (torch, diffusers, pyiqa, the scorers, the model's pipeline modules,
Parsl's pool module), so those imports run beside the manager's own Parsl import; it then
hands Parsl that context in place of ``SpawnContext`` and runs Parsl's pool module as
``__main__`` unchanged. Every worker (and the Manager server) is forked from the fork
server, never from the manager and its threads. The server runs one Python thread (its
imports leave two idle native threads, torch's and pyiqa's, as in any process that
forks DataLoader workers after ``import torch``) and imports with the GPUs hidden
(``preload.gpus_hidden``), so it never initialises CUDA and a fork is safe; Parsl pins
each worker's accelerator (``CUDA_VISIBLE_DEVICES``) inside the forked worker as before,
and CUDA reads it at the worker's first use.

Faults. A killed worker is Parsl's to handle, as under spawn: the fork server reports its
exit, Parsl fails its task as ``WorkerLost`` (retried) and forks a replacement. Two
processes the pool cannot run without are watched here (``watch``): the fork server (our
child; no worker can be started without it) and Parsl's Manager server (every worker
takes and reports tasks through it). When either ends while Parsl's pool runs, the pool
manager says which on stderr (the block's stderr, which Parsl's error carries to the
driver), SIGKILLs the fork server and exits with ``EXIT_CODE`` within ``WATCH_S``: its
tasks fail as a killed pool's do (``host_oom_or_killed``) and are retried on another pool
or rerun. Every process the fork server forks gets the kernel's parent-death signal
(``bind_children``), so the workers and the Manager server end with their fork server
and nothing of the pool is left behind. Before this, a dead fork server made Parsl see
every worker dead and fork new ones from a fork server it started again while the old
workers ran on, and a dead Manager server left the pool spinning on a broken pipe.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, StalledError
from . import orphans

POOL_MODULE = "parsl.executors.high_throughput.process_worker_pool"
"""Parsl's worker pool, run as ``__main__`` here."""
PRELOAD_MODULE = "pairflow.fleet.preload"
"""What the fork server imports before it forks any worker."""
PRELOAD_VAR = "PAIRFLOW_PRELOAD"
"""``1`` when the job's tasks warm up (torch, diffusers, pyiqa, a model): the fork server
then imports ``preload.MODULES``; unset, it imports Parsl's pool module only, so a pool of
light tasks (``pairflow probe-slots``' no-ops, tests' sleeps) is not charged seconds of
imports it never uses. The driver sets it (``fleet.run_tasks``) and the pool inherits it."""
PRELOAD_MODEL_VAR = "PAIRFLOW_PRELOAD_MODEL"
"""The model's folder (holding ``model_index.json``) whose pipeline modules the fork server
imports (``preload``); the driver sets it (``fleet.run_tasks``) and the pool inherits it."""
PRELOAD_PHASES_VAR = "PAIRFLOW_PRELOAD_PHASES"
"""The job's start-up phases folder (``telemetry.PHASES_DIR``): the fork server names its
import phase there, so the driver's log is not silent while it imports (``preload``)."""
MANAGER_PID_VAR = "PAIRFLOW_POOL_MANAGER_PID"
"""The pool manager's PID, for its workers: their parent is the fork server (``startup.worker_marks``)."""


WATCH_S = 0.5
"""How often the pool manager looks at its fork server (the Manager server's end wakes it at once)."""
EXIT_CODE = 128 + signal.SIGKILL
"""The pool manager's exit status when its fork server or Manager server ended: a killed
pool's (``fleet.classify_failure``: ``host_oom_or_killed``); neither ends on its own."""
_WATCHED: dict[int, str] = {}
"""Sentinel (fd) of each process the pool cannot run without → what to call it."""
_RUNNING = threading.Event()
"""Set while Parsl's pool runs: an end before or after it is the pool's own shutdown."""


class _BoundProcess(multiprocessing.context.SpawnProcess):
    """A spawned process (a Parsl worker, the Manager server) that the kernel SIGKILLs when
    the pool manager that spawned it dies (``orphans.die_with_parent``). Parsl's worker looks
    at its manager only between tasks, and the Manager server never: after a SIGKILL of the
    manager both ran on (measured on the CI cluster: 8 min, with multiprocessing's
    ``resource_tracker``, holding the Slurm step's pipes). Pickled to the child by
    reference, so it must stay a module-level class of this module."""

    def run(self) -> None:
        parent = getattr(self, "_parent_pid", None)  # BaseProcess sets it in the spawning process
        if parent is not None and not orphans.die_with_parent(parent, signal.SIGKILL, f"{self.name}"):
            os._exit(EXIT_CODE)  # the manager died before the signal was armed
        super().run()


class _SpawnContext(multiprocessing.context.SpawnContext):
    """Parsl's ``SpawnContext`` whose processes end with the pool manager (``fleet.worker_start: spawn``)."""

    Process = _BoundProcess


class _Context(multiprocessing.context.ForkServerContext):
    """The fork-server context Parsl's pool is handed in place of ``SpawnContext``; its
    Manager server is watched (``watch``)."""

    def Manager(self) -> Any:  # multiprocessing's name
        manager = super().Manager()
        process = getattr(manager, "_process", None)  # BaseManager's server process (private, stable since 3.0)
        if process is not None:
            _WATCHED[process.sentinel] = f"Parsl's Manager server (pid {process.pid})"
        return manager


def bind_children(manager: int | None = None) -> None:
    """In the fork server (``preload``): the server itself gets SIGKILL from the kernel
    when the pool manager ``manager`` (its parent) dies, and every process it forks
    (workers, the Manager server) when the server dies; each exits at once if its parent
    died before that was armed. Forks made later inside a worker are left alone."""
    if manager is not None and not orphans.die_with_parent(manager, signal.SIGKILL, "the pool's fork server"):
        os._exit(EXIT_CODE)
    server, forking = os.getpid(), [0]
    libc = ctypes.CDLL(None, use_errno=True)

    def before() -> None:
        forking[0] = os.getpid()

    def child() -> None:
        if forking[0] != server:
            return
        if libc.prctl(orphans.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            print(f"pairflow.fleet.workerpool: prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()}): "
                  "this process will not end with its fork server", file=sys.stderr, flush=True)
        elif os.getppid() != server:
            os._exit(EXIT_CODE)

    os.register_at_fork(before=before, after_in_child=child)


def watch(server: int) -> None:
    """Until the process exits: when the fork server ``server`` or a watched Manager server
    ends while Parsl's pool runs, say which, end the fork server (and with it every
    process it forked) and exit with ``EXIT_CODE``."""
    started = orphans.start_time(server)
    while True:
        ready = multiprocessing.connection.wait(list(_WATCHED), timeout=WATCH_S)
        if not _RUNNING.is_set():  # before or after Parsl's pool: its own start or shutdown
            if ready:
                _WATCHED.clear()
            continue
        if not orphans.alive(server, started):
            _end(f"the pool's fork server (pid {server})")
        for sentinel in ready:
            _end(_ended(sentinel, server))


def _ended(sentinel: Any, server: int) -> str:
    """What a ready sentinel says ended: the fork server writes a child's exit status there
    (its own death, which kills the child too, leaves only the end of the pipe, and may
    show here a moment before the server shows as dead)."""
    try:
        code = multiprocessing.forkserver.read_signed(sentinel)
    except (OSError, EOFError):
        return f"the pool's fork server (pid {server})"
    return f"{_WATCHED.get(sentinel, 'a watched process')} (exit status {code})"


def _end(gone: str) -> None:
    print(f"pairflow.fleet.workerpool: {gone} ended while the pool ran: its workers cannot take, run or report tasks. "
          f"Ending this worker pool (exit {EXIT_CODE}, as a killed pool) with every process its fork server "
          "forked; its tasks fail as host_oom_or_killed and are retried on another pool or by a rerun. If this "
          "repeats, check the node's memory (dmesg, journalctl -k: oom-kill), or set fleet.worker_start: spawn",
          file=sys.stderr, flush=True)
    with contextlib.suppress(OSError, TypeError):  # the current fork server (multiprocessing may have started another)
        os.kill(multiprocessing.forkserver._forkserver._forkserver_pid, signal.SIGKILL)  # type: ignore[attr-defined]
    os._exit(EXIT_CODE)


START_OPTION = "--start="
"""This module's first argument: ``--start=forkserver`` or ``--start=spawn`` (``fleet.worker_start``)."""
PORT_FILE_OPTION = "--port-file="
"""Then, optionally: where the driver writes the interchange's worker port once it has
bound one (``executor.EarlyPoolExecutor``); the pool's ``--port=None`` becomes that port."""
PORT_WAIT_S = 120.0
"""How long a pool waits for the port file (Parsl's own wait for its interchange: 120 s)."""


def own_options(argv: list[str]) -> tuple[str, Path | None, list[str]]:
    """(start method, port file or None, Parsl's pool arguments) from this module's argv.
    Raises ConfigError for a start method that is neither ``forkserver`` nor ``spawn``."""
    start, port_file, rest = "forkserver", None, list(argv)
    while rest and rest[0].startswith((START_OPTION, PORT_FILE_OPTION)):
        arg = rest.pop(0)
        if arg.startswith(START_OPTION):
            start = arg[len(START_OPTION):]
        else:
            port_file = Path(arg[len(PORT_FILE_OPTION):])
    if start not in ("forkserver", "spawn"):
        raise ConfigError(f"pairflow.fleet.workerpool {START_OPTION}{start}: the start method is forkserver or spawn "
                          "(fleet.worker_start)")
    return start, port_file, rest


def wait_port(port_file: Path, timeout_s: float = PORT_WAIT_S) -> int:
    """The worker port the driver wrote to ``port_file`` (polled every 50 ms). Raises
    StalledError when none came within ``timeout_s`` (the interchange never bound one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, ValueError):
            return int(port_file.read_text())
        if time.monotonic() > deadline:
            raise StalledError(f"no worker port in {port_file} within {timeout_s:.0f}s: the job's interchange did not "
                               "start (see the job's log); this worker pool exits")
        time.sleep(0.05)


def with_port(argv: list[str], port: int) -> list[str]:
    """Parsl's pool arguments with the unknown port (``--port=None``) set to ``port``."""
    return [f"--port={port}" if a == "--port=None" else a for a in argv]


def main() -> None:
    """Start the fork server (its imports begin now) and its watchdog, then run Parsl's pool
    on it; under ``--start=spawn``, run Parsl's pool with workers that end with it."""
    start, port_file, rest = own_options(sys.argv[1:])
    sys.argv[1:] = rest
    os.environ[MANAGER_PID_VAR] = str(os.getpid())
    context: multiprocessing.context.BaseContext
    if start == "forkserver":
        context = _Context()
        context.set_forkserver_preload([POOL_MODULE, PRELOAD_MODULE])
        multiprocessing.forkserver.ensure_running()
        server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        threading.Thread(target=watch, args=(server,), name="pairflow-forkserver-watch", daemon=True).start()
    else:  # by its importable name: run as __main__, this module's classes would not unpickle in a child
        context = importlib.import_module(__spec__.name if __spec__ else __name__)._SpawnContext()
    # lazy: Parsl takes about a second to import; the fork server's imports run beside it
    import parsl.multiprocessing

    parsl.multiprocessing.SpawnContext = context  # type: ignore[assignment]  # same API, bound workers
    if port_file is not None:
        importlib.import_module(POOL_MODULE)  # its imports, while the interchange binds a port
        sys.argv[1:] = with_port(sys.argv[1:], wait_port(port_file))
    _RUNNING.set()
    try:
        runpy.run_module(POOL_MODULE, run_name="__main__", alter_sys=True)
    finally:
        _RUNNING.clear()  # Parsl's pool is done: the Manager server and the fork server end as it exits


if __name__ == "__main__":
    main()

"""Fan-out of a panel's candidates through a Parsl HighThroughputExecutor.

Provider → launcher → executor, composed by constructor in the job's site (``sites``:
its Config is logged verbatim, as ``repr``, and kept in the telemetry record). One block
is this job's allocation: locally one worker pool on this machine; inside a Slurm job one
pool per allocated node, started with ``srun``. Each pool runs ``Packing.per_gpu``
workers (one unless the calibration table shows more fit: ``calibrate.workers_for``) on
each accelerator the job was granted (``sites.accelerators``: ``CUDA_VISIBLE_DEVICES``,
``NVIDIA_VISIBLE_DEVICES``, checked against torch; never a hard-coded list), each pinned
by Parsl to its device, or ``Packing.cpu_workers`` workers where there is none. Workers are
long-lived processes: the pipeline and scorers a task loads stay loaded for the next
task (see ``generate.LOAD_COUNTS``).

Lifetimes are bounded: an idle block is released after ``idle_timeout_s``; a failed
task is retried ``retries`` times, and a task that still fails is classified (device
out of memory, host out of memory or killed, other) in a failure record. Every task
leaves a span (queued, started, finished, slot) in the job's telemetry record.

Parsl's own checkpointing keys on function name and arguments only, so resume is done
per candidate from the project's atomically written records instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import progress
from ..atomic import FULL, no_space
from ..errors import InterchangeLostError, PairFlowError, StalledError, StorageError, TaskError, TaskFailedError
from ..plan.config import FleetSpec
from ..records.store import write_record
from . import orphans
from .sites import ONE_PER_GPU, Packing, make_config
from .sites import Grant as Grant  # re-exported: run_tasks' callers name the grant they pass from here
from .sites.base import node_name, slot_gpu
from .sites.slurm import allocation_start, node_names
from .startup import MARKS, mark
from .telemetry import (
    Sampler,
    job_window,
    nvml_reader,
    process_start,
    progress_line,
    slot_name,
    work_elapsed,
    write_telemetry,
)
from .workerpool import PRELOAD_MODEL_VAR, PRELOAD_PHASES_VAR, PRELOAD_VAR

log = logging.getLogger(__name__)

# --- runs on the worker ------------------------------------------------------------------

def slot_identity() -> dict[str, Any]:
    """Where this worker process physically runs: host (the scheduler's node name where
    there is one, ``sites.base.node_name``), Parsl worker rank, the device index it sees,
    the node's physical GPU index and that GPU's UUID (where CUDA exists)."""
    visible, host = os.environ.get("CUDA_VISIBLE_DEVICES"), node_name(os.environ)
    return {"host": host, "pid": os.getpid(), "rank": os.environ.get("PARSL_WORKER_RANK"),
            "visible_devices": visible, "gpu_index": slot_gpu(os.environ, host),
            "gpu_uuid": _gpu_uuid(), "slurm_job": os.environ.get("SLURM_JOB_ID")}


def _gpu_uuid() -> str | None:
    """UUID of the process's logical device 0 (the physical GPU it uses), or None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(0).uuid)


def worker_identity() -> dict[str, Any]:
    """Who ran a task: the physical slot (see ``slot_identity``) under the keys records
    have always carried (``host``, ``pid``, ``slot`` = the Parsl worker rank)."""
    s = slot_identity()
    return {**s, "slot": s["rank"], "cuda_visible_devices": s["visible_devices"]}


def noop(payload: dict[str, Any]) -> dict[str, Any]:
    """A task that does nothing: measures per-task overhead (``pairflow probe-slots``)."""
    return {}


HEARTBEAT_S = 5.0
"""How often the driver looks at its tasks and the workers' heartbeat files."""
PROGRESS_WRITE_S = 1.0
"""A worker rewrites its heartbeat file at most this often for reports of one kind of work
(a new kind is written at once), however fast its task reports."""
ACTIVE_S = 60.0
"""``pairflow status`` counts a worker active when its heartbeat moved this recently (it
moves on progress: one denoising step of a large model may take tens of seconds)."""


def traced(fn: Callable[[dict[str, Any]], dict[str, Any]], payload: dict[str, Any],
           beat_dir: str | None = None, what: str = "", task: int | None = None,
           phase: str = "task") -> dict[str, Any]:
    """Run one task and return its result with its span (start, finish, slot).

    The worker's heartbeat file ``beat_dir/<host>-<pid>.json`` names the task (``what``,
    its index ``task``, its ``phase``: warm-up or task) and its physical slot; it is
    rewritten when the task starts, whenever the task reports progress
    (``progress.report``: denoising steps, frames encoded, metrics scored; at most every
    ``PROGRESS_WRITE_S``) and when it ends. The driver's stall check reads its mtime, so
    a task blocked anywhere (a hung encoder) stops the heartbeat. Any exception leaves as
    a picklable PairFlowError (see ``portable``), raised outside the ``except`` block so
    no unpicklable ``__context__`` travels with it."""
    started = time.time()
    slot = slot_identity()
    beat = Path(beat_dir) / f"{socket.gethostname()}-{os.getpid()}.json" if beat_dir else None
    state = {"what": what, "task": task, "phase": phase, "since": started, **slot}
    written: list[Any] = [0.0, None]  # when the file was last written, and the kind of work it named

    def sink(note: str) -> None:
        # Throttled per kind of work only: a report of another kind (denoising, then
        # ffmpeg, then a metric) is written at once, so a task that hangs right after a
        # burst of fast steps still names the work it hung in, not the last step written.
        now, kind = time.monotonic(), note.split(" ", 1)[0]
        if beat is not None and (kind != written[1] or now - written[0] >= PROGRESS_WRITE_S):
            written[0], written[1] = now, kind
            # Best effort, as every progress sink: on a full disk the work's own writes
            # name it (StorageError), and a task that cannot write stops its heartbeat.
            with contextlib.suppress(StorageError):
                write_beat(beat, {**state, "progress": note, "at": time.time()})

    if beat is not None:
        write_beat(beat, state)  # a full disk: StorageError at once, before any work is spent
    try:
        with progress.reporting_to(sink):
            result = fn(payload)
    except Exception as e:
        error = portable(e)
        error.pairflow_slot = {**slot, "started": started}  # type: ignore[attr-defined]  # travels pickled
        if beat_dir:  # Parsl retries drop this attempt's exception: keep its slot time for the ledger
            _attempt(Path(beat_dir), task, {"started": started, "finished": time.time(), **slot})
    else:
        return {"result": result, "span": {"started": started, "finished": time.time(), **slot}}
    finally:
        if beat is not None:
            with contextlib.suppress(OSError, StorageError):
                write_beat(beat, {**state, "phase": "idle", "what": f"idle after {what}", "since": time.time()})
    raise error


ATTEMPTS_DIR = "attempts"
"""Beside a job's heartbeat folder: one file per failed attempt of a task (its span), so
slot time spent on attempts Parsl retried, or that failed for good, is counted (ledger)."""


def _attempt(beat_dir: Path, task: int | None, span: dict[str, Any]) -> None:
    """Record one failed attempt's span (``attempts/<task>-<pid>-<start>.json``)."""
    folder = beat_dir.parent / ATTEMPTS_DIR
    with contextlib.suppress(OSError, StorageError):
        folder.mkdir(exist_ok=True)
        write_beat(folder / f"{task}-{os.getpid()}-{span['started']:.6f}.json", {"task": task, **span})


def _attempt_spans(beat_dir: Path, run: _Collect) -> list[dict[str, Any]]:
    """The spans of every failed attempt (``_attempt``): ``failure`` is ``retried`` for an
    attempt of a task that later succeeded (or was retried again), else the task's final
    class; each carries its task's stage and arm."""
    out = []
    for path in sorted((beat_dir.parent / ATTEMPTS_DIR).glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            a = json.loads(path.read_text())
            i = a.pop("task")
            if not isinstance(i, int) or i >= len(run.payloads):
                continue
            final = run.final.get(i)
            out.append({**a, "queued": run.queued.get(i), **run.labels(i), "attempt": True,
                        "failure": final if final is not None and a["started"] == run.last_start.get(i)
                        else "retried"})
    return out


def _attempt_files(beat_dir: Path, task: int) -> list[dict[str, Any]]:
    """The failed-attempt records (``_attempt``) of task ``task``, oldest first."""
    out = []
    for path in (beat_dir.parent / ATTEMPTS_DIR).glob(f"{task}-*.json"):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return sorted((a for a in out if a.get("task") == task), key=lambda a: float(a.get("started", 0)))


def write_beat(path: Path, state: dict[str, Any]) -> None:
    """Replace a heartbeat file in one rename. No fsync (unlike ``atomic``): it is
    ephemeral and written twice per task, and probe-slots measures per-task overhead.
    Raises StorageError (``atomic.no_space``: the path and the fix) when the disk is full
    or over quota, leaving no temporary file; OSError otherwise."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if e.errno in FULL:
            raise no_space(path, e) from e
        raise


TRACEBACK_CHARS = 8000
"""How much of a task's formatted traceback (its tail) travels back to the driver."""


def portable(exc: BaseException) -> PairFlowError:
    """``exc`` as an exception Parsl can carry to the driver and the driver can unpickle.

    A PairFlowError keeps its class and message but loses its ``__cause__`` chain (which
    may hold an unpicklable library exception such as ``ffmpeg.Error``); anything else
    becomes a TaskError naming the original type. Either way ``remote_traceback`` holds
    the worker's formatted traceback, cause chain included.
    """
    text = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
    if isinstance(exc, TaskError):
        return exc
    if isinstance(exc, PairFlowError):
        clean = _rebuilt(exc)
        if clean is not None:
            clean.remote_traceback = text  # type: ignore[attr-defined]
            return clean
    return TaskError(f"{type(exc).__name__}: {exc}", type(exc).__name__,
                     tuple(c.__name__ for c in type(exc).__mro__), text)


# --- runs in the driver -------------------------------------------------------------------

def _rebuilt(exc: PairFlowError) -> PairFlowError | None:
    """A copy of ``exc`` without its cause chain that survives pickling, or None for a
    subclass that cannot be rebuilt from its ``args`` (then wrapped as a TaskError)."""
    try:
        rebuilt: PairFlowError = pickle.loads(pickle.dumps(type(exc)(*exc.args)))
    except Exception:
        return None
    return rebuilt


def _failed_slot(exc: BaseException, beats: list[dict[str, Any]], task: int) -> dict[str, Any]:
    """Where a failed task last ran, as a physical slot (host and device, see ``slot_name``).

    From the slot ``traced`` attached to the task's own exception; else (a worker or pool
    manager killed, the exception is Parsl's) from the heartbeat of the worker last
    running task ``task``; else only the host Parsl's error names. ``source`` says which."""
    slot = getattr(exc, "pairflow_slot", None)
    source = "task"
    if not isinstance(slot, dict):
        mine = [b for b in beats if b.get("task") == task]
        slot = max(mine, key=lambda b: b["touched"]) if mine else None
        source = "heartbeat"
    if not isinstance(slot, dict):
        host = getattr(exc, "hostname", None)
        host = host.decode() if isinstance(host, bytes) else host
        return {"host": str(host) if host else None, "device": None, "name": None, "source": "parsl"}
    keys = ("host", "pid", "rank", "visible_devices", "gpu_index", "gpu_uuid", "slurm_job")
    out = {k: slot.get(k) for k in keys}
    device = f"gpu{out['gpu_index']}" if out["gpu_index"] not in (None, "") else f"cpu{out['rank']}"
    return {**out, "device": device, "name": slot_name(str(out["host"]), out["gpu_index"], out["rank"]),
            "source": source}


KILLED_EXIT_CODES = (137, -9, 143, -15)
"""Exit codes of a process ended by SIGKILL (the kernel's OOM killer, ``kill -9``) or
SIGTERM, as a shell (128 + signal) or Python's subprocess (minus the signal) reports them."""


def classify_failure(exc: BaseException) -> str:
    """``device_oom``, ``host_oom_or_killed`` or ``other`` for a task's final exception.

    A worker or pool manager killed from outside (the kernel's OOM killer, a SIGKILL)
    reaches the driver as Parsl's WorkerLost or ManagerLost, or, when the whole block
    died, as the executor's bad state naming the block's exit code (137 = 128 + SIGKILL);
    an OOM kill and a SIGKILL cannot be told apart from here."""
    names = {c.__name__ for c in type(exc).__mro__} | set(getattr(exc, "mro", ()))
    text = str(exc)
    if "OutOfMemoryError" in names or "CUDA out of memory" in text or "CUDA error: out of memory" in text:
        return "device_oom"
    if names & {"MemoryError", "WorkerLost", "ManagerLost"}:
        return "host_oom_or_killed"
    codes = {int(c) for c in re.findall(r"EXIT CODE: (-?\d+)", text)}
    if codes & set(KILLED_EXIT_CODES) or re.search(r"\b(SIGKILL|Killed|oom-kill|Out of memory)\b", text):
        return "host_oom_or_killed"
    return "other"


ADVICE = {
    "device_oom": "the accelerator ran out of memory: use fewer frames, a smaller size or batch, or a larger GPU",
    "host_oom_or_killed": ("a worker or its pool manager was killed (the kernel's OOM killer or a SIGKILL, e.g. "
                           "exit 137): give the job more host memory (Slurm --mem, fewer cpu_workers), check "
                           "`dmesg` or `journalctl -k` on the slot's host for oom-kill lines, then rerun"),
    "other": "read the exception and the worker traceback in the rule log",
}
"""What to do next, per failure class (in the failure record and the job's error)."""


def _allocated_slots(fleet: FleetSpec, grant: Grant, packing: Packing = ONE_PER_GPU) -> list[str]:
    """Every slot the job was given, so one that never ran a task counts as idle: on each
    node (every node of a multi-node allocation, as Slurm names them) each granted GPU
    (named by the driver node's map, as the workers' spans are) or each CPU worker. Where
    Slurm cannot expand the node list, this node's slots (the others come from spans)."""
    hosts = [node_name(os.environ)]
    if grant.allocation is not None and grant.allocation.nodes > 1:
        hosts = node_names(grant.allocation.nodelist) or hosts
    if grant.accelerators:  # workers sharing a GPU share its slot name (the physical device)
        return [slot_name(h, grant.gpus.get(a, a)) for h in hosts for a in grant.accelerators]
    return [slot_name(h, None, r) for h in hosts for r in range(packing.per_node(fleet, grant))]


TaskFn = Callable[[dict[str, Any]], dict[str, Any]]
Task = tuple[TaskFn, dict[str, Any]]
"""A task of another kind than the job's ``fn``: (function, payload)."""


@dataclass(frozen=True)
class TaskHooks:
    """What a caller may add to ``run_tasks``'s run; each is optional.

    ``telemetry_out``: where the run's telemetry record goes (spans, busy share, NVML
    samples; warm-up spans carry ``"kind": "warm-up"``). ``failure_out(payload)``: where a
    task that still fails after its retries leaves its failure record. ``describe(payload)``:
    what a slot is doing, in progress and stall messages (default the task's index).
    ``warm`` = (function, payload): one warm-up task per slot queued ahead of the work
    (imports, model load); a failed warm-up is logged and left to the tasks to report.
    ``start_early``: when the payloads are a function, start the pool first and prepare
    them while it starts (otherwise prepare first, and start no pool for no work).
    ``follow(payload, result)``: runs in the driver as each task succeeds and returns tasks
    to submit now (a candidate's score task once its video and its control's have
    landed); a failed task has no followers, but ``settle_failed(payload)`` runs as it
    fails and may also return tasks to submit (a driver that feeds the pool from its own
    queue keeps it fed)."""

    telemetry_out: Path | None = None
    failure_out: Callable[[dict[str, Any]], Path] | None = None
    describe: Callable[[dict[str, Any]], str] | None = None
    warm: tuple[TaskFn, dict[str, Any]] | None = None
    start_early: bool = False
    follow: Callable[[dict[str, Any], dict[str, Any]], Iterable[Task]] | None = None
    settle_failed: Callable[[dict[str, Any]], Iterable[Task]] | None = None


def run_tasks(fn: TaskFn, payloads: Iterable[dict[str, Any] | Task] | Callable[[], Iterable[dict[str, Any] | Task]],
              run_dir: Path, fleet: FleetSpec, grant: Grant, label: str,
              hooks: TaskHooks = TaskHooks(), packing: Packing = ONE_PER_GPU) -> list[dict[str, Any]]:
    """Run ``fn`` on every payload through Parsl; log progress; return results in
    payload order (tasks ``hooks.follow`` added come after, in the order they were added).

    A payload may instead be a (function, payload) pair: one pool serves several task
    kinds (a panel's generation and scoring). A payload's ``"stage"`` key, when present,
    is copied into its span. ``payloads`` may be a function that prepares them (see
    ``TaskHooks.start_early``). What else a run does is in ``hooks`` (``TaskHooks``).
    ``packing``: workers per granted GPU, or CPU workers per node, and where that figure
    came from (``calibrate.workers_for``); logged and kept in the telemetry record.

    A task that still fails after its retries is classified and, with
    ``hooks.failure_out``, leaves a failure record; after every task has finished
    TaskFailedError names the count per class. When no task finishes and no worker
    reports progress for ``fleet.stall_timeout_s``, StalledError names each slot and what
    it last did. The DataFlowKernel is always cleaned up (SIGTERM from a scheduler
    included), so no worker pool outlives the job.
    """
    MARKS.pop("tasks_prepared", None)  # this pool's, if it prepares any
    mark("driver_ready", again=True)
    # lazy: Parsl takes about a second to import; planning and the CLI import this module.
    import parsl

    mark("parsl_imported", again=True)

    prepare = payloads if callable(payloads) else None
    payloads = [] if callable(payloads) else list(payloads)
    if prepare is not None and not hooks.start_early:
        payloads, prepare = list(prepare()), None
    if prepare is None and not payloads:
        log.info("%s: nothing to do", label)
        return []
    app = parsl.python_app(traced, executors=["slots"])
    previous = _trap_sigterm()
    read, nvml_status = nvml_reader()
    start = time.time()
    beat_dir = fresh_heartbeats(Path(run_dir))
    log.info("%s: %d worker(s) per node (%s)", label, packing.per_node(fleet, grant),
             json.dumps(packing.record, sort_keys=True))
    config = make_config(run_dir, fleet, grant, packing)
    _name_preload_model(hooks.warm)
    config_text = repr(config)  # as logged: Parsl fills in parts of it (the launch command) once loaded
    taken = config.retry_handler = FailedTries()  # Parsl's default cost: retries as configured, now recorded
    dfk = parsl.load(config)
    _mark_pool(dfk)
    groups = _pool_groups(dfk)
    try:
        with Sampler(read, fleet.nvml_interval_s) as sampler:
            warming = _queue_warm_ups(app, hooks.warm, _slot_count(fleet, grant, packing), beat_dir, label)
            if prepare is not None:
                payloads = list(prepare())
                mark("tasks_prepared", again=True)
                if not payloads:
                    log.info("%s: nothing to do", label)
                    return []
            run = _Collect([], {}, fleet, label, hooks.failure_out, start, beat_dir, describe=hooks.describe,
                           taken=taken)
            futures: dict[Any, int] = {}
            submit = _submitter(app, fn, run, futures, beat_dir, label, hooks.describe)
            submit(payloads)
            follow = hooks.follow
            after = None if follow is None else (lambda i, result: submit(follow(run.payloads[i], result)))
            settle = hooks.settle_failed
            failed = None if settle is None else (lambda i: submit(settle(run.payloads[i])))
            _wait_all(futures, run, fleet, beat_dir, label, after, warming, start, failed, _interchanges(dfk))
            payloads = run.payloads
            run.spans += _warm_spans(warming, label)
            run.spans += _attempt_spans(beat_dir, run)
            window = (start, time.time())
    finally:
        groups |= _pool_groups(dfk)  # a block Parsl launched again after one died
        _cleanup(dfk)
        parsl.clear()
        _end_leftovers(groups, label)
        _restore_sigterm(previous)
    if hooks.telemetry_out is not None:  # after the cleanup: the pool's shutdown is the job's slot time too
        packed = {**packing.record, "workers_per_gpu": packing.per_gpu if grant.accelerators else None,
                  "workers_per_node": packing.per_node(fleet, grant)}
        extra = {"allocation": grant.allocation.asdict() if grant.allocation else None,
                 "accelerators": list(grant.accelerators), "retries": fleet.retries,
                 "idle_timeout_s": fleet.idle_timeout_s, "site": grant.site,
                 "parsl_config": config_text, "packing": packed, "startup_marks": dict(MARKS)}
        allocated = allocation_start(grant.allocation) if grant.allocation else None
        write_telemetry(hooks.telemetry_out, label, window, run.spans, _allocated_slots(fleet, grant, packing),
                        sampler, nvml_status, extra, job_window(allocated, time.time()))
    _raise_failures(run, label, fleet)
    return [r for r in run.results if r is not None]


def _name_preload_model(warm: tuple[TaskFn, dict[str, Any]] | None) -> None:
    """Tell the pool's fork server (``preload``), which inherits this process's environment,
    whether the tasks warm up (then it imports torch, diffusers and pyiqa for every worker),
    the warm-up's model folder (its pipeline modules are imported before any worker forks)
    and phases folder (its import phase reaches the log); what the warm-up does not name is unset."""
    payload = warm[1] if warm else {}
    for var, value in ((PRELOAD_VAR, "1" if warm else None),
                       (PRELOAD_MODEL_VAR, getattr(payload.get("model"), "root", None)),
                       (PRELOAD_PHASES_VAR, payload.get("phases"))):
        if value is not None:
            os.environ[var] = str(value)
        else:
            os.environ.pop(var, None)


def _mark_pool(dfk: Any) -> None:
    """Start-up marks of a pool just loaded: ``parsl.load`` returned, and when its
    interchange process started (``/proc``)."""
    mark("pool_loaded", again=True)
    for executor in dfk.executors.values():
        proc = getattr(executor, "interchange_proc", None)
        if proc is not None and getattr(proc, "pid", None):
            mark("interchange_started", process_start(proc.pid), again=True)


def fresh_heartbeats(run_dir: Path) -> Path:
    """The job's heartbeat folder, emptied with its attempts folder: a previous job's slots
    and attempts are not this job's."""
    beat_dir = run_dir / "heartbeats"
    for folder in (beat_dir, run_dir / ATTEMPTS_DIR):
        with contextlib.suppress(FileNotFoundError):
            for old in folder.iterdir():
                old.unlink()
    beat_dir.mkdir(parents=True, exist_ok=True)
    return beat_dir


def _queue_warm_ups(app: Any, warm: tuple[TaskFn, dict[str, Any]] | None, slots: int,
                    beat_dir: Path, label: str) -> dict[Any, float]:
    """One warm-up task per slot, queued ahead of the work: future -> when it was queued."""
    if warm is None:
        return {}
    return {app(warm[0], warm[1], str(beat_dir), f"{label}: warm-up", phase="warm-up"): time.time()
            for _ in range(slots)}


def _submitter(app: Any, fn: TaskFn, run: _Collect, futures: dict[Any, int], beat_dir: Path, label: str,
               describe: Callable[[dict[str, Any]], str] | None) -> Callable[[Iterable[dict[str, Any] | Task]],
                                                                             list[Any]]:
    """A function that submits tasks (payloads of ``fn``, or (function, payload) pairs),
    adds each to ``run`` and ``futures`` (future -> task index) and returns the futures."""
    def submit(tasks: Iterable[dict[str, Any] | Task]) -> list[Any]:
        new = []
        for t in tasks:
            f, p = t if isinstance(t, tuple) else (fn, t)
            i = run.add(p)
            what = f"{label}: {describe(p) if describe else f'task {i}'}"
            new.append(app(f, p, str(beat_dir), what, i))
            futures[new[-1]] = i
            run.tids[i] = new[-1].tid
        return new

    return submit


def _raise_failures(run: _Collect, label: str, fleet: FleetSpec) -> None:
    """TaskFailedError naming the count per failure class, when any task failed."""
    if run.failures:
        raise TaskFailedError(
            f"{label}: {sum(run.failures.values())} of {len(run.payloads)} tasks failed after {fleet.retries + 1} "
            f"attempt(s) ({json.dumps(run.failures, sort_keys=True)}); first: {run.first_error}. Completed "
            "tasks are kept; fix the cause (for device_oom: fewer frames or a smaller batch; for "
            "host_oom_or_killed: more memory per job) and rerun, which runs only the missing candidates")


def _slot_count(fleet: FleetSpec, grant: Grant, packing: Packing = ONE_PER_GPU) -> int:
    """Worker processes this job's pool will run (one warm-up task each)."""
    nodes = grant.allocation.nodes if grant.allocation else 1
    return nodes * packing.per_node(fleet, grant)


def _warm_spans(warming: dict[Any, float], label: str) -> list[dict[str, Any]]:
    """Spans of the warm-up tasks (all finished before the work: they were queued first)."""
    done, running = wait(list(warming), timeout=HEARTBEAT_S)
    if running:  # a slot still warming when the work ran out: it did no task, and is not waited for
        log.info("%s: %d warm-up task(s) still running after the last task; not waited for", label, len(running))
    spans = []
    for fut in done:
        try:
            out = fut.result()
        except Exception as e:
            log.warning("%s: a warm-up task failed (%s: %s); tasks load what they need", label, type(e).__name__, e)
            continue
        queued = warming[fut]
        spans.append({"queued": queued, **out["span"], "kind": "warm-up", "warm_up": out["result"]})
    return spans


class FailedTries:
    """Parsl's ``retry_handler`` for a job: records each failed attempt the moment the
    DataFlowKernel takes it (Parsl's task id → [(epoch s, the exception)], the final
    failure included) and charges it Parsl's default cost, 1, so retries run as before.
    Parsl keeps no trace of a retried attempt itself (its task record's failure time and
    history are reset for the next try); this is how a lost attempt's end is known."""

    def __init__(self) -> None:
        self.tries: dict[int, list[tuple[float, str]]] = {}

    def __call__(self, e: Exception, task_record: Any) -> float:
        self.tries.setdefault(int(task_record["id"]), []).append((time.time(), f"{type(e).__name__}: {e}"[:300]))
        return 1.0


@dataclass
class _Collect:
    """What the driver gathers as tasks finish: results, spans, failure counts."""

    payloads: list[dict[str, Any]]
    queued: dict[int, float]
    fleet: FleetSpec
    label: str
    failure_out: Callable[[dict[str, Any]], Path] | None
    start: float
    beat_dir: Path
    results: list[Any] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    first_error: str = ""
    done: int = 0
    final: dict[int, str] = field(default_factory=dict)
    """Task index → its failure class, for tasks that failed after every retry."""
    last_start: dict[int, float] = field(default_factory=dict)
    """Task index → when its final failed attempt started (that attempt is the failure, not a retry)."""
    describe: Callable[[dict[str, Any]], str] | None = None
    taken: FailedTries = field(default_factory=lambda: FailedTries())
    """Every failed attempt, as Parsl took it (its retry handler)."""
    tids: dict[int, int] = field(default_factory=dict)
    """Task index → Parsl's task id (``FailedTries`` is keyed by it)."""

    def labels(self, i: int) -> dict[str, Any]:
        """What a span of task ``i`` carries of it: its stage and arm (the ledger's keys)."""
        p = self.payloads[i]
        arm = (p.get("identity") or {}).get("arm")
        return {**({"stage": p["stage"]} if p.get("stage") else {}), **({"arm": arm} if arm else {})}

    def __post_init__(self) -> None:
        self.results = [None] * len(self.payloads)

    def add(self, payload: dict[str, Any]) -> int:
        """Register a task being submitted now; its index."""
        self.payloads.append(payload)
        self.results.append(None)
        self.queued[len(self.payloads) - 1] = time.time()
        return len(self.payloads) - 1

    def retried(self, i: int, redone: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Spans of task ``i``'s attempts that Parsl retried after losing them (a worker,
        its pool manager or its node killed: the worker's heartbeat still names the task
        and no attempt record came), each from its start to when Parsl took the loss
        (``FailedTries``), failure ``retried``. Every retried attempt, lost or raised (whose
        span ``_attempt_spans`` gives), is said in one WARNING: the task, where it was
        lost, where it was ``redone`` (its successful span; None when it failed for good)
        and the slot seconds the attempt cost."""
        tries = sorted(self.taken.tries.get(self.tids.get(i, -1), []))
        if redone is None and tries:
            tries.pop()  # the final attempt is the failure (its record and ERROR say it), not a retry
        if not tries:
            return []
        raised = [{**a, "lost": False} for a in _attempt_files(self.beat_dir, i)]
        lost = [{**b, "started": float(b["since"]), "lost": True} for b in _heartbeats(self.beat_dir)
                if b.get("task") == i and b.get("phase") == "task"
                and not (redone and (b.get("host"), b.get("pid")) == (redone.get("host"), redone.get("pid")))]
        evidence = sorted(raised + lost, key=lambda e: float(e["started"]))[:len(tries)]  # oldest first, as tries
        what = self.describe(self.payloads[i]) if self.describe else f"task {i}"
        where = ("it failed for good" if redone is None else "redone on "
                 f"{slot_name(str(redone.get('host')), redone.get('gpu_index'), redone.get('rank'))} "
                 f"(pid {redone.get('pid')})")
        spans = []
        for n, (when, why) in enumerate(tries):
            e = evidence[n] if n < len(evidence) else None
            if e is None:
                log.warning("%s: %s was lost before a worker started it (%s); %s; cost 0.0 slot-s",
                            self.label, what, why, where)
                continue
            slot = {k: e.get(k) for k in ("host", "pid", "rank", "visible_devices", "gpu_index", "gpu_uuid",
                                          "slurm_job")}
            name = slot_name(str(slot["host"]), slot["gpu_index"], slot["rank"])
            finished = max(when, e["started"]) if e["lost"] else float(e["finished"])
            if e["lost"]:
                spans.append({"queued": self.queued.get(i), "started": e["started"], "finished": finished, **slot,
                              **self.labels(i), "attempt": True, "lost": True, "failure": "retried"})
            log.warning("%s: %s %s on %s (pid %s) (%s); %s; cost %.1f slot-s", self.label, what,
                        "was lost" if e["lost"] else "failed", name, slot["pid"], why, where, finished - e["started"])
        return spans

    def take(self, i: int, fut: Any) -> bool:
        """Collect task ``i``'s outcome; True when it succeeded."""
        self.done += 1
        fleet, label = self.fleet, self.label
        try:
            out = fut.result()
        except Exception as e:
            kind = classify_failure(e)
            self.failures[kind] = self.failures.get(kind, 0) + 1
            self.first_error = self.first_error or f"{type(e).__name__}: {e}"
            self.final[i] = kind
            tried = getattr(e, "pairflow_slot", None)
            if isinstance(tried, dict) and "started" in tried:
                self.last_start[i] = tried["started"]
            self.spans.append({"queued": self.queued[i], "started": None, "finished": time.time(),
                               "failure": kind, **self.labels(i)})
            self.spans += self.retried(i, None)
            slot = _failed_slot(e, _heartbeats(self.beat_dir), i)
            if self.failure_out is not None:
                # The task's identity (candidate id, arm, prompt id, seed: the payload's
                # "identity") and where it last ran, not only the record's path.
                self.record_failure(self.failure_out(self.payloads[i]), {
                    **self.payloads[i].get("identity", {}),
                    "kind": "failure", "label": label, "class": kind, "advice": ADVICE[kind],
                    "exception": getattr(e, "exception", "") or type(e).__name__,
                    "message": str(e)[:2000], "attempts": fleet.retries + 1, "time": time.time(),
                    "slot": slot})
            remote = getattr(e, "remote_traceback", "")
            log.error("%s: task %d failed after %d attempt(s) [%s] on %s: %s (%s)%s", label, i, fleet.retries + 1,
                      kind, slot["name"] or slot["host"] or "an unknown slot", e, ADVICE[kind],
                      f"\nworker traceback:\n{remote}" if remote else "")
            return False
        self.results[i] = out["result"]
        self.spans.append({"queued": self.queued[i], **out["span"], **self.labels(i)})
        self.spans += self.retried(i, out["span"])

        log.info("%s", progress_line(label, self.done, len(self.payloads),
                                     work_elapsed(self.spans, time.time(), self.start)))
        return True

    def record_failure(self, path: Path, record: dict[str, Any]) -> None:
        """Write a failure record; when it cannot be written (a full disk), say so and
        what it held in the rule log and on stderr, so the failure is never lost."""
        try:
            write_record(path, record)
        except (OSError, PairFlowError) as e:
            text = json.dumps(record, sort_keys=True, default=str)
            log.error("%s: cannot write the failure record %s (%s: %s); it says: %s", self.label, path,
                      type(e).__name__, e, text)
            print(f"pairflow: {self.label}: cannot write the failure record {path} ({type(e).__name__}: {e}); "
                  f"it says: {text}", file=sys.stderr, flush=True)


def _wait_all(futures: dict[Any, int], run: _Collect, fleet: FleetSpec, beat_dir: Path, label: str,
              after: Callable[[int, Any], list[Any]] | None = None, warming: dict[Any, float] | None = None,
              start: float | None = None, failed: Callable[[int], list[Any]] | None = None,
              interchanges: list[Any] | None = None) -> None:
    """Collect every future, and those ``after(index, result)`` submits as tasks succeed
    (and ``failed(index)`` as they fail).

    When one of ``interchanges`` (Parsl's interchange processes, ``subprocess.Popen``) has
    ended, InterchangeLostError follows at the next poll (``HEARTBEAT_S``): see ``_lost``.

    Two clocks: until a worker is ready (a warm-up in ``warming`` finished, a task
    started or finished) the job is starting up, and StalledError follows only after
    ``fleet.startup_timeout_s`` from ``start`` (pool start, imports, model load). From
    then on StalledError follows when for ``fleet.stall_timeout_s`` no task finished and
    no worker reported progress (its heartbeat file, rewritten on ``progress.report``)."""
    pending = set(futures)
    start = time.time() if start is None else start
    progress_at = ready_at = None
    while pending:
        finished, pending = wait(pending, timeout=min(HEARTBEAT_S, fleet.stall_timeout_s),
                                 return_when=FIRST_COMPLETED)
        now = time.time()
        if finished:
            progress_at = ready_at = now
            for fut in finished:
                if run.take(futures[fut], fut):
                    if after is not None:
                        pending.update(after(futures[fut], run.results[futures[fut]]))
                elif failed is not None:
                    pending.update(failed(futures[fut]))
            continue
        beats = _heartbeats(beat_dir)
        _lost(interchanges or [], label, len(pending), len(futures), beats, now)
        if ready_at is None and (any(f.done() for f in warming or ())
                                 or any(b.get("phase") in ("task", "idle") for b in beats)):
            ready_at = now
            log.info("%s: a worker is ready after %.0fs; the stall clock starts", label, now - start)
        if ready_at is None:
            if now - start > fleet.startup_timeout_s:
                raise StalledError(
                    f"{label}: no worker became ready within {now - start:.0f}s of the job's start "
                    f"(fleet/startup_timeout_s: {fleet.startup_timeout_s}): the pool did not start or its warm-up "
                    f"(imports, model load) hangs. Slots: {_describe(beats, now)}. The worker pool is shut down; "
                    "check the worker logs under the job's run/workers directory, then rerun, or raise "
                    "fleet/startup_timeout_s on a slow file system")
            continue
        latest = max([ready_at, progress_at or ready_at, *(b["touched"] for b in beats)])
        if now - latest > fleet.stall_timeout_s:
            raise StalledError(
                f"{label}: stalled: no task finished and no worker reported progress for "
                f"{now - latest:.0f}s (fleet/stall_timeout_s: {fleet.stall_timeout_s}); "
                f"{len(pending)} of {len(futures)} tasks unfinished. Slots: {_describe(beats, now)}. The worker pool "
                "is shut down; check the worker logs under the job's run/workers directory, then rerun (completed "
                "candidates are kept), or raise fleet/stall_timeout_s if a single step (one denoising step, one "
                "metric on one video) really takes that long")


def _interchanges(dfk: Any) -> list[Any]:
    """The interchange processes (``subprocess.Popen``) Parsl started for ``dfk``'s executors."""
    return [p for e in dfk.executors.values() if (p := getattr(e, "interchange_proc", None)) is not None]


def _lost(interchanges: list[Any], label: str, pending: int, total: int, beats: list[dict[str, Any]],
          now: float) -> None:
    """InterchangeLostError when one of ``interchanges`` has ended.

    Nothing else notices: Parsl's executor never looks at its interchange process, and
    its calls to it (scaling, cleanup) wait for ever for an answer. The pool manager exits
    after its heartbeat threshold (20 s), and the job waited out ``fleet.stall_timeout_s``
    (600 s by default), then ``CLEANUP_S``, with no task able to reach a worker or come
    back (issue 38: 185 s after the kill at a stall timeout of 120 s)."""
    for proc in interchanges:
        code = proc.poll()
        if code is not None:
            raise InterchangeLostError(
                f"{label}: the job's Parsl interchange (pid {proc.pid}) ended (exit status {code}) with {pending} of "
                f"{total} tasks unfinished: no task can reach a worker or come back, so the job stops now. Slots: "
                f"{_describe(beats, now)}. The worker pool is shut down; completed candidates are kept, a rerun "
                "runs only what is unfinished. Exit status -9 is a SIGKILL: the kernel's OOM killer (check `dmesg` "
                "or `journalctl -k` for oom-kill lines) or a kill from outside")


def _describe(beats: list[dict[str, Any]], now: float) -> str:
    """Each slot's host, pid, rank, device, what it last did and how long ago."""
    return "; ".join(
        f"{slot_name(str(b.get('host')), b.get('gpu_index'), b.get('rank'))} (pid {b.get('pid')}): {b.get('what')}"
        + (f", last progress {b['progress']}" if b.get("progress") else "")
        + f", last report {now - b['touched']:.0f}s ago" for b in beats) or "none reported"


def _heartbeats(beat_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(beat_dir.glob("*.json")):
        if f.name.startswith("."):  # an atomic write's temporary name
            continue
        try:
            out.append({**json.loads(f.read_text()), "touched": f.stat().st_mtime})
        except (OSError, ValueError):
            continue  # being replaced right now; the next poll reads it
    return out


EXIT_DEADLINE_S = 7.0
"""After SIGTERM or SIGINT the job process exits within this many seconds, cleaned up or
not (the pool's own watchdog ends it when the driver is gone; ``orphans``)."""
CLEANUP_S = 60.0
"""How long Parsl's cleanup may take after the work (its interchange answering); after
a signal it gets ``EXIT_DEADLINE_S`` / 2. Past that the pool is torn down directly."""
_STOPPING: list[int] = []
"""The signal this job is stopping on, once one arrived."""


def _trap_sigterm() -> Any:
    """Turn SIGTERM (Slurm at walltime, scancel) and SIGINT (Ctrl-C) into SystemExit so
    ``finally`` cleans Parsl up; a driver that dies without cleanup leaves its worker pool
    running. The first signal is said in the log and on stderr, and arms a hard exit
    ``EXIT_DEADLINE_S`` later, so the job ends promptly whatever its phase (warm-up
    included) and wherever Parsl's cleanup waits; later ones are ignored."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _STOPPING.clear()

    def stop(signum: int, frame: Any) -> None:
        if _STOPPING:
            return  # already stopping (a Ctrl-C reaches the job and Snakemake forwards one)
        _STOPPING.append(signum)
        name = signal.Signals(signum).name
        msg = (f"{name} received: stopping this job and its Parsl worker pool (exit within {EXIT_DEADLINE_S:.0f} s); "
               "completed candidates are kept, a rerun runs only what is unfinished")
        # A Ctrl-C reached the person at the console, who reads Snakemake's one line about it
        # (orphans.stop_jobs_on_signal): the log keeps the job's. SIGTERM (scancel, walltime)
        # is also said on stderr, which Slurm keeps in the job's output.
        log.error("%s", msg, extra={progress.LOG_ONLY: signum == signal.SIGINT})
        if signum != signal.SIGINT:
            print(f"pairflow: {msg}", file=sys.stderr, flush=True)

        def hard_exit() -> None:
            time.sleep(EXIT_DEADLINE_S)
            log.error("cleanup after %s did not finish within %.0f s; exiting now", name, EXIT_DEADLINE_S)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(128 + signum)

        threading.Thread(target=hard_exit, name="pairflow-exit-deadline", daemon=True).start()
        raise SystemExit(128 + signum)

    return (signal.signal(signal.SIGTERM, stop), signal.signal(signal.SIGINT, stop))


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def _cleanup(dfk: Any) -> None:
    """``dfk.cleanup()`` with a time limit: it talks to the interchange, which a signal to
    the job's whole process group (Slurm's scancel) may have ended, and then waits for
    ever. Past the limit the pool's process groups get SIGTERM and the interchange
    SIGKILL directly, and the job goes on exiting. An interchange that has already ended
    (``_lost``) will never answer: then the short limit too."""
    gone = any(p.poll() is not None for p in _interchanges(dfk))
    limit = EXIT_DEADLINE_S / 2 if _STOPPING or gone else CLEANUP_S
    done = threading.Event()

    def run() -> None:
        with contextlib.suppress(Exception):  # a half-dead interchange makes Parsl's cleanup raise; torn down below
            dfk.cleanup()
        done.set()

    threading.Thread(target=run, name="pairflow-parsl-cleanup", daemon=True).start()
    if done.wait(limit):
        return
    log.error("Parsl's cleanup did not finish within %.0f s; ending the worker pool and interchange directly", limit)
    for executor in dfk.executors.values():
        _end_blocks(executor)
        proc = getattr(executor, "interchange_proc", None)
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()


def _pool_groups(dfk: Any) -> set[int]:
    """The process groups of the worker pools this job launched (``LocalProvider`` starts
    each block in a group of its own; read while its launching shell lives), never this
    process's own group."""
    groups = set()
    for executor in dfk.executors.values():
        for job in getattr(getattr(executor, "provider", None), "resources", {}).values():
            pid = job.get("remote_pid") if isinstance(job, dict) else None
            if pid:
                with contextlib.suppress(OSError, ValueError):
                    groups.add(os.getpgid(int(pid)))
    return groups - {os.getpgrp()}


def _end_leftovers(groups: set[int], label: str) -> None:
    """After Parsl's shutdown, end whatever still runs in this job's pools' process groups
    (``orphans.end_group``): a pool whose manager was SIGKILLed leaves its launching shell's
    group to the rest (the pool's watchdog, a process that outlived its parent); nothing
    of the job outlives it. Processes found by group, which this job created; never by name."""
    for group in sorted(groups):
        left = orphans.end_group(group)
        if left:
            log.info("%s: ended %d process(es) left in worker pool group %d after Parsl's shutdown (pids %s)",
                     label, len(left), group, " ".join(map(str, left)), extra={progress.LOG_ONLY: True})


def _end_blocks(executor: Any) -> None:
    """SIGTERM each of ``executor``'s worker pools' process groups (LocalProvider starts
    each block in a group of its own), never this process's own group."""
    provider = getattr(executor, "provider", None)
    for job in getattr(provider, "resources", {}).values():
        pid = job.get("remote_pid") if isinstance(job, dict) else None
        try:
            group = os.getpgid(int(pid)) if pid else None
        except (OSError, ValueError):
            continue
        if group is not None and group != os.getpgrp():
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGTERM)

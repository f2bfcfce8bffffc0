"""Fan-out of a panel's candidates through a Parsl HighThroughputExecutor.

Provider → launcher → executor, composed by constructor. One block is this job's
allocation: locally one worker pool on this machine (``SingleNodeLauncher``); inside a
Slurm job one pool per allocated node, started with ``srun`` (``SrunLauncher``). Each
pool runs one worker per accelerator the job was granted (``CUDA_VISIBLE_DEVICES``,
never a hard-coded list), each pinned by Parsl to its device, or ``cpu_workers``
workers where there is none. Workers are long-lived processes: the pipeline and scorers
a task loads stay loaded for the next task (see ``generate.LOAD_COUNTS``).

Lifetimes are bounded: an idle block is released after ``idle_timeout_s``; a failed
task is retried ``retries`` times, and a task that still fails is classified (device
out of memory, host out of memory or killed, other) in a failure record. Every task
leaves a span (queued, started, finished, slot) in the job's telemetry record.

Parsl's own checkpointing keys on function name and arguments only, so resume is done
per candidate from the project's atomically written records instead.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import FleetSpec
from .errors import TaskFailedError
from .slurm import AllocationInfo, allocation, gpu_map

log = logging.getLogger(__name__)

GPU_MAP_VAR = "PAIRFLOW_GPU_MAP"
"""Set in each worker's environment: visible device index → the node's physical GPU index."""


@dataclass(frozen=True)
class Grant:
    """What this job was given to run on (observed by the rule adapter)."""

    accelerators: tuple[str, ...] = ()
    allocation: AllocationInfo | None = None
    gpus: dict[str, str] = field(default_factory=dict)


def granted_accelerators(environ: dict[str, str]) -> list[str]:
    """The device list this job was granted (``CUDA_VISIBLE_DEVICES``), never hard-coded."""
    value = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [d for d in value.split(",") if d and d != "-1"]


def grant_from_env(environ: dict[str, str]) -> Grant:
    """The accelerators and Slurm allocation described by a job's environment."""
    acc = granted_accelerators(environ)
    alloc = allocation(environ)
    return Grant(tuple(acc), alloc, gpu_map(acc, alloc))


def make_config(run_dir: Path, fleet: FleetSpec, grant: Grant) -> Any:
    """One short site config: one block of workers spanning this job's allocation."""
    from parsl.addresses import address_by_hostname
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.launchers import SingleNodeLauncher, SrunLauncher
    from parsl.providers import LocalProvider

    bindir = Path(sys.executable).parent
    alloc, acc = grant.allocation, list(grant.accelerators)
    nodes = alloc.nodes if alloc else 1
    gmap = ",".join(f"{v}={p}" for v, p in grant.gpus.items())
    executor = HighThroughputExecutor(
        label="slots",
        # The driver may run without the venv activated (.venv/bin/snakemake): name
        # Parsl's interchange script by its full path in this interpreter's bin/.
        interchange_launch_cmd=[str(bindir / "interchange.py")],
        # One node: loopback, no interface probing. Several: workers dial this host.
        address="127.0.0.1" if nodes == 1 else address_by_hostname(),
        max_workers_per_node=len(acc) or fleet.cpu_workers,  # one slot per accelerator, else per CPU worker
        available_accelerators=acc,            # Parsl pins each worker to one granted device
        cpu_affinity="block" if not acc else "none",  # keep CPU workers off each other's cores
        heartbeat_period=5, heartbeat_threshold=20,  # notice a killed worker in ~20 s, not minutes
        worker_logdir_root=str(run_dir / "workers"),
        provider=LocalProvider(
            # Inside Slurm, srun starts one pool per allocated node; --overlap because the
            # rule itself already runs in a job step holding the allocation's CPUs.
            launcher=(SrunLauncher(debug=False, overrides="--overlap --ntasks-per-node=1 --cpu-bind=none")
                      if alloc else SingleNodeLauncher()),
            nodes_per_block=nodes,
            # Exactly one block: this allocation. min 0 lets the idle timeout release it.
            init_blocks=1, min_blocks=0, max_blocks=1,
            # Workers start from a shell: put this interpreter's bin/ first so they find
            # process_worker_pool.py and import the same environment as the driver.
            worker_init=f"export PATH={shlex.quote(str(bindir))}:$PATH {GPU_MAP_VAR}={shlex.quote(gmap)}",
        ),
    )
    return Config(executors=[executor], retries=fleet.retries, run_dir=str(run_dir / "parsl"),
                  # "simple" scales an idle block in after max_idletime, returning unused
                  # allocation; a lost manager then does not fail every later task.
                  strategy="simple", max_idletime=float(fleet.idle_timeout_s),
                  initialize_logging=False, usage_tracking=0)


# --- runs on the worker ------------------------------------------------------------------

def slot_identity() -> dict[str, Any]:
    """Where this worker process physically runs: host, Parsl worker rank, the device
    index it sees, the node's physical GPU index and that GPU's UUID (where CUDA exists)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gmap = dict(p.split("=", 1) for p in os.environ.get(GPU_MAP_VAR, "").split(",") if "=" in p)
    return {"host": socket.gethostname(), "pid": os.getpid(), "rank": os.environ.get("PARSL_WORKER_RANK"),
            "visible_devices": visible, "gpu_index": gmap.get(visible or "", visible),
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


def traced(fn: Callable[[dict[str, Any]], dict[str, Any]], payload: dict[str, Any]) -> dict[str, Any]:
    """Run one task and return its result with its span (start, finish, slot)."""
    started = time.time()
    try:
        result = fn(payload)
    except BaseException as e:
        e.pairflow_slot = slot_identity()  # type: ignore[attr-defined]  # travels pickled; for the failure record
        raise
    return {"result": result, "span": {"started": started, "finished": time.time(), **slot_identity()}}


# --- runs in the driver -------------------------------------------------------------------

def _failed_slot(exc: BaseException) -> dict[str, Any] | str | None:
    """Where a failed task last ran: the slot ``traced`` attached to the task's own
    exception, else the host Parsl's error names (a lost worker or manager)."""
    for attr in ("pairflow_slot", "hostname", "manager_id", "worker_id"):
        value = getattr(exc, attr, None)
        if value:
            return value if isinstance(value, dict) else str(value.decode() if isinstance(value, bytes) else value)
    return None


def classify_failure(exc: BaseException) -> str:
    """``device_oom``, ``host_oom_or_killed`` or ``other`` for a task's final exception.

    A worker killed from outside (the kernel's OOM killer, a SIGKILL) reaches the driver
    as Parsl's WorkerLost or ManagerLost; the two cannot be told apart from here."""
    names = {c.__name__ for c in type(exc).__mro__}
    text = str(exc)
    if "OutOfMemoryError" in names or "CUDA out of memory" in text or "CUDA error: out of memory" in text:
        return "device_oom"
    if names & {"MemoryError", "WorkerLost", "ManagerLost"}:
        return "host_oom_or_killed"
    return "other"


def _allocated_slots(fleet: FleetSpec, grant: Grant) -> list[str]:
    if grant.allocation is not None and grant.allocation.nodes > 1:
        return []  # other nodes' names come from their spans
    from .telemetry import slot_name

    host = socket.gethostname()
    if grant.accelerators:
        return [slot_name(host, grant.gpus.get(a, a)) for a in grant.accelerators]
    return [slot_name(host, None, r) for r in range(fleet.cpu_workers)]


def run_tasks(fn: Callable[[dict[str, Any]], dict[str, Any]], payloads: Iterable[dict[str, Any]],
              run_dir: Path, fleet: FleetSpec, grant: Grant, label: str, telemetry_out: Path | None = None,
              failure_out: Callable[[dict[str, Any]], Path] | None = None) -> list[dict[str, Any]]:
    """Run ``fn`` on every payload through Parsl; log progress; return results in
    payload order.

    Writes ``telemetry_out`` (spans, busy share, NVML samples) when given. A task that
    still fails after its retries is classified and, when ``failure_out`` is given,
    leaves a failure record at ``failure_out(payload)``; after every task has finished
    TaskFailedError names the count per class. The DataFlowKernel is always cleaned up
    (SIGTERM from a scheduler included), so no worker pool outlives the job.
    """
    from concurrent.futures import as_completed

    import parsl

    from .records import write_record
    from .telemetry import Sampler, nvml_reader, write_telemetry

    payloads = list(payloads)
    if not payloads:
        log.info("%s: nothing to do", label)
        return []
    app = parsl.python_app(traced, executors=["slots"])
    previous = _trap_sigterm()
    read, nvml_status = nvml_reader()
    start = time.time()
    dfk = parsl.load(make_config(run_dir, fleet, grant))
    try:
        with Sampler(read, fleet.nvml_interval_s) as sampler:
            queued = {}
            futures = {}
            for i, p in enumerate(payloads):
                queued[i] = time.time()
                futures[app(fn, p)] = i
            results: list[dict[str, Any] | None] = [None] * len(payloads)
            spans: list[dict[str, Any]] = []
            failures: dict[str, int] = {}
            first_error = ""
            for done, fut in enumerate(as_completed(futures), start=1):
                i = futures[fut]
                try:
                    out = fut.result()
                except Exception as e:  # noqa: BLE001 - classified, recorded and re-raised below
                    kind = classify_failure(e)
                    failures[kind] = failures.get(kind, 0) + 1
                    first_error = first_error or f"{type(e).__name__}: {e}"
                    spans.append({"queued": queued[i], "started": None, "finished": time.time(),
                                  "failure": kind})
                    if failure_out is not None:
                        # The task's identity (candidate id, arm, prompt id, seed: the payload's
                        # "identity") and where it last ran, not only the record's path.
                        write_record(failure_out(payloads[i]), {
                            **payloads[i].get("identity", {}),
                            "kind": "failure", "label": label, "class": kind, "exception": type(e).__name__,
                            "message": str(e)[:2000], "attempts": fleet.retries + 1, "time": time.time(),
                            "slot": _failed_slot(e)})
                    log.error("%s: task %d failed after %d attempt(s) [%s]: %s", label, i, fleet.retries + 1,
                              kind, e)
                    continue
                results[i] = out["result"]
                spans.append({"queued": queued[i], **out["span"]})
                elapsed = time.time() - start
                rate = done / elapsed if elapsed > 0 else 0.0
                log.info("%s: %d/%d done, %.2f/s, ~%.0fs left", label, done, len(payloads), rate,
                         (len(payloads) - done) / rate if rate else float("nan"))
            window = (start, time.time())
        if telemetry_out is not None:
            write_telemetry(telemetry_out, label, window, spans, _allocated_slots(fleet, grant), sampler,
                            nvml_status, {"allocation": grant.allocation.asdict() if grant.allocation else None,
                                          "accelerators": list(grant.accelerators), "retries": fleet.retries,
                                          "idle_timeout_s": fleet.idle_timeout_s})
        if failures:
            raise TaskFailedError(
                f"{label}: {sum(failures.values())} of {len(payloads)} tasks failed after {fleet.retries + 1} "
                f"attempt(s) ({json.dumps(failures, sort_keys=True)}); first: {first_error}. Completed tasks are "
                "kept; fix the cause (for device_oom: fewer frames or a smaller batch; for host_oom_or_killed: "
                "more memory per job) and rerun, which runs only the missing candidates")
        return [r for r in results if r is not None]
    finally:
        dfk.cleanup()
        parsl.clear()
        _restore_sigterm(previous)


def _trap_sigterm() -> Any:
    """Turn SIGTERM (Slurm at walltime, scancel) into SystemExit so ``finally`` cleans
    Parsl up; a driver that dies without cleanup leaves its worker pool running."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)

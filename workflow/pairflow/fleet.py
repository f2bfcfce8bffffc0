"""Fan-out of a panel's candidates through a Parsl HighThroughputExecutor.

Provider → launcher → executor, composed by constructor. Locally one block on this
machine runs ``cpu_workers`` workers; where accelerators are visible (the
``CUDA_VISIBLE_DEVICES`` this job was granted), one worker per accelerator, each pinned
by Parsl to its device. Workers are long-lived processes: the pipeline and scorers a
task loads stay loaded for the next task (see ``generate.LOAD_COUNTS``).

Parsl's own checkpointing keys on function name and arguments only, so resume is done
per candidate from the project's atomically written records instead.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def granted_accelerators(environ: dict[str, str]) -> list[str]:
    """The device list this job was granted (``CUDA_VISIBLE_DEVICES``), never hard-coded."""
    value = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [d for d in value.split(",") if d and d != "-1"]


def make_config(run_dir: Path, cpu_workers: int, retries: int, accelerators: list[str]) -> Any:
    """One short site config: a local block of workers on this machine."""
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.launchers import SingleNodeLauncher
    from parsl.providers import LocalProvider

    bindir = Path(sys.executable).parent
    executor = HighThroughputExecutor(
        label="slots",
        # The driver may run without the venv activated (.venv/bin/snakemake): name
        # Parsl's interchange script by its full path in this interpreter's bin/.
        interchange_launch_cmd=[str(bindir / "interchange.py")],
        address="127.0.0.1",                   # workers are local; no interface probing
        max_workers_per_node=len(accelerators) or cpu_workers,  # one slot per accelerator, else per CPU worker
        available_accelerators=accelerators,   # Parsl pins each worker to one granted device
        cpu_affinity="block" if not accelerators else "none",  # keep CPU workers off each other's cores
        heartbeat_period=5, heartbeat_threshold=20,  # notice a killed worker in ~20 s, not minutes
        worker_logdir_root=str(run_dir / "workers"),
        provider=LocalProvider(
            launcher=SingleNodeLauncher(),      # one pool per node; the pool starts the workers
            init_blocks=1, min_blocks=1, max_blocks=1,  # exactly one block: this allocation
            # Workers start from a shell: put this interpreter's bin/ first so they find
            # process_worker_pool.py and import the same environment as the driver.
            worker_init=f"export PATH={shlex.quote(str(bindir))}:$PATH",
        ),
    )
    return Config(executors=[executor], retries=retries, run_dir=str(run_dir / "parsl"),
                  strategy="none", initialize_logging=False, usage_tracking=0)


def run_tasks(fn: Callable[[dict[str, Any]], dict[str, Any]], payloads: Iterable[dict[str, Any]],
              config: Any, label: str) -> list[dict[str, Any]]:
    """Run ``fn`` on every payload through Parsl; log progress; return results in
    payload order. The DataFlowKernel is always cleaned up, so no worker pool outlives
    the job. A task that fails after its retries re-raises its exception here.
    """
    import parsl
    from concurrent.futures import as_completed

    payloads = list(payloads)
    if not payloads:
        log.info("%s: nothing to do", label)
        return []
    app = parsl.python_app(fn, executors=["slots"])
    dfk = parsl.load(config)
    try:
        started = time.monotonic()
        futures = {app(p): i for i, p in enumerate(payloads)}
        results: list[dict[str, Any] | None] = [None] * len(payloads)
        for done, fut in enumerate(as_completed(futures), start=1):
            results[futures[fut]] = fut.result()
            elapsed = time.monotonic() - started
            rate = done / elapsed if elapsed > 0 else 0.0
            left = (len(payloads) - done) / rate if rate else float("nan")
            log.info("%s: %d/%d done, %.2f/s, ~%.0fs left", label, done, len(payloads), rate, left)
        return [r for r in results if r is not None]
    finally:
        dfk.cleanup()
        parsl.clear()


def worker_identity() -> dict[str, Any]:
    """Who ran a task: host, pid, Parsl worker rank (the slot) and the device it saw."""
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(),
            "slot": os.environ.get("PARSL_WORKER_RANK"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

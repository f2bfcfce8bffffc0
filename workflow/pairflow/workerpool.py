"""Parsl's worker pool with its workers forked from a fork server that already holds the
work's imports (``fleet.worker_start: forkserver``, opt-in; ``spawn`` is the default).

Parsl's ``process_worker_pool`` starts its multiprocessing Manager server and every worker
with ``parsl.multiprocessing.SpawnContext``: each is a fresh interpreter that imports Parsl,
then the warm-up imports torch, diffusers, the pipeline's modules and pyiqa, one process
after another. Measured 2026-12-02 on the local study (BENCHMARKS.md, issue 25): the
manager's Parsl import plus its spawned Manager server took 1.6-2.0 s and each spawned
worker's Parsl import and registration 1.1-1.5 s, all before the 4-8 s of warm-up imports.

``python -m pairflow.workerpool <Parsl's pool arguments>`` (the executor's ``launch_cmd``,
``sites.base.launch_command``) instead starts a ``forkserver`` at once, preloading
``pairflow.preload`` (torch, diffusers, pyiqa, the scorers, the model's pipeline modules,
Parsl's pool module), so those imports run beside the manager's own Parsl import; it then
hands Parsl that context in place of ``SpawnContext`` and runs Parsl's pool module as
``__main__`` unchanged. Every worker (and the Manager server) is forked from the fork
server, never from the manager and its threads. The server runs one Python thread (its
imports leave two idle native threads, torch's and pyiqa's, as in any process that
forks DataLoader workers after ``import torch``) and never initialises CUDA, so a fork is
safe; Parsl pins each worker's accelerator (``CUDA_VISIBLE_DEVICES``) inside the forked
worker as before, and CUDA reads it at the worker's first use.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import runpy

POOL_MODULE = "parsl.executors.high_throughput.process_worker_pool"
"""Parsl's worker pool, run as ``__main__`` here."""
PRELOAD_MODULE = "pairflow.preload"
"""What the fork server imports before it forks any worker."""
PRELOAD_MODEL_VAR = "PAIRFLOW_PRELOAD_MODEL"
"""The model's folder (holding ``model_index.json``) whose pipeline modules the fork server
imports (``preload``); the driver sets it (``fleet.run_tasks``) and the pool inherits it."""
PRELOAD_PHASES_VAR = "PAIRFLOW_PRELOAD_PHASES"
"""The job's start-up phases folder (``telemetry.PHASES_DIR``): the fork server names its
import phase there, so the driver's log is not silent while it imports (``preload``)."""
MANAGER_PID_VAR = "PAIRFLOW_POOL_MANAGER_PID"
"""The pool manager's PID, for its workers: their parent is the fork server (``startup.worker_marks``)."""


def main() -> None:
    """Start the fork server (its imports begin now), then run Parsl's pool on it."""
    os.environ[MANAGER_PID_VAR] = str(os.getpid())
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([POOL_MODULE, PRELOAD_MODULE])
    multiprocessing.forkserver.ensure_running()
    # lazy: Parsl takes about a second to import; the fork server's imports run beside it
    import parsl.multiprocessing

    parsl.multiprocessing.SpawnContext = context  # type: ignore[assignment]  # same API, forked workers
    runpy.run_module(POOL_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

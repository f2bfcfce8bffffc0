"""What a worker pool's fork server imports before forking workers (``pairflow.workerpool``):
torch, diffusers, pyiqa and the scorers, the task modules, and the lazily imported modules
of the model's pipeline (``generate.index_imports``) when the driver names the model's
folder in ``PAIRFLOW_PRELOAD_MODEL``; its phases go to the job's log like a worker's
(``PAIRFLOW_PRELOAD_PHASES``). A failed import is logged and left to the warm-up,
which imports the same modules and reports the error where the job sees it. In the fork
server, importing it first binds every process the server forks to the server's life (``workerpool.bind_children``)."""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from .telemetry import FORK_SERVER, write_phase
from .workerpool import MANAGER_PID_VAR, PRELOAD_MODEL_VAR, PRELOAD_PHASES_VAR, PRELOAD_VAR, bind_children

log = logging.getLogger(__name__)

MODULES = ("torch", "diffusers", "pyiqa", "pairflow.metrics", "pairflow.video", "pairflow.stages.combined")
"""The warm-up's imports (``stages.combined.warm_panel``) and the tasks' own modules."""


def preload(environ: Mapping[str, str]) -> list[str]:
    """Import ``MODULES`` and the model's pipeline modules when ``PAIRFLOW_PRELOAD`` is 1 (the
    job warms up: ``fleet.run_tasks``); return the modules that failed. Names its phases in
    the job's phases folder (``PAIRFLOW_PRELOAD_PHASES``) for the log."""
    if environ.get(PRELOAD_VAR) != "1":
        return []
    phases, who, start = environ.get(PRELOAD_PHASES_VAR) or None, FORK_SERVER + "-", time.time()
    write_phase(phases, "importing torch, diffusers, pyiqa and the model's modules once, for every worker on "
                "this node", who=who)
    failed = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:
            log.warning("preload: importing %s failed (%s: %s); the warm-up will import it", name, type(e).__name__, e)
            failed.append(name)
    model = environ.get(PRELOAD_MODEL_VAR)
    if model:
        try:
            # by name, inside the guard: a failure here must not end the fork server
            importlib.import_module("pairflow.generate").index_imports(Path(model))
        except Exception as e:
            log.warning("preload: the pipeline's modules of %s failed (%s: %s)", model, type(e).__name__, e)
            failed.append(model)
    write_phase(phases, "imports done: forking the workers", who=who, import_s=time.time() - start)
    return failed


if os.environ.get(MANAGER_PID_VAR) == str(os.getppid()):  # the pool's fork server (not a test importing this)
    bind_children()
preload(os.environ)

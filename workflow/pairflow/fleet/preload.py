"""What a worker pool's fork server imports before forking workers (``pairflow.fleet.workerpool``):
torch, diffusers, pyiqa and the scorers, the task modules, and the lazily imported modules
of the model's pipeline (``generate.index_imports``) when the driver names the model's
folder in ``PAIRFLOW_PRELOAD_MODEL``; its phases go to the job's log like a worker's
(``PAIRFLOW_PRELOAD_PHASES``). A failed import is logged and left to the warm-up,
which imports the same modules and reports the error where the job sees it. In the fork
server, importing it first binds every process the server forks to the server's life (``workerpool.bind_children``)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from .telemetry import FORK_SERVER, write_phase
from .workerpool import MANAGER_PID_VAR, PRELOAD_MODEL_VAR, PRELOAD_PHASES_VAR, PRELOAD_VAR, bind_children

log = logging.getLogger(__name__)

MODULES = ("torch", "diffusers", "pyiqa", "pairflow.metrics", "pairflow.media.video", "pairflow.stages.combined")
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
    with gpus_hidden():
        for name in MODULES:
            try:
                importlib.import_module(name)
            except Exception as e:
                log.warning("preload: importing %s failed (%s: %s); the warm-up will import it", name,
                            type(e).__name__, e)
                failed.append(name)
        model = environ.get(PRELOAD_MODEL_VAR)
        if model:
            try:
                # by name, inside the guard: a failure here must not end the fork server
                importlib.import_module("pairflow.generation.generate").index_imports(Path(model))
            except Exception as e:
                log.warning("preload: the pipeline's modules of %s failed (%s: %s)", model, type(e).__name__, e)
                failed.append(model)
    write_phase(phases, "imports done: forking the workers", who=who, import_s=time.time() - start)
    return failed


HIDDEN = {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
"""The environment the fork server imports under: no GPU visible, and torch's CUDA check
by NVML (which does not initialise CUDA) rather than by the CUDA runtime (which does)."""


@contextlib.contextmanager
def gpus_hidden() -> Iterator[None]:
    """Import with CUDA out of reach, then restore the environment the workers inherit.

    A process forked after CUDA was initialised cannot use CUDA ("Cannot re-initialize
    CUDA in forked subprocess"), and imports reach it: diffusers asks whether an
    accelerator is available when it is imported, and bitsandbytes (imported with pyiqa
    and diffusers' quantizers) asks for the device's capability when CUDA is visible,
    which initialises it. Under ``HIDDEN`` every such question is answered "no GPU"
    without touching CUDA. What an import cached from that answer is cleared
    (``forget_device_answers``); bitsandbytes keeps its CPU library, so a
    bitsandbytes-quantised checkpoint needs ``fleet.worker_start: spawn``. Should CUDA
    be initialised anyway, the server says so in the job's log: its workers could not
    use the GPU. This is why ``auto`` spawns on GPU jobs until a GPU run has shown it."""
    saved = {k: os.environ.get(k) for k in HIDDEN}
    os.environ.update(HIDDEN)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        forget_device_answers()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            log.error("preload: the fork server's imports initialised CUDA; workers forked from it cannot use "
                      "the GPU. Set fleet.worker_start: spawn (or auto)")


CACHED_ANSWERS = ("transformers.utils.import_utils", "diffusers.utils.import_utils", "diffusers.utils.torch_utils")
"""Modules whose memoised probes (``functools.lru_cache``: is CUDA available, which
accelerator, which device type) may have been asked while the GPUs were hidden."""


def forget_device_answers() -> None:
    """Clear every memoised probe of ``CACHED_ANSWERS`` (and diffusers' cached device type),
    so a forked worker asks again with its own GPU visible. An install probe asked again
    costs microseconds."""
    for name in CACHED_ANSWERS:
        module = sys.modules.get(name)
        for value in list(vars(module).values()) if module is not None else []:
            for probe in (value, getattr(value, "_detect_device_type", None)):
                clear = getattr(probe, "cache_clear", None)
                if callable(clear):
                    clear()


if os.environ.get(MANAGER_PID_VAR) == str(os.getppid()):  # the pool's fork server (not a test importing this)
    bind_children(os.getppid())
preload(os.environ)

"""What every panel job does around its Parsl tasks: worker warm-up bookkeeping,
sweeping leftovers of interrupted writes, naming tasks and clearing failure records."""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

from ..atomic import sweep_temps
from ..layout import Layout
from ..plan.candidates import Candidate, failure_path
from ..plan.config import StudySpec

log = logging.getLogger(__name__)

WARM_UP: dict[str, float] = {}
"""This worker's warm-up task's figures (seconds importing, loading), empty when none ran here."""


def timed_imports(modules: tuple[str, ...]) -> float:
    """Seconds spent importing ``modules`` now (about 0 when this process already has them)."""
    started = time.perf_counter()
    for m in modules:
        importlib.import_module(m)
    return time.perf_counter() - started


def describe(payload: dict[str, Any]) -> str:
    """A task as the stall error names it: arm/prompt-seed."""
    c: Candidate = payload["candidate"]
    return f"{c.arm.name}/{c.stem}"


def clear_failures(study: StudySpec, done: list[Candidate], stage: str) -> None:
    layout = Layout(study.scratch)
    for c in done:
        failure_path(layout, c, stage).unlink(missing_ok=True)


def sweep_panel(study: StudySpec, panel: str, started: float, subdirs: tuple[str, ...]) -> None:
    """Remove ``.tmp-*`` leftovers older than this job (``started``) from the folders a
    panel job writes: the panel directory, its telemetry, and each arm's ``subdirs``
    folder (records, videos, scores, failures/<stage>)."""
    layout = Layout(study.scratch)
    pdir = layout.panel(panel)
    folders = [pdir, layout.telemetry_dir(panel)]
    folders += [pdir / sub / arm.name for sub in subdirs for arm in study.arms]
    for f in sweep_temps(folders, started):
        log.info("removed %s, left by an interrupted write", f)


def sweep_after(study: StudySpec, panel: str, subdirs: tuple[str, ...]) -> None:
    """Once the job's worker pool has shut down (every writer of this job has ended), remove
    every ``.tmp-*`` left in the panel's folders: the temporaries of writers killed in this
    job (a lost worker or pool whose task Parsl retried, maybe on another node; issue 38).
    Not earlier: while tasks run, a retry may race a slow first attempt that is still alive
    (a lost manager's worker can outlive the loss), and removing its temp would fail it.
    The panel lock makes this job the folders' only writer. A job that fails leaves them to
    the next job's ``sweep_panel``."""
    layout = Layout(study.scratch)
    pdir = layout.panel(panel)
    folders = [pdir, layout.telemetry_dir(panel)]
    folders += [pdir / sub / arm.name for sub in subdirs for arm in study.arms]
    for f in sweep_temps(folders, time.time() + 2.0):
        log.warning("removed %s, left by a writer killed in this job (its task was redone)", f)

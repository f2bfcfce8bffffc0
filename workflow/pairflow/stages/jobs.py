"""What every panel job does around its Parsl tasks: worker warm-up bookkeeping,
sweeping leftovers of interrupted writes, naming tasks and clearing failure records."""

from __future__ import annotations

import importlib
import logging
import time
from pathlib import Path
from typing import Any

from ..atomic import remove_temps_of, sweep_temps
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


def clear_own_temps(*finals: Path) -> None:
    """Before a task writes its candidate's files ``finals``: remove the temporaries an
    earlier attempt of it left when it was killed mid-write (a lost worker or pool whose
    task Parsl retried, maybe on another node). The task is the files' only writer (the
    panel lock, one attempt at a time), so any such temp is stale; the next job's
    ``sweep_panel`` would otherwise be the first to remove it."""
    for final in finals:
        for f in remove_temps_of(final):
            log.warning("removed %s, left by an earlier attempt of this task killed mid-write", f)

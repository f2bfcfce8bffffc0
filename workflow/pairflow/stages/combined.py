"""A panel's generation and scoring in one job (``fleet.panel_jobs: combined``).

One Parsl pool serves both task kinds: each worker imports torch, diffusers and the
scorers and loads the model and the scorer models once (its warm-up task, while the
driver prepares), then takes generation and score tasks as they come. A candidate's
score task is submitted the moment its own generation and its pair's control are both
verified (``follow`` in ``fleet.run_tasks``), so it is queued as soon as it can run instead
of after the whole panel, and no second job pays a pool start and worker imports again.
The interchange serves tasks in the order they were submitted, so on a busy pool the score
tasks run as the generation queue drains (measured, issue 37: every score task of a 4x panel
started after the last generation task), not beside the generations they would slow.

What the job writes is what the two per-stage jobs write (``generation.py``,
``scoring.py``): the same records, failure records per stage, generation manifest and
score manifest, and the same resume rules (a complete candidate is not regenerated, a
fresh score is not recomputed). Its telemetry is one record for the job
(``candidates.job_stage``), whose spans carry their stage.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..atomic import job_start
from ..budget.calibrate import workers_for
from ..fleet.pool import Grant, Task, TaskHooks, _slot_count, run_tasks
from ..fleet.startup import worker_marks
from ..fleet.telemetry import PHASES_DIR, PhaseWatch, close_job, write_phase
from ..layout import Layout
from ..locks import hold
from ..plan.candidates import (
    COMBINED,
    Candidate,
    candidates,
    failure_path,
    panel_dir,
    record_path,
    score_path,
    telemetry_path,
)
from ..plan.config import StudySpec
from ..plan.context import write_context
from ..progress import LOG_ONLY
from ..records.types import GenerationRecord, ScorerBuild
from .generation import (
    checks_last,
    finish_generation,
    flop_checks,
    generate_task,
    generation_context,
    generation_payload,
    incomplete,
    verified,
    warm_generation,
    warm_payload,
)
from .jobs import WARM_UP, describe, sweep_after, sweep_panel, timed_imports
from .scoring import (
    SCORER_MODULES,
    finish_scoring,
    ready_score_task,
    scorer_warm_payload,
    scoring_context,
    warm_scorers,
)

log = logging.getLogger(__name__)


def panel_warm_payload(study: StudySpec, build: ScorerBuild, phases: Path) -> dict[str, Any]:
    """What ``warm_panel`` prepares: the model (``generation.warm_payload``), the scorers
    (``scoring.scorer_warm_payload``) and the folder its phases are named in."""
    return {**warm_payload(study), "scoring": scorer_warm_payload(study, build), "phases": str(phases)}


def warm_panel(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl warm-up task of a combined job (``payload``: ``panel_warm_payload``): what
    both stages' warm-ups do (import torch and diffusers, load the model, import pyiqa and
    the study's scorers and load their models on the slot's device), in one worker,
    naming each phase as it starts (``telemetry.write_phase``) for the driver's log. Its
    result carries the worker's start-up timeline (``startup.worker_marks``: when its pool
    manager and the worker process started, when each phase ended; epoch seconds)."""
    phases = payload.get("phases")
    marks = worker_marks()
    write_phase(phases, "importing torch and diffusers")
    import_s = timed_imports(("torch", "diffusers"))
    marks["torch_diffusers_imported"] = time.time()
    write_phase(phases, "loading the model", import_s=import_s)
    gen = warm_generation(payload, marks)
    write_phase(phases, "importing the scorers and loading their models", import_s=import_s, load_s=gen["load_s"])
    scorers = timed_imports(SCORER_MODULES)
    marks["scorers_imported"] = time.time()
    got = warm_scorers(payload["scoring"])
    marks["scorers_loaded"] = time.time()
    WARM_UP.update({"import_s": import_s + gen["import_s"] + scorers + got["import_s"],
                    "load_s": gen["load_s"] + got["load_s"]})
    write_phase(phases, "ready", import_s=WARM_UP["import_s"], load_s=WARM_UP["load_s"])
    return {**WARM_UP, "marks": marks}


@contextmanager
def _console(*loggers: str) -> Iterator[None]:
    """Also send these loggers' INFO lines to stderr for the job's duration: under
    Snakemake that is the console, so a person watching it sees the start-up phases and
    progress lines the rule's log gets, not only "Select jobs to execute"."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    handler.addFilter(lambda r: not getattr(r, LOG_ONLY, False))  # e.g. the Parsl config: the log keeps it
    targets = [logging.getLogger(n) for n in loggers]
    for t in targets:
        t.addHandler(handler)
    try:
        yield
    finally:
        for t in targets:
            t.removeHandler(handler)


def run_panel(study: StudySpec, panel_name: str, gen_out: Path, score_out: Path, run_dir: Path,
              grant: Grant, job: str = COMBINED) -> dict[str, Any]:
    """Generate every incomplete candidate of a panel and score every candidate whose
    score is missing or stale, in one worker pool; then write the generation manifest
    ``gen_out`` and the score manifest ``score_out``.

    Holds the panel's lock throughout (a second job on the panel fails at once). Raises
    WeightsError before any worker starts when a scorer's weight is missing or altered,
    and TaskFailedError after every task has finished when some failed (neither
    manifest is then written; a rerun runs only what is unfinished)."""
    layout = Layout(study.scratch)
    with hold(panel_dir(layout, panel_name), f"generate and score {panel_name}"):
        return _run_panel(study, panel_name, gen_out, score_out, run_dir, grant, job)


def _run_panel(study: StudySpec, panel_name: str, gen_out: Path, score_out: Path, run_dir: Path,
               grant: Grant, job: str) -> dict[str, Any]:
    layout = Layout(study.scratch)
    started = job_start()
    sweep_panel(study, panel_name, started, ("records", "videos", "scores", "failures/generate", "failures/score"))
    shared = scoring_context(study, grant)  # fails fast on a missing or altered weight
    build = shared["scorer"]
    todo_all = candidates(study, study.panel(panel_name))
    by_id = {c.key.candidate_id: c for c in todo_all}
    pairs: dict[tuple[str, str, int], list[Candidate]] = {}
    for c in todo_all:
        pairs.setdefault(c.key.pair_key, []).append(c)
    records: dict[Path, GenerationRecord] = {}  # verified generation records (by path)
    todo: list[Candidate] = []
    scored: set[str] = set()  # candidates whose score task was submitted or found fresh
    ran = {"score": 0}
    ref: list[Any] = []

    def ready(c: Candidate) -> Task | None:
        control = next(x for x in pairs[c.key.pair_key] if x.arm.is_control)
        task = ready_score_task(study, ref[0], build, c, control, records, scored)
        ran["score"] += task is not None
        return task

    def scores_ready(cs: list[Candidate]) -> list[Task]:
        return [t for t in map(ready, cs) if t is not None]

    def prepare() -> list[dict[str, Any] | Task]:
        """Runs while the workers start and warm up: find the incomplete candidates, and
        the score tasks that can run now (both videos of the pair already complete)."""
        todo.extend(incomplete(study, todo_all, records))
        ref.append(write_context(study.scratch, {**generation_context(study), **shared}))
        checks = flop_checks(todo_all, study.stats.seed)
        tasks: list[dict[str, Any] | Task] = [generation_payload(ref[0], c, checks) for c in checks_last(todo, checks)]
        tasks += scores_ready(todo_all)
        # The per-stage jobs' log lines, so a log reads the same whichever job ran.
        log.info("generate %s: %d candidates, %d complete, %d to run", panel_name, len(todo_all),
                 len(todo_all) - len(todo), len(todo))
        log.info("score %s: %d to score now, the others once their pair's videos land", panel_name,
                 len(tasks) - len(todo))
        return tasks

    def follow(payload: dict[str, Any], result: dict[str, Any]) -> list[Task]:
        """A candidate was generated: verify its record, then score what it completes
        (itself, or every candidate of its pair when it is the control)."""
        if payload.get("stage") != "generate":
            return []
        c = by_id[result["candidate_id"]]
        records[record_path(layout, c)] = verified(study, c)
        return scores_ready(pairs[c.key.pair_key] if c.arm.is_control else [c])

    label = f"generate and score {panel_name}"
    start_early = any(not record_path(layout, c).exists() or not score_path(layout, c).exists() for c in todo_all)
    phases = Path(run_dir) / PHASES_DIR
    packing = workers_for(study, ("generate", "score"), grant)  # one pool serves both: the fewer workers
    slots = _slot_count(study.fleet, grant, packing) if start_early else 0
    with _console("pairflow"), PhaseWatch(phases, label, slots):
        hooks = TaskHooks(telemetry_path(layout, panel_name, job),
                          lambda p: failure_path(layout, p["candidate"], p["stage"]), describe,
                          warm=(warm_panel, panel_warm_payload(study, build, phases)),
                          start_early=start_early, follow=follow)
        results = run_tasks(generate_task, prepare, run_dir, study.fleet, grant, label, hooks, packing)
    sweep_after(study, panel_name, ("records", "videos", "scores"))
    log.info("score %s: %d candidates, %d to score", panel_name, len(todo_all), ran["score"])
    finish_generation(study, panel_name, todo_all, todo, records, gen_out)
    finish_scoring(study, panel_name, todo_all, ran["score"], build, score_out)
    close_job(hooks.telemetry_out, started)  # the manifests' read-back is the job's time too
    return {"ran": len(todo), "reused": len(todo_all) - len(todo), "scored": ran["score"], "results": results}

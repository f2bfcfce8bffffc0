"""Every panel's generation and scoring in one job (``fleet.allocation: study``).

One allocation (on Slurm, many nodes: one Parsl pool per node, one worker per GPU or as
many as ``calibrate.workers_for`` finds fit) and
one Parsl pool drain the whole study from one queue, instead of one scheduler job per
panel. Each worker warms up once (imports, model, scorers: ``combined.warm_panel``) and
then takes whatever task comes next, whichever panel it belongs to.

The queue is the driver's own: the pool holds at most ``WINDOW_PER_SLOT`` tasks per
slot, and as each task settles the next ones are submitted, score tasks first (a
candidate's score is submitted once its video and its control's are verified, as in
``combined``), then generation tasks in panel order. Panels therefore overlap only at
their edges (the next panel's generation fills slots while the last of a panel is
scored), so no slot idles while work remains and panels finish one after another; each
panel's generation and score manifests are written the moment its last task settles,
not when the allocation ends (a walltime kill keeps every finished panel).

Each panel keeps what the per-panel job does: its lock (held for the job), its sweep of
interrupted writes, its records, failure records, manifests and resume rules (a complete
candidate is not regenerated, a fresh score is not recomputed). One telemetry record and
one run folder serve the job (``Layout.fleet_telemetry``, ``Layout.fleet_run_dir``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import job_start
from ..budget.calibrate import workers_for
from ..errors import PairFlowError
from ..fleet.pool import Grant, Task, TaskHooks, _slot_count, run_tasks
from ..fleet.telemetry import PHASES_DIR, PhaseWatch
from ..layout import Layout
from ..locks import hold
from ..plan.candidates import Candidate, candidates, failure_path, panel_dir, record_path, score_path
from ..plan.config import StudySpec
from ..plan.context import write_context
from ..records.types import GenerationRecord
from .combined import _console, panel_warm_payload, warm_panel
from .generation import (
    checks_last,
    finish_generation,
    flop_checks,
    generate_task,
    generation_context,
    generation_payload,
    incomplete,
    verified,
)
from .jobs import describe, sweep_after, sweep_panel
from .scoring import finish_scoring, ready_score_task, scoring_context

log = logging.getLogger(__name__)

WINDOW_PER_SLOT = 2
"""Tasks held by the pool per slot: one running and one waiting, so a worker never waits
for the driver between tasks, while the rest of the queue (and its order) stays here."""


@dataclass
class _Panel:
    """One panel's state in the study's queue."""

    name: str
    gen_out: Path
    score_out: Path
    todo_all: list[Candidate]
    pairs: dict[tuple[str, str, int], list[Candidate]] = field(default_factory=dict)
    records: dict[Path, GenerationRecord] = field(default_factory=dict)
    todo: list[Candidate] = field(default_factory=list)
    scored: set[str] = field(default_factory=set)
    ran_score: int = 0
    outstanding: int = 0  # its tasks queued here or in the pool
    failed: int = 0
    done: bool = False


class _StudyQueue:
    """The driver's queue over every panel: what to submit next, and when a panel is done."""

    def __init__(self, study: StudySpec, panels: list[_Panel], build: Any, window: int) -> None:
        self.study, self.build, self.window = study, build, window
        self.panels = {p.name: p for p in panels}
        self.by_id = {c.key.candidate_id: c for p in panels for c in p.todo_all}
        self.scores: deque[Task] = deque()
        self.generation: deque[Task] = deque()
        self.in_flight = 0
        self.ref: Any = None
        self.errors: list[PairFlowError] = []

    def prepare(self, shared: dict[str, Any]) -> list[Task]:
        """Runs while the workers start: every panel's incomplete candidates (queued panel
        by panel) and the score tasks that can run now; a panel with nothing to run gets
        its manifests at once. Returns the first window of tasks."""
        study = self.study
        self.ref = write_context(study.scratch, {**generation_context(study), **shared})
        for p in self.panels.values():
            p.todo.extend(incomplete(study, p.todo_all, p.records))
            checks = flop_checks(p.todo_all, study.stats.seed)
            self._add(p, self.generation, [(generate_task, generation_payload(self.ref, c, checks))
                                           for c in checks_last(p.todo, checks)])
            n_scores = self._add(p, self.scores, self._scores_ready(p, p.todo_all))
            log.info("generate %s: %d candidates, %d complete, %d to run", p.name, len(p.todo_all),
                     len(p.todo_all) - len(p.todo), len(p.todo))
            log.info("score %s: %d to score now, the others once their pair's videos land", p.name, n_scores)
            if not p.outstanding:
                self._finish(p)
        return self._refill()

    def follow(self, payload: dict[str, Any], result: dict[str, Any]) -> list[Task]:
        """A task succeeded: a generated candidate's record is verified and the score tasks
        it completes are queued; the panel is finished when it was its last task."""
        self.in_flight -= 1
        p = self.panels[payload["candidate"].key.panel]
        if payload.get("stage") == "generate":
            c = self.by_id[result["candidate_id"]]
            p.records[record_path(Layout(self.study.scratch), c)] = verified(self.study, c)
            self._add(p, self.scores, self._scores_ready(p, p.pairs[c.key.pair_key] if c.arm.is_control else [c]))
        self._settled(p)
        return self._refill()

    def failed(self, payload: dict[str, Any]) -> list[Task]:
        """A task failed after its retries (its failure record is written): its panel gets
        no manifests in this job; the queue goes on with the others."""
        self.in_flight -= 1
        p = self.panels[payload["candidate"].key.panel]
        p.failed += 1
        self._settled(p)
        return self._refill()

    def _add(self, p: _Panel, queue: deque[Task], tasks: list[Task]) -> int:
        queue.extend(tasks)
        p.outstanding += len(tasks)
        return len(tasks)

    def _scores_ready(self, p: _Panel, cs: Iterable[Candidate]) -> list[Task]:
        """The score tasks of ``cs`` whose record and control's record are verified (once each)."""
        out: list[Task] = []
        for c in cs:
            control = next(x for x in p.pairs[c.key.pair_key] if x.arm.is_control)
            task = ready_score_task(self.study, self.ref, self.build, c, control, p.records, p.scored)
            if task is not None:
                p.ran_score += 1
                out.append(task)
        return out

    def _settled(self, p: _Panel) -> None:
        p.outstanding -= 1
        if p.outstanding:
            return
        if p.failed:
            log.error("fleet: panel %s: %d task(s) failed; its manifests are not written (a rerun runs only its "
                      "unfinished candidates)", p.name, p.failed)
            return
        self._finish(p)

    def _finish(self, p: _Panel) -> None:
        """Write ``p``'s generation and score manifests now (as its own job would at its end)."""
        try:
            log.info("score %s: %d candidates, %d to score", p.name, len(p.todo_all), p.ran_score)
            finish_generation(self.study, p.name, p.todo_all, p.todo, p.records, p.gen_out)
            finish_scoring(self.study, p.name, p.todo_all, p.ran_score, self.build, p.score_out)
        except PairFlowError as e:  # this panel only; the others go on and the job fails at its end
            log.error("fleet: panel %s: its manifests cannot be written: %s", p.name, e)
            self.errors.append(e)
            return
        p.done = True
        log.info("fleet: panel %s done (%d of %d panels)", p.name, sum(q.done for q in self.panels.values()),
                 len(self.panels))

    def _refill(self) -> list[Task]:
        out: list[Task] = []
        while self.in_flight < self.window and (self.scores or self.generation):
            out.append((self.scores or self.generation).popleft())
            self.in_flight += 1
        return out


def run_study(study: StudySpec, outputs: dict[str, tuple[Path, Path]], grant: Grant) -> dict[str, Any]:
    """Generate and score every panel named in ``outputs`` (panel → (generation manifest,
    score manifest)) through one worker pool, writing each panel's manifests as soon as
    its last task settles.

    Holds every panel's lock throughout (a per-panel job or a second fleet job on any of
    them fails at once). Raises WeightsError before any worker starts when a scorer's
    weight is missing or altered; TaskFailedError after every task has settled when some
    failed (the other panels' manifests are written by then); the first manifest error
    (IntegrityError, ...) of a panel likewise, after the rest of the study has run."""
    layout = Layout(study.scratch)
    with ExitStack() as locks:
        for name in outputs:
            locks.enter_context(hold(panel_dir(layout, name), "fleet_study (every panel in one job)"))
        return _run_study(study, outputs, layout, grant)


def _run_study(study: StudySpec, outputs: dict[str, tuple[Path, Path]], layout: Layout,
               grant: Grant) -> dict[str, Any]:
    started = job_start()
    for name in outputs:
        sweep_panel(study, name, started, ("records", "videos", "scores", "failures/generate", "failures/score"))
    shared = scoring_context(study, grant)  # fails fast on a missing or altered weight
    panels = []
    for name, (gen_out, score_out) in outputs.items():
        p = _Panel(name, gen_out, score_out, candidates(study, study.panel(name)))
        for c in p.todo_all:
            p.pairs.setdefault(c.key.pair_key, []).append(c)
        panels.append(p)
    packing = workers_for(study, ("generate", "score"), grant)  # one pool serves both: the fewer workers
    slots = _slot_count(study.fleet, grant, packing)
    queue = _StudyQueue(study, panels, shared["scorer"], WINDOW_PER_SLOT * slots)
    label = f"fleet: {len(panels)} panels"
    start_early = any(not record_path(layout, c).exists() or not score_path(layout, c).exists()
                      for p in panels for c in p.todo_all)
    run_dir = layout.fleet_run_dir
    phases = run_dir / PHASES_DIR
    with _console("pairflow"), PhaseWatch(phases, label, slots if start_early else 0):
        hooks = TaskHooks(layout.fleet_telemetry, lambda p: failure_path(layout, p["candidate"], p["stage"]),
                          describe, warm=(warm_panel, panel_warm_payload(study, shared["scorer"], phases)),
                          start_early=start_early, follow=queue.follow, settle_failed=queue.failed)
        results = run_tasks(generate_task, lambda: queue.prepare(shared), run_dir, study.fleet, grant, label, hooks,
                            packing)
    for name in outputs:
        sweep_after(study, name, ("records", "videos", "scores"))
    if queue.errors:
        raise queue.errors[0]
    return {"panels": {p.name: {"ran": len(p.todo), "reused": len(p.todo_all) - len(p.todo), "scored": p.ran_score}
                       for p in panels}, "results": results}

"""A panel's candidates: every (prompt, seed, arm), in a fixed order, and their files.

Where each file lives is ``layout``'s business; the functions below name a candidate's
files through a ``Layout`` (no study needed), and say which outputs a finished candidate has (``expected_scores``),
so stages, verification and status agree on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..arms.registry import arm_digest
from ..identity import CandidateKey, digest_obj
from ..layout import Layout
from ..metrics import metric_spec
from .config import ArmSpec, PanelSpec, Prompt, StudySpec


@dataclass(frozen=True)
class Candidate:
    """One (prompt, seed, arm) of a panel: its identity, its prompt and its arm."""

    key: CandidateKey
    prompt: Prompt
    arm: ArmSpec

    @property
    def stem(self) -> str:
        return f"{self.key.prompt_id}-s{self.key.seed}"


def candidates(study: StudySpec, panel: PanelSpec) -> list[Candidate]:
    """Every (prompt, seed, arm) of a panel, in a fixed order."""
    model_digest = digest_obj(study.model.identity())
    arms = [(arm, arm_digest(arm)) for arm in study.arms]  # once per arm, not per candidate
    return [Candidate(CandidateKey(study.study, panel.name, p.prompt_id, p.digest, seed, arm.name,
                                   digest, model_digest), p, arm)
            for p in panel.prompts for seed in panel.seeds for arm, digest in arms]


def task_identity(c: Candidate) -> dict[str, Any]:
    """What a failure record names of its task (beside the path it is written to)."""
    return {"candidate_id": c.key.candidate_id, "panel": c.key.panel, "arm": c.arm.name,
            "prompt_id": c.key.prompt_id, "seed": c.key.seed}


def panel_dir(layout: Layout, panel: str) -> Path:
    return layout.panel(panel)


def video_path(layout: Layout, c: Candidate) -> Path:
    return layout.output(c.key.panel, "videos", c.arm.name, c.stem)


def record_path(layout: Layout, c: Candidate) -> Path:
    return layout.output(c.key.panel, "records", c.arm.name, c.stem)


def score_path(layout: Layout, c: Candidate) -> Path:
    return layout.output(c.key.panel, "scores", c.arm.name, c.stem)


def timing_path(layout: Layout, c: Candidate) -> Path:
    return layout.output(c.key.panel, "timing", c.arm.name, c.stem)


def expected_scores(study: StudySpec, arm: ArmSpec) -> list[str]:
    """The metrics a candidate of ``arm`` gets: all, except fidelity (FR) metrics for the
    control, which is its own reference."""
    return sorted(n for n in study.scorers if not (arm.is_control and metric_spec(n).kind == "FR"))


def generation_stale(record: Mapping[str, Any], c: Candidate, recipe_digest: str) -> str | None:
    """Why a verified generation ``record`` is not ``c``'s current one (another candidate
    id, or another encoder recipe than ``recipe_digest``), or None when it is. The check
    behind the generation stage's reuse and verify's stale records."""
    named = record.get("candidate", {}).get("candidate_id")
    if named != c.key.candidate_id:
        return f"names candidate {named}, the config implies {c.key.candidate_id}"
    recipe = record.get("encoder", {}).get("recipe_digest")
    if recipe != recipe_digest:
        return f"written with encoder recipe {recipe}, the recipe that runs now is {recipe_digest}"
    return None


def scores_stale(study: StudySpec, c: Candidate, record: Mapping[str, Any]) -> str | None:
    """Why a verified score ``record`` lacks or exceeds the metrics ``c`` gets
    (``expected_scores``), or None when it has exactly those. The check behind the
    scoring stage's reuse and verify's stale score records."""
    have, want = sorted(record.get("scores", {})), expected_scores(study, c.arm)
    return None if have == want else f"scores {have}, the config implies {want}"


def failure_path(layout: Layout, c: Candidate, stage: str) -> Path:
    """Where a candidate's task that failed after its retries is recorded (never a record
    location, so a failure can never look complete)."""
    return layout.failure(c.key.panel, stage, c.arm.name, c.stem)


COMBINED = "generate-score"
"""The job that generates and scores a panel under ``fleet.panel_jobs: combined``, where
per-job folders are named (its run folder, telemetry record and log)."""


def look_job(look: int) -> str:
    """The run folder and telemetry name of a group-sequential look's panel job (its
    own, so a later look or the final panel job does not overwrite them)."""
    return f"{COMBINED}-look{look}"


def job_stage(study: StudySpec, stage: str) -> str:
    """The job a panel's ``stage`` (generate, score) runs in: ``COMBINED`` for both under
    ``fleet.panel_jobs: combined``, else the stage itself."""
    return COMBINED if study.fleet.panel_jobs == "combined" and stage in ("generate", "score") else stage


def telemetry_path(layout: Layout, panel: str, stage: str) -> Path:
    """The stage's telemetry record (spans, busy share, NVML) for its last run with work."""
    return layout.telemetry(panel, stage)

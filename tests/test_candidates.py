"""candidates: what a finished candidate has. The stages and ``pairflow verify`` decide
"complete" with these checks, so they are tested here once, on typed records."""

from __future__ import annotations

from pathlib import Path

from conftest import generation_record, small_config, timing_record

from pairflow.metrics import metric_spec
from pairflow.plan.candidates import candidates, expected_scores, generation_stale, scores_stale
from pairflow.plan.config import StudySpec, study_from_raw
from pairflow.records.store import timing_frames_differ


def _study(tmp_path: Path, model: Path) -> StudySpec:
    return study_from_raw(small_config(tmp_path, model), tmp_path)


def test_expected_scores_leave_fidelity_metrics_out_for_the_control(tiny_model: Path, tmp_path: Path) -> None:
    study = _study(tmp_path, tiny_model)
    control, treatment = (next(a for a in study.arms if a.is_control), next(a for a in study.arms if not a.is_control))
    fr = {n for n in study.scorers if metric_spec(n).kind == "FR"}
    assert fr, "the small config scores at least one fidelity metric"
    assert expected_scores(study, treatment) == sorted(study.scorers)
    assert expected_scores(study, control) == sorted(set(study.scorers) - fr)


def test_a_generation_record_is_current_only_for_its_candidate_and_recipe(tiny_model: Path, tmp_path: Path) -> None:
    study = _study(tmp_path, tiny_model)
    c, other = candidates(study, study.panels[0])[:2]
    rec = generation_record("t", c.key.prompt_id, c.key.seed, c.arm.name, 1, "v")
    rec["candidate"]["candidate_id"] = c.key.candidate_id
    recipe = rec["encoder"]["recipe_digest"]
    assert generation_stale(rec, c, recipe) is None
    assert generation_stale(rec, other, recipe) == (f"names candidate {c.key.candidate_id}, the config implies "
                                                    f"{other.key.candidate_id}")
    assert generation_stale(rec, c, "xxh3_128:0") == (f"written with encoder recipe {recipe}, the recipe that runs "
                                                      "now is xxh3_128:0")


def test_a_score_record_is_stale_when_its_metrics_are_not_the_configs(tiny_model: Path, tmp_path: Path) -> None:
    study = _study(tmp_path, tiny_model)
    c = next(c for c in candidates(study, study.panels[0]) if not c.arm.is_control)
    want = expected_scores(study, c.arm)
    assert scores_stale(study, c, {"scores": {m: {} for m in want}}) is None
    fewer = {"scores": {m: {} for m in want[1:]}}
    assert scores_stale(study, c, fewer) == f"scores {want[1:]}, the config implies {want}"


def test_a_timed_run_with_other_frames_than_the_bulk_run_differs() -> None:
    gen = generation_record("t", "a", 0, "control", 1, "v")
    assert not timing_frames_differ(timing_record(gen, 1.0, matches=True))
    assert timing_frames_differ(timing_record(gen, 1.0, matches=False))
    not_sampled = {**timing_record(gen, None), "sampled": False, "matches_bulk_frames": None}
    assert not timing_frames_differ(not_sampled)  # not timed: nothing to differ

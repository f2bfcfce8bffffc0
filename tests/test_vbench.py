"""report.vbench: each arm's scores in VBench's own ``*_eval_results.json`` layout, compared
with an example written from VBench's published format (``tests/data/vbench_layout``), and
the total-score normalisation of VBench's ``cal_final_score`` against hand-computed numbers,
with the totals refused (their missing dimensions named) where dimensions are missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import generation_record, metric_spec, score_record, small_config, write_config

from pairflow.cli import main
from pairflow.errors import ConfigError, IntegrityError, StatsError
from pairflow.identity import digest_file
from pairflow.layout import Layout
from pairflow.plan.candidates import candidates, record_path, score_path
from pairflow.plan.config import StudySpec, study_from_raw
from pairflow.records.store import build_manifest, write_manifest, write_record
from pairflow.report.vbench import (
    EXPORTED,
    QUALITY,
    SEMANTIC,
    VideoScore,
    dimension_result,
    vbench_coverage,
    vbench_totals,
    write_vbench,
)

DATA = Path(__file__).parent / "data" / "vbench_layout"
EXAMPLE = json.loads((DATA / "example_eval_results.json").read_text())
EXPECTED = json.loads((DATA / "expected_normalized.json").read_text())

# PairFlow's per-video values (its own scale) per (prompt, arm); frames per prompt differ so that
# the frame-pair weighting of the consistency dimensions shows
VALUES = {
    ("a1", "control"): {"subject_consistency": 0.95, "background_consistency": 0.96, "temporal_flickering": 0.97,
                        "dynamic_degree": 1.0, "aesthetic_quality": 0.52, "imaging_quality": 0.61},
    ("a1", "pab"): {"subject_consistency": 0.93, "background_consistency": 0.94, "temporal_flickering": 0.96,
                    "dynamic_degree": 0.0, "aesthetic_quality": 0.50, "imaging_quality": 0.58},
    ("a2", "control"): {"subject_consistency": 0.85, "background_consistency": 0.90, "temporal_flickering": 0.95,
                        "dynamic_degree": 1.0, "aesthetic_quality": 0.44, "imaging_quality": 0.55},
    ("a2", "pab"): {"subject_consistency": 0.80, "background_consistency": 0.86, "temporal_flickering": 0.94,
                    "dynamic_degree": 1.0, "aesthetic_quality": 0.40, "imaging_quality": 0.50},
}
FRAMES = {"a1": 9, "a2": 17}
SCORERS = [*EXPORTED, "motion_smoothness_proxy", "ssim"]


def recorded_study(tmp_path: Path, static: dict[tuple[str, str], bool] | None = None,
                   decoded_with: str = "bt709") -> StudySpec:
    """2 prompts x 1 seed, control + pab, sealed generation and score records holding every
    VBench dimension PairFlow scores, plus motion_smoothness_proxy and (treatment) ssim."""
    cfg = small_config(tmp_path, tmp_path / "no-model", scorers=SCORERS)
    write_config(tmp_path, cfg)
    study = study_from_raw(cfg, tmp_path)
    layout = Layout(study.scratch)
    for c in candidates(study, study.panels[0]):
        pid, arm = c.key.prompt_id, c.arm.name
        gen = generation_record("t", pid, 0, arm, 1, f"{pid}{arm}")
        gen["candidate"]["candidate_id"] = c.key.candidate_id
        gen["video"]["frames"] = FRAMES[pid]
        ctrl = generation_record("t", pid, 0, "control", 1, f"{pid}control")
        gen = write_record(record_path(layout, c), gen)
        metrics: dict[str, tuple[float, dict[str, Any]]] = {
            m: (v, metric_spec(m)) for m, v in VALUES[(pid, arm)].items()}
        metrics["motion_smoothness_proxy"] = (0.99, metric_spec("motion_smoothness_proxy"))
        if arm != "control":
            metrics["ssim"] = (0.5, metric_spec("ssim", "FR"))
        rec = score_record(gen, ctrl, metrics)
        for entry in rec["scores"].values():
            entry["decoded_with"] = decoded_with
        if static is not None:
            rec["static_filter"] = {"temporal_flickering": "intersection", "meaning": "both videos static"}
            rec["scores"]["temporal_flickering"]["static"] = static[(pid, arm)]
        write_record(score_path(layout, c), rec)
    return study


def _shape(value: Any) -> Any:
    """A JSON value's structure: dict keys with their values' shapes, list items' shapes, the type of a leaf."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


def test_each_arm_file_has_vbench_layout_as_the_published_example(tmp_path: Path) -> None:
    """Keys, nesting and types of every dimension match VBench's example (per video a path
    and a value; background's extra video_sim and cnt_per_video; dynamic_degree a boolean),
    written as VBench's save_json writes (indent 4); motion_smoothness (PairFlow's is a proxy)
    and the non-VBench metrics are left out."""
    study = recorded_study(tmp_path)
    written = write_vbench(study, tmp_path / "out")
    assert [p.relative_to(tmp_path / "out").as_posix() for p in written] == [
        "vbench/control_eval_results.json", "vbench/pab_eval_results.json", "vbench_summary.json"]
    for path in written[:2]:
        text = path.read_text()
        mine = json.loads(text)
        assert text == json.dumps(mine, indent=4)
        assert list(mine) == list(EXPORTED)
        assert set(mine) == set(EXAMPLE) - {"motion_smoothness"}
        for dim, result in mine.items():
            # two videos each, as in the example: the whole structure, leaf types included, is equal
            assert _shape(result) == _shape(EXAMPLE[dim]), dim
        assert [e["video_path"] for e in mine["aesthetic_quality"][1]] == [
            f"panels/t/videos/{path.name.split('_')[0]}/{pid}-s0.mp4" for pid in ("a1", "a2")]
        assert all((study.scratch / e["video_path"]).parent.parent.name == "videos"
                   for e in mine["aesthetic_quality"][1])


def test_values_are_on_vbench_scale_and_overall_formed_as_vbench_forms_it(tmp_path: Path) -> None:
    study = recorded_study(tmp_path)
    (path, *_) = write_vbench(study, tmp_path / "out")
    mine = json.loads(path.read_text())
    a1, a2 = VALUES[("a1", "control")], VALUES[("a2", "control")]
    # imaging_quality: per video MUSIQ's 0-100, overall / 100
    assert [e["video_results"] for e in mine["imaging_quality"][1]] == pytest.approx([61.0, 55.0])
    assert mine["imaging_quality"][0] == pytest.approx((61.0 + 55.0) / 2 / 100)
    # dynamic_degree: booleans, overall the share of true
    assert [e["video_results"] for e in mine["dynamic_degree"][1]] == [True, True]
    assert mine["dynamic_degree"][0] == 1.0
    # consistency: weighted by frame pairs (8 and 16), not the plain mean of videos
    for dim in ("subject_consistency", "background_consistency"):
        assert mine[dim][0] == pytest.approx((a1[dim] * 8 + a2[dim] * 16) / 24)
        assert mine[dim][0] != pytest.approx((a1[dim] + a2[dim]) / 2)
    assert [(e["video_sim"], e["cnt_per_video"]) for e in mine["background_consistency"][1]] == [
        (pytest.approx(0.96 * 8), 8), (pytest.approx(0.90 * 16), 16)]
    for dim in ("temporal_flickering", "aesthetic_quality"):
        assert [e["video_results"] for e in mine[dim][1]] == [a1[dim], a2[dim]]
        assert mine[dim][0] == pytest.approx((a1[dim] + a2[dim]) / 2)
    pab = json.loads((tmp_path / "out" / "vbench" / "pab_eval_results.json").read_text())
    assert [e["video_results"] for e in pab["dynamic_degree"][1]] == [False, True]
    assert pab["dynamic_degree"][0] == 0.5


def test_the_example_overalls_follow_from_its_videos_as_dimension_result_forms_them() -> None:
    """The fixture's own overall scores, re-formed from its per-video values (15 frame pairs
    per video) by ``dimension_result``: the same arithmetic VBench's modules do."""
    for dim in EXPORTED:
        videos = [VideoScore(e["video_path"], float(e["video_results"]) / (100.0 if dim == "imaging_quality" else 1.0),
                             16) for e in EXAMPLE[dim][1]]
        overall, entries = dimension_result(dim, videos)
        assert overall == pytest.approx(EXAMPLE[dim][0], rel=1e-12), dim
        for mine, theirs in zip(entries, EXAMPLE[dim][1], strict=True):
            assert mine.keys() == theirs.keys() and mine["video_path"] == theirs["video_path"]
            assert type(mine["video_results"]) is type(theirs["video_results"])
            assert {k: v for k, v in mine.items() if k != "video_path"} == pytest.approx(
                {k: v for k, v in theirs.items() if k != "video_path"}, rel=1e-12), dim


def test_normalisation_and_totals_reproduce_the_hand_computed_numbers() -> None:
    out = vbench_totals(EXPECTED["scores"])
    assert list(out["dimensions"]) == list(QUALITY + SEMANTIC)
    for dim, norm in EXPECTED["normalized"].items():
        d = out["dimensions"][dim]
        assert d["normalized"] == pytest.approx(norm, rel=1e-12), dim
        assert d["weighted"] == pytest.approx(EXPECTED["weighted"].get(dim, norm), rel=1e-12), dim
    for total in ("quality_score", "semantic_score", "total_score"):
        assert out[total] == pytest.approx(EXPECTED[total], rel=1e-12), total
    assert out["cannot_form"] == {}


def test_totals_are_refused_naming_the_missing_dimensions() -> None:
    """VBench's script reads a missing dimension as 0 and prints a total anyway; here each
    total lacking a dimension is None and names what it lacks."""
    six = {d: EXPECTED["scores"][d] for d in EXPORTED}
    out = vbench_totals(six)
    assert (out["quality_score"], out["semantic_score"], out["total_score"]) == (None, None, None)
    assert out["cannot_form"] == EXPECTED["without_motion_smoothness_and_semantics"]["cannot_form"]
    assert set(out["dimensions"]) == set(EXPORTED)
    semantic_only = {d: EXPECTED["scores"][d] for d in SEMANTIC}
    out = vbench_totals(semantic_only)
    assert out["semantic_score"] == pytest.approx(EXPECTED["semantic_score"], rel=1e-12)
    assert out["quality_score"] is None and out["cannot_form"]["quality_score"] == list(QUALITY)
    with pytest.raises(ConfigError, match=r"\['motion_smoothness_proxy'\] are not VBench dimensions"):
        vbench_totals({"motion_smoothness_proxy": 0.9})


def test_coverage_names_what_pairflow_does_not_score_and_which_totals_cannot_be_formed() -> None:
    cov = vbench_coverage(SCORERS)
    assert cov.scored == tuple(d for d in QUALITY if d != "motion_smoothness")
    assert set(cov.missing) == {"motion_smoothness", *SEMANTIC}
    assert "motion_smoothness_proxy" in cov.missing["motion_smoothness"] and "AMT" in cov.missing["motion_smoothness"]
    assert cov.formable == ()
    assert cov.cannot_form == {k: tuple(v) for k, v in
                               EXPECTED["without_motion_smoothness_and_semantics"]["cannot_form"].items()}
    few = vbench_coverage(["temporal_flickering", "psnr"])
    assert few.scored == ("temporal_flickering",)
    assert few.missing["imaging_quality"].startswith("not scored")
    assert few.cannot_form["quality_score"] == tuple(d for d in QUALITY if d != "temporal_flickering")


def test_the_summary_carries_source_coverage_totals_and_how_frames_were_read(tmp_path: Path) -> None:
    study = recorded_study(tmp_path, decoded_with="bt709")
    out = tmp_path / "out"
    write_vbench(study, out)
    s = json.loads((out / "vbench_summary.json").read_text())
    assert s["kind"] == "vbench-summary" and "45e79ec14e69a2187202c675d2dbce1a71843d53" in s["source"]
    assert s["constants"]["normalize"]["motion_smoothness"] == {"min": 0.706, "max": 0.9975}
    assert s["coverage"]["formable"] == [] and "total_score" in s["coverage"]["cannot_form"]
    control = s["arms"]["control"]
    assert control["eval_results_digest"] == digest_file(out / "vbench" / "control_eval_results.json")
    assert control["videos"] == dict.fromkeys(EXPORTED, 2)
    assert control["quality_score"] is None and control["cannot_form"]["quality_score"] == ["motion_smoothness"]
    mine = json.loads((out / "vbench" / "control_eval_results.json").read_text())
    assert control["dimensions"]["temporal_flickering"]["score"] == mine["temporal_flickering"][0]
    assert control["dimensions"]["temporal_flickering"]["normalized"] == pytest.approx(
        (mine["temporal_flickering"][0] - 0.6293) / (1.0 - 0.6293))
    # bt709 everywhere: decord's dimensions read as VBench reads them, OpenCV's not
    assert control["read_as_vbench"] == {d: d not in ("temporal_flickering", "dynamic_degree") for d in EXPORTED}
    assert "imaging_quality" in control["scale"] and "temporal_flickering" not in control["scale"]


def test_the_static_filter_leaves_moving_videos_out_of_temporal_flickering(tmp_path: Path) -> None:
    static = {("a1", "control"): True, ("a1", "pab"): True, ("a2", "control"): False, ("a2", "pab"): False}
    study = recorded_study(tmp_path, static=static)
    write_vbench(study, tmp_path / "out")
    mine = json.loads((tmp_path / "out" / "vbench" / "control_eval_results.json").read_text())
    assert [e["video_path"] for e in mine["temporal_flickering"][1]] == ["panels/t/videos/control/a1-s0.mp4"]
    assert mine["temporal_flickering"][0] == VALUES[("a1", "control")]["temporal_flickering"]
    assert len(mine["aesthetic_quality"][1]) == 2
    with pytest.raises(StatsError, match="temporal_flickering: no video"):
        dimension_result("temporal_flickering", [VideoScore("v.mp4", 0.9, 9, static=False)])


def test_a_dynamic_degree_that_is_not_0_or_1_is_refused() -> None:
    with pytest.raises(IntegrityError, match=r"v.mp4: dynamic_degree 0.5 is not 0 or 1"):
        dimension_result("dynamic_degree", [VideoScore("v.mp4", 0.5, 9)])


def test_the_export_command_writes_the_vbench_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pairflow.generation.provenance import config_snapshot

    study = recorded_study(tmp_path)
    layout = Layout(study.scratch)
    write_manifest(layout.generation_manifest("t"), build_manifest(
        "panel-generation", layout.panel("t"), [], {"config": config_snapshot(study)}))
    assert main(["export", str(study.scratch), "--out", str(tmp_path / "x")]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "x" / n) for n in (
        "candidates.csv", "summary.csv", "vbench/control_eval_results.json", "vbench/pab_eval_results.json",
        "vbench_summary.json")]

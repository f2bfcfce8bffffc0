"""stages.combined: a panel's generation and scoring in one job and one worker pool, with a
candidate scored as soon as its video and its control's land; the same outputs and the
same resume rules as the per-stage jobs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import small_config

from pairflow.fleet.pool import Grant
from pairflow.generation.generate import run_queue_wait
from pairflow.identity import digest_file
from pairflow.layout import Layout
from pairflow.plan.candidates import COMBINED, candidates, record_path, score_path, telemetry_path, video_path
from pairflow.plan.config import study_from_raw
from pairflow.records.store import read_record
from pairflow.stages.combined import run_panel


def _run(study, at: Layout) -> dict:  # type: ignore[no-untyped-def]
    return run_panel(study, "t", at.generation_manifest("t"), at.score_manifest("t"), at.run_dir("t", COMBINED),
                     Grant())


@pytest.mark.slow
def test_one_job_generates_scores_as_pairs_land_and_resumes_only_the_unfinished(
        tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = small_config(tmp_path, tiny_model, scorers=["psnr", "temporal_flickering"])
    study = study_from_raw(cfg, tmp_path)
    assert study.fleet.panel_jobs == "combined"  # the default
    at = Layout(study.scratch)
    cs = candidates(study, study.panel("t"))

    with caplog.at_level(logging.INFO, logger="pairflow"):
        first = _run(study, at)
    # The log speaks from the first second: the pool starting, each start-up phase as it
    # begins (polled every 2 s: a phase shorter than that, such as a forked worker's 0.2 s
    # model load, may pass unseen): under fleet.worker_start: forkserver (the default) the
    # fork server's imports for every worker, then workers ready, then progress lines.
    text = caplog.text
    order = [text.index(s) for s in ("starting 1 worker(s)", "fork-server-", "importing torch, diffusers, pyiqa",
                                     " done (")]
    assert order == sorted(order), text[-3000:]
    # "workers ready" is read by the same 2 s poll: with tasks this fast (a few hundred ms)
    # the first ones may finish before the poll that sees the worker ready.
    assert text.index("importing torch, diffusers, pyiqa") < text.index("workers ready 1/1"), text[-3000:]
    assert (first["ran"], first["scored"]) == (4, 4)
    if run_queue_wait() is not None:  # issue 37: the bulk wall time split into CPU and wait for a CPU
        assert "4 generated in" in text and "waiting for a CPU" in text, text[-3000:]
    gen, scores = (json.loads(m.read_text()) for m in (at.generation_manifest("t"), at.score_manifest("t")))
    assert gen["kind"] == "panel-generation" and scores["kind"] == "panel-scores" and scores["ran"] == 4
    for c in cs:  # every score is bound to its candidate's generation record and video
        g, s = read_record(record_path(Layout(study.scratch), c)), read_record(score_path(Layout(study.scratch), c))
        assert s["generation_record_digest"] == g["record_digest"] and s["video_digest"] == g["video"]["digest"]
        assert ("psnr" in s["scores"]) == (not c.arm.is_control)
        # one worker served both kinds: the pool's warm-up loaded the model once, for both
        assert s["worker"]["pid"] == g["worker"]["pid"] and g["worker"]["model_loads"]
        assert sum(g["worker"]["model_loads"].values()) == 1
        # issue 37: the bulk wall time comes with its CPU time and its wait for a CPU
        tm = g["timing"]
        assert 0 < tm["generate_cpu_s"] <= tm["generate_s"] * 1.05 + 0.01
        assert tm["generate_wait_s"] is None or 0 <= tm["generate_wait_s"] <= tm["generate_s"] + 0.01
    t = json.loads(telemetry_path(Layout(study.scratch), "t", COMBINED).read_text())
    spans = [s for s in t["spans"] if s.get("kind") != "warm-up"]
    assert sorted(s["stage"] for s in spans) == ["generate"] * 4 + ["score"] * 4
    # No calibration table for this study: the default (fleet.cpu_workers), and the record says so.
    assert t["packing"]["workers_per_node"] == 1 and t["packing"]["source"].startswith("default: no calibration table")
    # Scoring was fed as pairs landed: the first pair's score tasks were queued before the
    # panel's last video was generated (per-stage, scoring starts after the whole panel).
    last_video = max(s["finished"] for s in spans if s["stage"] == "generate")
    assert min(s["queued"] for s in spans if s["stage"] == "score") < last_video
    assert not telemetry_path(Layout(study.scratch), "t", "generate").exists() and not telemetry_path(Layout(study.scratch), "t", "score").exists()

    # A lost treatment video: only that candidate is regenerated and rescored; the rest is kept.
    lost = next(c for c in cs if not c.arm.is_control)
    kept = {score_path(Layout(study.scratch), c): digest_file(score_path(Layout(study.scratch), c)) for c in cs if c != lost}
    video_path(Layout(study.scratch), lost).unlink()
    again = _run(study, at)
    assert (again["ran"], again["scored"]) == (1, 1)
    assert all(digest_file(p) == d for p, d in kept.items())
    assert read_record(score_path(Layout(study.scratch), lost))["generation_record_digest"] == \
        read_record(record_path(Layout(study.scratch), lost))["record_digest"]

    # Nothing missing: no task runs, and both manifests are written again.
    assert _run(study, at)["scored"] == 0 and at.score_manifest("t").exists()

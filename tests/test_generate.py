"""Generation on the tiny model: seeds, pairing, cache enable/disable hygiene."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pairflow.arms import check_arms
from pairflow.arms.kinds.cache import cache_config
from pairflow.errors import ConfigError
from pairflow.generation.generate import LOAD_COUNTS, generate, load_pipeline
from pairflow.layout import Layout
from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec

GEN = GenerationSpec(frames=5, height=32, width=32, steps=3, guidance=5.0, fps=8, dtype="float32", threads=1)
CONTROL = ArmSpec("control", None)
PAB = ArmSpec("pab", "PyramidAttentionBroadcastConfig",
              {"spatial_attention_block_skip_range": 2, "spatial_attention_timestep_skip_range": [-1, 1000]})


@pytest.fixture(scope="module")
def pipe(tiny_model: Path):  # type: ignore[no-untyped-def]
    return load_pipeline(ModelSpec("embedded-tiny", tiny_model), "float32", 1)


def run(pipe, seed: int, arm: ArmSpec = CONTROL) -> np.ndarray:  # type: ignore[no-untyped-def]
    return generate(pipe, "a red fox", seed, arm, GEN, 64).frames


def test_pipeline_is_loaded_once_per_process(pipe, tiny_model: Path) -> None:  # type: ignore[no-untyped-def]
    # Other tests of the session may have loaded this model in another precision (a
    # dtype arm): what counts is that asking again loads nothing.
    loads = LOAD_COUNTS[str(tiny_model)]
    again = load_pipeline(ModelSpec("embedded-tiny", tiny_model), "float32", 1)
    assert again is pipe
    assert LOAD_COUNTS[str(tiny_model)] == loads >= 1


def test_same_seed_is_bitwise_identical_and_seeds_differ(pipe) -> None:  # type: ignore[no-untyped-def]
    a, b, c = run(pipe, 7), run(pipe, 7), run(pipe, 8)
    assert a.shape == (5, 32, 32, 3) and a.dtype == np.float32
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_each_denoising_step_is_reported_as_progress_and_changes_nothing(pipe) -> None:  # type: ignore[no-untyped-def]
    """The stall check's heartbeat: one report per step (a diffusers callback), same frames."""
    from pairflow import progress

    notes: list[str] = []
    with progress.reporting_to(notes.append):
        reported = run(pipe, 7)
    assert notes == [f"denoising step {i}/{GEN.steps}" for i in range(1, GEN.steps + 1)]
    assert np.array_equal(reported, run(pipe, 7))


def test_treatment_differs_from_control_yet_reproduces(pipe) -> None:  # type: ignore[no-untyped-def]
    c, t1, t2 = run(pipe, 3), run(pipe, 3, PAB), run(pipe, 3, PAB)
    assert not np.array_equal(c, t1)
    assert np.array_equal(t1, t2)


def test_disable_cache_restores_control_exactly(pipe) -> None:  # type: ignore[no-untyped-def]
    before = run(pipe, 5)
    run(pipe, 5, PAB)
    assert not pipe.transformer.is_cache_enabled
    assert np.array_equal(run(pipe, 5), before)


def test_a_failure_mid_generation_does_not_leak_the_cache(pipe) -> None:  # type: ignore[no-untyped-def]
    before = run(pipe, 5)
    bad = GenerationSpec(**{**GEN.__dict__, "frames": 5, "height": 33})  # diffusers rejects 33
    with pytest.raises(ValueError):
        generate(pipe, "a red fox", 5, PAB, bad, 64)
    assert not pipe.transformer.is_cache_enabled
    assert np.array_equal(run(pipe, 5), before)


def test_unknown_cache_parameter_names_allowed_ones(pipe) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="has no settable parameter 'thresh'; did you mean 'threshold'.*Allowed"):
        cache_config(ArmSpec("fb", "FirstBlockCacheConfig", {"thresh": 1}), pipe)


@pytest.mark.parametrize("arm, words", [
    (ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": "0.1"}),
     ["arm 'fb'", "arms/fb/cache/params/threshold", "'0.1' (str)", "expects float"]),
    (ArmSpec("pab", "PyramidAttentionBroadcastConfig", {"spatial_attention_block_skip_range": 2.5}),
     ["arm 'pab'", "spatial_attention_block_skip_range", "2.5 (float)", "expects int | None"]),
    (ArmSpec("pab", "PyramidAttentionBroadcastConfig", {"spatial_attention_timestep_skip_range": [0, "900"]}),
     ["spatial_attention_timestep_skip_range", "expects tuple[int, int]"]),
    (ArmSpec("pab", "PyramidAttentionBroadcastConfig", {"current_timestep_callback": 3}),
     ["current_timestep_callback", "no settable parameter"]),
    (ArmSpec("tay", "TaylorSeerCacheConfig", {"use_lite_mode": 1}), ["use_lite_mode", "1 (int)", "expects bool"]),
    (ArmSpec("fb", "FirstBlockCachConfig", {}),
     ["arms/fb/cache/class", "'FirstBlockCachConfig'", "did you mean 'FirstBlockCacheConfig'?"]),
])
def test_cache_class_and_params_are_checked_before_any_model_loads(tiny_model: Path, arm, words) -> None:  # type: ignore[no-untyped-def]
    """The error names the arm, the key, the expected and the given type, from the
    installed diffusers' dataclass fields; no weights are loaded to find out."""
    with pytest.raises(ConfigError) as e:
        check_arms((CONTROL, arm), ModelSpec("embedded-tiny", tiny_model))
    for w in words:
        assert w in str(e.value), str(e.value)
    check_arms((CONTROL, PAB), ModelSpec("embedded-tiny", tiny_model))  # the good arm passes


def test_a_transformer_that_cannot_take_a_cache_is_refused(tmp_path: Path) -> None:
    import json

    (tmp_path / "m" / "transformer").mkdir(parents=True)
    (tmp_path / "m" / "transformer" / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    with pytest.raises(ConfigError, match="UNet2DModel.*does not support diffusers caches"):
        check_arms((CONTROL, PAB), ModelSpec("local", tmp_path / "m"))
    check_arms((CONTROL,), ModelSpec("local", tmp_path / "m"))  # no cache arm: nothing to apply
    # A hub mirror: the pinned snapshot in the Hugging Face cache layout, by commit or by ref.
    repo = tmp_path / "hub" / "models--org--m"
    (repo / "snapshots" / "abc" / "transformer").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "transformer" / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    for revision in ("abc", "main"):
        with pytest.raises(ConfigError, match="UNet2DModel.*does not support diffusers caches"):
            check_arms((CONTROL, PAB), ModelSpec("hub-mirror", tmp_path / "hub", "org/m", revision))


def test_tiny_model_build_is_byte_reproducible(tiny_model: Path, tmp_path: Path) -> None:
    from pairflow.generation.tinymodel import build_tiny_model
    from pairflow.identity import digest_tree

    again = build_tiny_model(tmp_path / "again")
    assert digest_tree(again) == digest_tree(tiny_model)


@pytest.mark.parametrize("family, pipeline, tokens", [("cogvideox", "CogVideoXPipeline", 16),
                                                      ("ltx", "LTXPipeline", 64),
                                                      ("hunyuanvideo", "HunyuanVideoPipeline", 64)])
def test_other_families_load_from_pretrained_and_generate_with_a_cache(tmp_path: Path, family: str,
                                                                       pipeline: str, tokens: int) -> None:
    """Tiny CogVideoX, LTX and HunyuanVideo pipelines built offline with diffusers' own classes, loaded
    through from_pretrained like a user's checkpoint. CogVideoX's transformer caps text at
    16 tokens (its pipeline's default is 226, which used to fail with a tensor-size mismatch)."""
    from dataclasses import replace

    from pairflow.generation.generate import pipeline_info, text_tokens
    from pairflow.generation.tinymodel import build_tiny_model

    model = ModelSpec("local", build_tiny_model(tmp_path / family, family))
    gen = replace(GEN, frames=9)
    check_arms((CONTROL, PAB), model)
    pipe = load_pipeline(model, "float32", 1)
    n = text_tokens(pipe, GEN)
    assert n == tokens
    info = pipeline_info(pipe, n)
    assert info["class"] == pipeline and info["family"] in ("cogvideo", "ltx", "hunyuan_video") and info["max_text_tokens"] == tokens
    control = generate(pipe, "a red fox", 3, CONTROL, gen, n).frames
    cached = generate(pipe, "a red fox", 3, PAB, gen, n).frames
    assert control.shape == cached.shape == (9, GEN.height, GEN.width, 3)
    assert np.array_equal(control, generate(pipe, "a red fox", 3, CONTROL, gen, n).frames)
    assert not pipe.transformer.is_cache_enabled
    if family == "cogvideox":
        from pairflow.errors import FrameError

        with pytest.raises(FrameError, match="returned 8 frames for generation/frames 5"):
            generate(pipe, "a red fox", 3, CONTROL, GEN, n)  # its VAE decodes 2 latent frames to 8
        with pytest.raises(ConfigError, match="max_text_tokens' is 32.*at most 16"):
            text_tokens(pipe, replace(GEN, max_text_tokens=32))
    assert text_tokens(pipe, replace(GEN, max_text_tokens=8)) == 8


def test_a_cache_that_never_fires_reproduces_control_bit_for_bit_and_is_flagged(tiny_model: Path,
                                                                                 tmp_path: Path) -> None:
    """The pairing test (issue 15): the seed that reaches torch.Generator, not only the
    recorded stream_seed, must be the same for every arm. A FirstBlockCache at threshold 0
    recomputes every block, so its videos must equal control's bit for bit through the
    real task (generate, guard, encode, record); a treatment seeded differently (e.g.
    ``stream_seed + 1``) fails here. The statistics then flag the arm as having no effect."""
    from conftest import score_record, small_config, timing_record

    from pairflow.analysis.stats import analyse
    from pairflow.generation.provenance import provenance
    from pairflow.media.video import prepare_frames, read_video
    from pairflow.plan.candidates import candidates, record_path, video_path
    from pairflow.plan.config import StatsSpec, study_from_raw
    from pairflow.plan.context import write_context
    from pairflow.records.store import read_record
    from pairflow.stages.generation import generate_task

    cfg = small_config(tmp_path, tiny_model, encoder={"lossless": True},
                       arms={"control": {"cache": None},
                             "never": {"cache": {"class": "FirstBlockCacheConfig", "params": {"threshold": 0.0}}}})
    study = study_from_raw(cfg, tmp_path)
    cands = [c for c in candidates(study, study.panels[0]) if c.key.prompt_id == "a1"]
    assert sorted(c.arm.name for c in cands) == ["control", "never"]
    ref = write_context(study.scratch, {"study": study, "provenance": provenance(study)})
    frames, gen = {}, []
    for c in cands:
        generate_task({"context": ref, "candidate": c})
        g = study.generation
        frames[c.arm.name] = read_video(video_path(Layout(study.scratch), c), study.encoder, frames=g.frames, height=g.height,
                                        width=g.width, fps=g.fps)
        gen.append(read_record(record_path(Layout(study.scratch), c)))
    assert np.array_equal(frames["control"], frames["never"])
    # and that seed is the recorded stream seed: control equals a direct call with it
    pipe = load_pipeline(study.model, "float32", 1)
    direct = generate(pipe, cands[0].prompt.text, cands[0].key.stream_seed, CONTROL, study.generation, 64).frames
    assert np.array_equal(frames["control"], prepare_frames(direct, study.encoder)[0])
    timing = [timing_record(r, 1.0) for r in gen]
    scores = [score_record(r, gen[0], {}) for r in gen]  # gen[0]: control
    res = analyse(gen, scores, timing, ["never"], StatsSpec(200, 0.95, 0))
    assert "this arm changed nothing: every video is bit-identical to control's" in res["comparisons"][0]["flags"]
    from pairflow.report.table import table

    assert table(res)[1][0][0] == "never (this arm changed nothing)"


def test_the_bulk_pass_measures_a_flop_table_once_then_derives_and_cross_checks(tiny_model: Path,
                                                                                  tmp_path: Path) -> None:
    """Issue 25 item 2 through the real task: the first candidate of an arm is counted in
    full and its table saved under scratch; the next derives its FLOPs from hook counts;
    the seeded cross-check candidate is counted in full and agrees with the derivation."""
    from conftest import small_config

    from pairflow.generation.provenance import provenance
    from pairflow.layout import Layout
    from pairflow.plan.candidates import candidates, record_path
    from pairflow.plan.config import study_from_raw
    from pairflow.plan.context import write_context
    from pairflow.records.store import read_record
    from pairflow.stages import generation as stage

    cfg = small_config(tmp_path, tiny_model, arms={"control": {"cache": None},
                                                   "fb": {"cache": {"class": "FirstBlockCacheConfig",
                                                                    "params": {"threshold": 0.0}}}})
    study = study_from_raw(cfg, tmp_path)
    cands = candidates(study, study.panels[0])
    checks = stage.flop_checks(cands, study.stats.seed)
    assert sorted(c.arm.name for c in cands if c.key.candidate_id in checks) == ["control", "fb"]
    assert stage.flop_checks(list(reversed(cands)), study.stats.seed) == checks  # order-free
    queued = stage.checks_last(cands, checks)  # checked last, so their arm's table is measured by then
    assert [c.key.candidate_id in checks for c in queued] == sorted(c.key.candidate_id in checks for c in cands)
    assert [c for c in queued if c.key.candidate_id not in checks] == [c for c in cands if c.key.candidate_id not in checks]
    ref = write_context(study.scratch, {"study": study, "provenance": provenance(study)})
    control = [c for c in cands if c.arm.name == "control"]
    first, second = control[0], control[1]
    stage.generate_task({"context": ref, "candidate": first, "flops_check": False})
    assert read_record(record_path(Layout(study.scratch), first))["compute"]["method"] == "counted"
    assert len(list(Layout(study.scratch).flop_tables.glob("*.json"))) == 1
    stage.generate_task({"context": ref, "candidate": second, "flops_check": False})
    derived = read_record(record_path(Layout(study.scratch), second))["compute"]
    stage.generate_task({"context": ref, "candidate": second, "flops_check": True})
    counted = read_record(record_path(Layout(study.scratch), second))["compute"]
    assert derived["method"] == "derived" and counted["method"] == "counted"
    assert derived["table"] == counted["table"]
    assert counted["cross_check"] == {"derived_transformer_flops": counted["transformer_flops"], "equal": True}
    assert derived["work_flops"] == counted["work_flops"] and derived["total_flops"] == counted["total_flops"]


def test_generation_records_peak_memory_per_phase(pipe) -> None:  # type: ignore[no-untyped-def]
    r = generate(pipe, "a red fox", 3, CONTROL, GEN, 64)
    peaks = r.memory.asdict()
    assert set(peaks) == {"denoise", "decode"}
    for p in peaks.values():
        assert p["peak_rss_mb"] > 0 and (p["peak_device_mb"] is None) == (r.device == "cpu")
    assert not hasattr(pipe.vae, "__dict__") or "decode" not in pipe.vae.__dict__  # the wrapper is gone


def test_warm_up_books_the_pipelines_lazy_imports_as_imports_not_load(tiny_model: Path) -> None:
    """Issue 25 item 3: in a fresh process, pipeline_imports imports the pipeline's and
    every component's module (diffusers/transformers import them lazily), so loading the
    model afterwards imports no module of theirs: load_s is the weights alone."""
    import subprocess
    import sys

    code = f"""
import sys
from pathlib import Path
from pairflow.plan.config import ModelSpec
from pairflow.generation.generate import load_pipeline, pipeline_imports
m = ModelSpec('embedded-tiny', Path({str(tiny_model)!r}))
assert 'diffusers.pipelines.wan.pipeline_wan' not in sys.modules
took = pipeline_imports(m)
assert took > 0 and pipeline_imports(m) < took
before = set(sys.modules)
load_pipeline(m, 'float32', 1)
late = sorted(n for n in set(sys.modules) - before if n.split('.')[0] in ('diffusers', 'transformers'))
print('LATE', late)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    late = [line for line in out.stdout.splitlines() if line.startswith("LATE")][0]
    assert "pipeline_wan" not in late and "modeling_umt5" not in late and "autoencoder_kl_wan" not in late, late


def test_generation_records_its_cpu_time_and_its_wait_for_a_cpu(pipe) -> None:  # type: ignore[no-untyped-def]
    """Issue 37: bulk wall times drifted with panel size while the work did not. A result
    carries the process's CPU time and, on Linux, the thread's run-queue wait over the same
    interval as its wall time: with a busy process on the same core, the wall time grows by
    the wait and the CPU time does not."""
    import os
    import subprocess
    import sys
    import time

    from pairflow.generation.generate import run_queue_wait

    alone = generate(pipe, "a red fox", 3, CONTROL, GEN, 64)
    assert alone.cpu_seconds is not None and 0 < alone.cpu_seconds <= alone.seconds * 1.05 + 0.01
    if run_queue_wait() is None or not hasattr(os, "sched_setaffinity"):
        assert alone.wait_seconds is None
        return
    assert alone.wait_seconds is not None and alone.wait_seconds >= 0
    core = min(os.sched_getaffinity(0))
    previous = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", f"import os, time; os.sched_setaffinity(0, {{{core}}}); "
                             "end = time.time() + 20\nwhile time.time() < end: pass"])
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.2)  # the competitor is running on our core
        shared = [generate(pipe, "a red fox", 3, CONTROL, GEN, 64) for _ in range(3)]
    finally:
        os.sched_setaffinity(0, previous)
        busy.kill()
        busy.wait()
    for r in shared:
        assert r.cpu_seconds is not None and r.wait_seconds is not None
        assert r.wait_seconds > 0.2 * r.seconds  # the competitor took a share of the wall time
        assert abs(r.seconds - r.cpu_seconds - r.wait_seconds) < 0.1 * r.seconds + 0.01  # wall = CPU + wait
        assert np.array_equal(r.frames, alone.frames)  # same work, same frames

"""Exact compute per video on the tiny model: counted block skips and FLOP ratios."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pairflow.arms import run_arm
from pairflow.config import ArmSpec, GenerationSpec, ModelSpec, SearchSpec, StatsSpec
from pairflow.generate import generate, load_pipeline
from pairflow.stats import _compute, no_effect_flags

GEN = GenerationSpec(frames=5, height=32, width=32, steps=3, guidance=5.0, fps=8, dtype="float32", threads=1)
CONTROL = ArmSpec("control")
FB0 = ArmSpec("fb0", "FirstBlockCacheConfig", {"threshold": 0.0})
FB = ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 1.2})
PROMPTS = ("a red fox in snow", "waves on a beach")


@pytest.fixture(scope="module")
def pipe(tiny_model: Path):  # type: ignore[no-untyped-def]
    return load_pipeline(ModelSpec("embedded-tiny", tiny_model), "float32", 1)


def records(pipe, arm: ArmSpec, verifier=None) -> dict:  # type: ignore[no-untyped-def]
    """Generation records (the fields stats reads) for two prompts, seed 0."""
    from pairflow.identity import digest_bytes

    out = {}
    for i, prompt in enumerate(PROMPTS):
        r = run_arm(pipe, prompt, 11 + i, arm, GEN, 64, count=True, verifier=verifier)
        raw = (np.clip(np.asarray(r.frames, dtype=np.float32), 0, 1) * 255).round().astype(np.uint8)
        out[(f"t/p{i}", 0)] = {"compute": r.compute, "arm": {"name": arm.name, "kinds": list(arm.kinds)},
                               "video": {"raw_digest": digest_bytes(raw.tobytes()), "digest": "x"}}
    return out


def ratio(pipe, arm: ArmSpec, verifier=None) -> tuple[dict, list]:  # type: ignore[no-untyped-def]
    gen = {"control": records(pipe, CONTROL), arm.name: records(pipe, arm, verifier)}
    keys = sorted(gen["control"])
    compute = _compute(gen, arm.name, keys, StatsSpec(200, 0.95, 0))
    return compute, no_effect_flags(gen, arm.name, keys, compute)


def test_first_block_cache_at_threshold_0_computes_everything_and_is_flagged(pipe) -> None:  # type: ignore[no-untyped-def]
    compute, flags = ratio(pipe, FB0)
    assert compute["ratio"] == 1.0
    assert compute["blocks_skipped"] == 0 and compute["attention_skipped"] == 0
    assert compute["blocks_computed"] == compute["control_blocks_computed"] == 2 * 3 * 2 * 4  # prompts*steps*CFG*blocks
    assert any(f.startswith("this arm changed nothing: its cache skipped no transformer block") for f in flags)
    assert any(f.startswith("this arm changed nothing: every video is bit-identical") for f in flags)


def test_a_skipping_first_block_cache_counts_its_skips_and_costs_less(pipe) -> None:  # type: ignore[no-untyped-def]
    compute, flags = ratio(pipe, FB)
    assert compute["blocks_skipped"] > 0
    assert 0 < compute["ratio"] < 1
    # the FLOPs saved are the skipped blocks' share: computed + skipped = control's block forwards
    assert compute["blocks_computed"] + compute["blocks_skipped"] == compute["control_blocks_computed"]
    assert flags == []


def test_a_few_step_arm_costs_its_share_of_steps(pipe) -> None:  # type: ignore[no-untyped-def]
    compute, _ = ratio(pipe, ArmSpec("few", steps=1))
    assert compute["ratio"] == pytest.approx(1 / 3, rel=1e-12)


def test_a_search_arm_of_n_costs_about_n(pipe) -> None:  # type: ignore[no-untyped-def]
    from pairflow.arms import Verifier
    from pairflow.config import EncoderSpec

    enc = EncoderSpec(ffmpeg="", codec="libx264", crf=18, preset="medium", pix_fmt="yuv420p", gop=9, threads=1,
                      lossless=False, fail_on_flat=False)
    verifier = Verifier("temporal_flickering", True, enc, None, 16, 8)
    compute, _ = ratio(pipe, ArmSpec("best3", search=SearchSpec(3, "temporal_flickering")), verifier)
    assert compute["generations"] == 6  # 2 prompts x 3 candidates
    assert compute["ratio"] == pytest.approx(3.0, rel=0.01)


def test_counting_changes_no_pixel_and_leaves_no_hook(pipe) -> None:  # type: ignore[no-untyped-def]
    plain = generate(pipe, "a red fox", 3, FB, GEN, 64).frames
    counted = generate(pipe, "a red fox", 3, FB, GEN, 64, count=True)
    assert np.array_equal(plain, counted.frames)
    assert counted.compute["latent_shape"] == [16, 2, 4, 4]
    hooks = [m for m in pipe.transformer.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooks == []

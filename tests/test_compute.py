"""Exact compute per video on the tiny model: counted block skips and FLOP ratios."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pairflow.analysis.stats import _compute, no_effect_flags
from pairflow.arms.registry import declared_kinds
from pairflow.generation.armrun import run_arm
from pairflow.generation.generate import generate, load_pipeline
from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec, SearchSpec, StatsSpec

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
        out[(f"t/p{i}", 0)] = {"compute": r.compute, "arm": {"name": arm.name, "kinds": list(declared_kinds(arm))},
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
    from pairflow.plan.config import EncoderSpec

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


PAB = ArmSpec("pab", "PyramidAttentionBroadcastConfig",
              {"spatial_attention_block_skip_range": 2, "spatial_attention_timestep_skip_range": [0, 1000]})


def _verifier():  # type: ignore[no-untyped-def]
    from pairflow.arms import Verifier
    from pairflow.plan.config import EncoderSpec

    enc = EncoderSpec(ffmpeg="", codec="libx264", crf=18, preset="medium", pix_fmt="yuv420p", gop=9, threads=1,
                      lossless=False, fail_on_flat=False)
    return Verifier("temporal_flickering", True, enc, None, 16, 8)


@pytest.mark.parametrize("arm", [CONTROL, FB, FB0, PAB, ArmSpec("few", steps=1),
                                 ArmSpec("best2", search=SearchSpec(2, "temporal_flickering")),
                                 ArmSpec("bf16", dtype="bfloat16"), ArmSpec("native", attention_backend="native"),
                                 ArmSpec("sched", scheduler_class="DPMSolverMultistepScheduler"),
                                 ArmSpec("student", model=ModelSpec("local", Path("STUDENT")))],
                         ids=lambda a: a.name)
def test_derived_flops_equal_full_counting_exactly(pipe, arm: ArmSpec, tmp_path: Path, tiny_model: Path) -> None:  # type: ignore[no-untyped-def]
    """Measure a table on one prompt, derive another prompt's FLOPs from hook counts alone,
    and compare with FlopCounterMode on that same run: equal to the FLOP, every arm kind
    (caches, steps, search, dtype, attention backend, scheduler, another checkpoint)."""
    from dataclasses import replace

    from pairflow.generation.armrun import arm_pipeline
    from pairflow.generation.compute import load_table, save_table

    if arm.model is not None:  # a student: here the tiny model's own files under another path
        import shutil

        arm = replace(arm, model=ModelSpec("local", Path(shutil.copytree(tiny_model, tmp_path / "student"))))
    if arm.model is not None or arm.dtype is not None:
        pipe = arm_pipeline(arm, ModelSpec("embedded-tiny", tiny_model), GEN)
    verifier = _verifier() if arm.search else None
    first = run_arm(pipe, PROMPTS[0], 11, arm, GEN, 64, count=True, verifier=verifier, table_key="k")
    assert first.measured is not None and first.measured.exact
    assert first.compute["method"] == "counted"
    save_table(tmp_path, first.measured)
    table = load_table(tmp_path, "k")
    assert table == first.measured
    for i, prompt in enumerate(PROMPTS):
        derived = run_arm(pipe, prompt, 20 + i, arm, GEN, 64, count=True, verifier=verifier, table=table, full=False)
        counted = run_arm(pipe, prompt, 20 + i, arm, GEN, 64, count=True, verifier=verifier, table=table)
        assert derived.compute["method"] == "derived" and counted.compute["method"] == "counted"
        assert np.array_equal(derived.frames, counted.frames)
        for key in ("transformer_flops", "total_flops", "work_flops", "verifier_flops", "blocks_computed",
                    "blocks_skipped", "attention_computed", "attention_skipped", "transformer_calls"):
            assert derived.compute[key] == counted.compute[key], key
        assert counted.compute["cross_check"]["equal"] is True
        assert counted.compute["cross_check"]["derived_transformer_flops"] == counted.compute["transformer_flops"]
    if arm.name == "pab":
        assert derived.compute["attention_skipped"] > 0
    if arm.name == "few":
        assert derived.compute["transformer_calls"] == 2  # 1 step x CFG


def test_a_table_missing_a_unit_is_never_guessed_from(pipe, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A table measured on a run that skipped nothing has no figure for a skipped block:
    a run that skips one is counted in full instead of derived."""
    first = run_arm(pipe, PROMPTS[0], 11, FB0, GEN, 64, count=True, table_key="k0")
    table = first.measured
    assert not any(u.endswith("s") and u.startswith("b") for u in table.per_call)
    r = run_arm(pipe, PROMPTS[0], 11, FB, GEN, 64, count=True, table=table, full=False)
    assert r.compute["blocks_skipped"] > 0 and r.compute["method"] == "counted"
    assert r.compute["cross_check"] == {"derived_transformer_flops": None, "equal": False}


def test_an_inexact_or_foreign_table_is_not_loaded_as_exact(tmp_path: Path) -> None:
    from pairflow.generation.compute import FlopTable, load_table, save_table

    save_table(tmp_path, FlopTable("a", {"outer": 5}, 1, 0, False))
    assert load_table(tmp_path, "a") is not None and not load_table(tmp_path, "a").exact  # type: ignore[union-attr]
    (tmp_path / "b.json").write_text("{not json")
    assert load_table(tmp_path, "b") is None
    assert load_table(tmp_path, "missing") is None


@pytest.mark.parametrize("name, model, tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0), ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H200", "H200 SXM", 989.0), ("NVIDIA GH200 480GB", "GH200", 989.0), ("NVIDIA B200", "B200", 2250.0),
    ("NVIDIA GB200", "GB200 (per GPU)", 2500.0), ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA L40S", "L40S", 362.0),
    # a MIG slice is not its whole GPU: no peak, so no estimated MFU (audit r6 item 8)
    ("NVIDIA H200 MIG 1g.18gb", None, None), ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None, None)])
def test_the_peak_table_names_each_gpu_by_its_most_specific_entry(name: str, model: str | None,
                                                                  tflops: float | None) -> None:
    from pairflow.generation.compute import bf16_peak, estimated_mfu

    if model is None or tflops is None:
        assert bf16_peak(name) is None and estimated_mfu(1e15, 1.0, name) is None
        return
    assert bf16_peak(name) == (model, tflops * 1e12)
    mfu = estimated_mfu(tflops * 1e12 * 0.25, 2.0, name)  # a quarter of a second's peak work over 2 s
    assert mfu is not None and mfu["mfu"] == pytest.approx(0.125) and mfu["convention"].startswith("estimated")


def test_an_unknown_gpu_gets_no_mfu_rather_than_a_wrong_one() -> None:
    from pairflow.generation.compute import estimated_mfu

    assert estimated_mfu(1e12, 1.0, "NVIDIA GeForce RTX 3090") is None
    assert estimated_mfu(1e12, 0.0, "NVIDIA H100") is None


def toy_transformer(*blocks):  # type: ignore[no-untyped-def]
    """A transformer of ``blocks`` (a ``blocks`` ModuleList, run in order), for the
    counting tests that need an attention module of a given behaviour."""
    import torch

    class Toy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(blocks)

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                hidden_states = b(hidden_states)
            return hidden_states

    return Toy()


def toy_block(attn, ff: bool = False):  # type: ignore[no-untyped-def]
    """A block holding the attention module ``attn`` (and a feed-forward Linear after it)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = attn
            self.ff = torch.nn.Linear(4, 4) if ff else torch.nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ff(self.attn(x))

    return Block()


def test_a_signal_a_full_count_contradicts_makes_the_table_inexact() -> None:
    """Derived counting reads cheap signals (an unwrapped attention module computes; a
    block computed when its attention was called). An attention class whose own forward
    sometimes returns without running anything contradicts the first: the full count's
    child hooks see it, and the table it measures is never used to derive from."""
    import torch

    from pairflow.generation.compute import counting, measure

    class SkippyAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.to_q = torch.nn.Linear(4, 4)
            self.calls, self.skips = 0, True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.skips and self.calls % 2 == 0:
                return x  # every other call runs nothing
            q = self.to_q(x)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    toy = toy_transformer(toy_block(SkippyAttention(), ff=True), toy_block(SkippyAttention(), ff=True))
    x = torch.ones(1, 1, 2, 4)  # (batch, heads, tokens, features)
    with counting(toy) as count:
        toy(x)
        toy(x)
    assert count.attention_computed == 4 and count.blocks_computed == 4  # the cheap signals' reading
    assert count._mismatch == {"a0c", "a1c"}  # ... which the child hooks contradicted
    assert not measure(count, "k", {0}, {0}).exact
    for b in toy.blocks:
        b.attn.skips = False  # an attention class that always computes: nothing contradicted
    with counting(toy) as honest:
        toy(x)
        toy(x)
    assert honest.attention_computed == 4 and honest._mismatch == set()
    assert measure(honest, "k", {0}, {0}).exact


def test_a_fused_attention_kernel_on_cpu_counts_what_the_math_kernel_counts() -> None:
    """torch's counter has no formula for the CPU flash kernel; without ours an attention
    core on CPU counted 0 FLOPs while the CUDA kernels and the math backend count it."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from pairflow.generation.compute import counting

    class Attention(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return sdpa(q, q, q)

    q, toy = torch.randn(1, 2, 16, 8), toy_transformer(Attention())
    figures = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel(backend), counting(toy) as count:
            toy(q)
        figures[backend] = count.total_flops
    assert figures[SDPBackend.FLASH_ATTENTION] == figures[SDPBackend.MATH] == 2 * (2 * 16 * 8 * 16) * 2


def test_attention_no_counted_kernel_computes_is_named_and_its_table_never_used() -> None:
    """An attention kernel outside aten (flash-attn, SageAttention) is invisible to
    FlopCounterMode: a full count names each computed attention call in which no
    attention-core kernel was counted, and the table it measures is inexact."""
    import torch

    from pairflow.generation.compute import counting, measure

    class OpaqueAttention(torch.nn.Module):  # stands for a kernel FlopCounterMode cannot see
        def __init__(self) -> None:
            super().__init__()
            self.to_q = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.to_q(x) * 2

    toy = toy_transformer(toy_block(OpaqueAttention()))
    with counting(toy) as count:
        toy(torch.ones(2, 4))
        toy(torch.ones(2, 4))
    assert count.uncounted_attention == 2 and count.asdict()["uncounted_attention"] == 2
    assert not measure(count, "k", {0}, {0}).exact


def test_tables_merge_only_when_exact_and_agreeing_and_an_inexact_verdict_stands(tmp_path: Path) -> None:
    """A run whose table lacked a unit adds it (stages.generation.counted_run); another
    worker's exact table never overwrites one a cross-check found wrong."""
    from pairflow.generation.compute import FlopTable, load_table, merged, save_table

    a = FlopTable("k", {"outer": 5, "b0c": 7}, 1, 0, True)
    more = FlopTable("k", {"outer": 5, "b0s": 0}, 1, 0, True)
    assert merged(a, more) == FlopTable("k", {"outer": 5, "b0c": 7, "b0s": 0}, 1, 0, True)
    assert merged(a, FlopTable("k", {"outer": 6, "b0s": 0}, 1, 0, True)) is None  # disagree on a shared unit
    assert merged(a, FlopTable("k", {"b0s": 0}, 2, 0, True)) is None  # other pipeline FLOPs
    assert merged(a, FlopTable("k", {"b0s": 0}, 1, 0, False)) is None
    save_table(tmp_path, FlopTable("k", a.per_call, 1, 0, False))
    save_table(tmp_path, a)
    assert load_table(tmp_path, "k").exact is False  # type: ignore[union-attr]
    save_table(tmp_path, FlopTable("j", a.per_call, 1, 0, True))
    assert load_table(tmp_path, "j").exact is True  # type: ignore[union-attr]

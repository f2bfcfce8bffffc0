"""Iso-compute controls (``analysis.isocompute``): which arms get one, the equal-compute
step count from counted FLOPs (checked against real counts of the tiny model), and the
arm read against the plain arm by the study's paired procedure."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import generation_record, metric_spec, score_record, timing_record

from pairflow.analysis import isocompute as iso
from pairflow.errors import PairingError
from pairflow.generation.armrun import run_arm
from pairflow.generation.generate import load_pipeline
from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec, SearchSpec, StatsSpec


def test_which_arms_get_an_iso_compute_control() -> None:
    assert iso.eligible(ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 0.1})) is None
    assert iso.eligible(ArmSpec("sparse", attention_backend="_native_math")) is None
    assert iso.eligible(ArmSpec("noguide", guidance=1.0)) is None
    assert iso.eligible(ArmSpec("fb-few", "FirstBlockCacheConfig", {"threshold": 0.1}, steps=4)) is None
    assert iso.eligible(ArmSpec("control")) == "the control arm"
    assert iso.eligible(ArmSpec("few", steps=2)) == "a plain step count: a point of the steps curve itself"
    assert iso.eligible(ArmSpec("best2", search=SearchSpec(2, "temporal_flickering"))) == (
        "no acceleration declared (a cache, an attention backend or a generation override)")
    why = iso.eligible(ArmSpec("bf16-fb", "FirstBlockCacheConfig", {"threshold": 0.1}, dtype="bfloat16"))
    assert why == "declares dtype, not an acceleration of the same model"


def test_the_matched_step_count_is_the_linear_cost_model_solved() -> None:
    """Control at 6 steps: 600 transformer FLOPs (100 a step) and 50 outside the loop."""
    def d(arm_flops: float) -> iso.Derivation:
        return iso.derive("a", 6, 650.0, 600.0, arm_flops)

    assert d(350.0).steps == (3,) and d(350.0).matched_steps == 3.0  # exactly 3 steps' cost
    assert d(350.0 * (1 + 1e-12)).steps == (3,)  # rounding, not a fourth of a step
    got = d(290.0)
    assert (got.step_flops, got.rest_flops, got.matched_steps, got.steps) == (100.0, 50.0, 2.4, (2, 3))
    assert d(100.0).steps == (1,)  # below one step: only the dearer neighbour
    assert d(640.0).steps == (5,)  # 5.9: the dearer neighbour, 6 steps, is control itself
    for flops in (650.0, 700.0):
        none = d(flops)
        assert none.steps == () and none.why_none is not None and "not cheaper than control" in none.why_none
    assert d(290.0).asdict()["steps"] == [2, 3]
    for bad in ((0, 650.0, 600.0, 1.0), (6, 650.0, 0.0, 1.0), (6, 500.0, 600.0, 1.0), (6, 650.0, 600.0, 0.0)):
        with pytest.raises(ValueError, match="not a counted run's figure"):
            iso.derive("a", *bad)


def test_the_derivation_matches_real_counted_flops_of_plain_arms(tiny_model: Path) -> None:
    """The linear model against FlopCounterMode on the tiny model (classifier-free
    guidance on: two transformer calls a step): from the control's count at 6 steps, a
    plain arm's counted FLOPs at 2, 3 and 5 steps derive exactly 2, 3 and 5; a cache
    arm's count falls between two of them."""
    gen = GenerationSpec(frames=5, height=32, width=32, steps=6, guidance=5.0, fps=8, dtype="float32", threads=1)
    pipe = load_pipeline(ModelSpec("embedded-tiny", tiny_model), "float32", 1)

    def counted(arm: ArmSpec) -> dict:
        compute = run_arm(pipe, "a red fox in snow", 11, arm, gen, 64, count=True).compute
        assert compute is not None
        return compute

    control = counted(ArmSpec("control"))
    for k in (2, 3, 5):
        plain = counted(iso.iso_arm(k))
        got = iso.derive("plain", 6, control["total_flops"], control["transformer_flops"], plain["total_flops"])
        assert got.steps == (k,), got
    fb = counted(ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 1.2}))
    got = iso.derive("fb", 6, control["total_flops"], control["transformer_flops"], fb["total_flops"])
    assert 1 <= len(got.steps) <= 2 and 0 < got.matched_steps < 6
    assert got.steps[0] <= got.matched_steps <= got.steps[-1]


NR = metric_spec("q")
FR = metric_spec("psnr", "FR")


def _records(prompts: int = 10) -> tuple[list[dict], list[dict], list[dict]]:
    """Control, an arm "fb" and the plain arm "iso-steps-3": fb's q is 0.1 above the
    plain arm's on every prompt (noise 0.01), its fidelity 4 dB above."""
    rng = random.Random(3)
    gen, scores, timings = [], [], []
    for p in range(prompts):
        base = rng.gauss(0.5, 0.2)
        control: dict = {}
        for arm, q, psnr, lat in (("control", base, None, 2.0), ("iso-steps-3", base - 0.05, 28.0, 1.0),
                                  ("fb", base + 0.05, 32.0, 1.2)):
            g = generation_record("p", f"p{p:02d}", 0, arm, 1000 * p, f"v{p}{arm}")
            control = control or g
            gen.append(g)
            timings.append(timing_record(g, lat))
            sc = {"q": (q + rng.gauss(0, 0.01), NR)}
            if psnr is not None:
                sc["psnr"] = (psnr + rng.gauss(0, 0.3), FR)
            scores.append(score_record(g, control, sc))
    return gen, scores, timings


def test_the_arm_is_read_against_the_plain_arm_pair_by_pair() -> None:
    gen, scores, timings = _records()
    s = StatsSpec(2000, 0.95, 0, margins={"q": 0.02}, floors={"psnr": 30.0})
    c = iso.against(gen, scores, timings, "fb", "iso-steps-3", s)
    assert c["reference"] == "iso-steps-3" and c["treatment"] == "fb" and c["n_pairs"] == 10
    m = {x["metric"]: x for x in c["metrics"]}
    assert m["q"]["diff"] == pytest.approx(0.1, abs=0.01) and m["q"]["verdict_code"] == "superior"
    assert m["q"]["margin"] == 0.02
    # fidelity: a difference of fidelities to control (32 - 28 dB), no floor between two arms
    assert m["psnr"]["kind"] == "NR" and m["psnr"]["floor"] is None
    assert m["psnr"]["diff"] == pytest.approx(4.0, abs=0.3) and m["psnr"]["verdict_code"] == "superior"
    assert c["speedup"]["geomean"] == pytest.approx(1.0 / 1.2, rel=0.02)  # the plain arm is faster here
    # the other way round: the plain arm is worse than fb
    back = iso.against(gen, scores, timings, "iso-steps-3", "fb", s)
    assert {x["metric"]: x["verdict_code"] for x in back["metrics"]} == {"q": "inferior", "psnr": "inferior"}


def test_a_pair_without_its_plain_partner_is_refused_as_any_pair_is() -> None:
    gen, scores, timings = _records()
    gen = [g for g in gen if not (g["arm"]["name"] == "iso-steps-3" and g["candidate"]["prompt_id"] == "p03")]
    with pytest.raises(PairingError, match="lack a partner"):
        iso.against(gen, scores, timings, "fb", "iso-steps-3", StatsSpec(2000, 0.95, 0))

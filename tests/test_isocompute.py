"""Iso-compute controls (``analysis.isocompute``): which arms get one, the equal-compute
step count from counted FLOPs (checked against real counts of the tiny model), and the
arm read against the plain arm by the study's paired procedure."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import generation_record, metric_spec, score_record, timing_record

from pairflow.analysis import isocompute as iso
from pairflow.errors import PairingError, StatsError
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
        with pytest.raises(StatsError, match="not a counted run's figure"):
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
    assert c["treatment"] == "fb" and c["n_pairs"] == 10
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


def test_config_refuses_iso_compute_without_calibration_and_a_taken_name(tmp_path: Path, tiny_model: Path) -> None:
    from conftest import small_config

    from pairflow.errors import ConfigError
    from pairflow.plan.config import study_from_raw

    cfg = small_config(tmp_path, tiny_model, iso_compute={"enabled": True})
    with pytest.raises(ConfigError, match="iso_compute/enabled is true but fleet/calibrate is false"):
        study_from_raw(cfg, tmp_path)
    cfg["fleet"]["calibrate"] = True
    cfg["arms"]["iso-steps-2"] = {"steps": 2}
    with pytest.raises(ConfigError, match=r"arm name\(s\) \['iso-steps-2'\] .* start with 'iso-steps-'"):
        study_from_raw(cfg, tmp_path)


def test_the_derived_plain_arms_join_the_study_outside_its_keys(tmp_path: Path, tiny_model: Path) -> None:
    """Once rule calibrate wrote the derivation, its plain arms are arms of the study (with
    the arms they control), but not treatments of the declared family, nor in the keys of
    the arms' check and the calibration table; a control of an arm no longer declared is
    dropped; an unreadable file is refused by name."""
    import json

    from conftest import small_config

    from pairflow.budget.calibrate import key_fields
    from pairflow.errors import ConfigError
    from pairflow.layout import Layout
    from pairflow.plan.config import study_from_raw

    cfg = small_config(tmp_path, tiny_model, iso_compute={"enabled": True}, fleet={"calibrate": True})
    before = study_from_raw(cfg, tmp_path)
    path = Layout(before.scratch).iso_compute
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"arms": [{"name": "iso-steps-2", "steps": 2, "for": ["pab"]},
                                         {"name": "iso-steps-1", "steps": 1, "for": ["gone"]}]}))
    after = study_from_raw(cfg, tmp_path)
    assert [a.name for a in after.arms] == ["control", "pab", "iso-steps-2"]
    assert after.arms[-1] == ArmSpec("iso-steps-2", steps=2, derived_for=("pab",))
    assert [a.name for a in after.treatments] == ["pab"] and after.declared_arms == before.arms
    assert key_fields(after) == key_fields(before)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="iso_compute.json cannot be read"):
        study_from_raw(cfg, tmp_path)


def test_controls_derive_each_eligible_arm_and_share_plain_arms() -> None:
    counted = {"control": {"compute": {"total_flops": 650.0, "transformer_flops": 600.0}},
               "a": {"compute": {"total_flops": 290.0, "transformer_flops": 240.0}},
               "b": {"compute": {"total_flops": 350.0, "transformer_flops": 300.0}},
               "few": {"compute": {"total_flops": 250.0, "transformer_flops": 200.0}},
               "uncounted": {"compute": {"total_flops": None, "transformer_flops": None}}}
    arms = [ArmSpec("control"), ArmSpec("a", "FirstBlockCacheConfig", {"threshold": 0.1}),
            ArmSpec("b", attention_backend="sage"), ArmSpec("few", steps=2),
            ArmSpec("uncounted", "FirstBlockCacheConfig", {"threshold": 0.2})]
    got = iso.controls(arms, counted, 6)
    assert [d["arm"] for d in got["derivations"]] == ["a", "b"]
    assert got["arms"] == [{"name": "iso-steps-2", "steps": 2, "for": ["a"]},
                           {"name": "iso-steps-3", "steps": 3, "for": ["a", "b"]}]
    assert set(got["skipped"]) == {"few", "uncounted"} and "not counted" in got["skipped"]["uncounted"]


@pytest.mark.slow
def test_a_study_with_iso_compute_reads_each_arm_against_plain_steps(tmp_path: Path, tiny_model: Path) -> None:
    """Real Snakemake on a study of control and a first-block cache, iso-compute on: rule
    calibrate derives the plain step counts from counted FLOPs, the plain arms are
    generated, scored and timed from the same seeds, the study table opens with the
    verdicts against them, the plot draws the steps curve, verify passes and a second
    run has nothing to do."""
    import json

    from conftest import copy_project, run_snakemake, small_config, write_config

    from pairflow.layout import Layout

    project = copy_project(tmp_path / "proj")
    cfg = small_config(project, tiny_model, iso_compute={"enabled": True}, fleet={"cpu_workers": 1, "calibrate": True},
                       timing={"repeats": 1}, stats={"resamples": 200, "margins": {"temporal_flickering": 0.01}},
                       scorers=["temporal_flickering", "psnr"])
    cfg["arms"] = {"control": {"cache": None}, "fb": {"cache": {"class": "FirstBlockCacheConfig",
                                                                "params": {"threshold": 1.2}}}}
    write_config(project, cfg)
    run_snakemake(project)
    layout = Layout(Path(cfg["storage"]["scratch"]))
    derivation = json.loads(layout.iso_compute.read_text())
    (d,) = derivation["derivations"]
    assert d["arm"] == "fb" and 0 < d["matched_steps"] < 3 and d["steps"]
    plains = [a["name"] for a in derivation["arms"]]
    for name in plains:
        assert sorted(p.name for p in (layout.panel("t") / "records" / name).glob("*.json")) == ["a1-s0.json",
                                                                                              "a2-s0.json"]
    stats = json.loads(layout.study_stats.read_text())
    assert [c["treatment"] for c in stats["comparisons"]] == ["fb"]  # the declared family only
    rows = stats["iso_compute"]["comparisons"]
    assert [r["reference"] for r in rows] == plains and all(r["comparison"]["n_pairs"] == 2 for r in rows)
    assert [c["treatment"] for c in stats["iso_compute"]["curve"]] == plains
    table = layout.study_table().read_text().splitlines()
    assert table[2].startswith("**fb ") and "plain steps" in table[2]
    assert "## Against equal-compute steps" in table
    assert (layout.plots / "pareto.png").is_file()
    card = json.loads((layout.study / "card-results.json").read_text())
    assert [r["against"] for r in card["arms"][0]["against_iso_compute_control"]] == plains
    from pairflow.cli import main

    assert main(["verify", str(layout.scratch)]) == 0
    assert "Nothing to be done" in run_snakemake(project, "-n")
    # The derivation removed while the table is current: the next run writes it again from the
    # table (no rule would), the plain arms stay in the plan, and nothing is recomputed.
    before = layout.iso_compute.read_bytes()
    layout.iso_compute.unlink()
    assert "Nothing to be done" in run_snakemake(project)
    assert layout.iso_compute.read_bytes() == before

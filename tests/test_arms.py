"""Arms beyond caches: config typing, identity, checks before any model loads, search."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_ARMS, copy_project, copy_study, small_config, study_config, write_config

from pairflow.arms import (
    BUILD_RULE,
    arms_check_inputs,
    arms_check_key,
    check_arms,
    check_models,
    search_seeds,
    write_arms_check,
)
from pairflow.arms.check import model_problem
from pairflow.arms.registry import arm_digest, declared_keys, declared_kinds
from pairflow.errors import ConfigError
from pairflow.generation.armrun import arm_pipeline, run_arm
from pairflow.identity import digest_obj
from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec, SearchSpec, study_from_raw

GEN = GenerationSpec(frames=5, height=32, width=32, steps=3, guidance=5.0, fps=8, dtype="float32", threads=1)
CONTROL = ArmSpec("control")

ARMS = {"control": {"cache": None},
        "fb": {"cache": {"class": "FirstBlockCacheConfig", "params": {"threshold": 0.2}}},
        "few": {"steps": 2, "guidance": 1.0, "scheduler": {"class": "FlowMatchEulerDiscreteScheduler",
                                                           "params": {"shift": 3.0}}},
        "best2": {"search": {"n": 2, "verifier": "temporal_flickering"}},
        "bf16": {"dtype": "bfloat16", "attention_backend": "native"}}


def test_every_kind_is_typed_from_the_config(tmp_path: Path, tiny_model: Path) -> None:
    study = study_from_raw(small_config(tmp_path, tiny_model, arms=ARMS), tmp_path)
    arms = {a.name: a for a in study.arms}
    assert declared_kinds(arms["control"]) == ()
    assert declared_kinds(arms["fb"]) == ("cache",)
    assert declared_kinds(arms["few"]) == ("overrides",) and arms["few"].steps == 2 and arms["few"].guidance == 1.0
    assert arms["few"].scheduler_class == "FlowMatchEulerDiscreteScheduler"
    assert arms["best2"].search == SearchSpec(2, "temporal_flickering")
    assert declared_kinds(arms["bf16"]) == ("dtype", "attention_backend")
    check_arms(study.arms, study.model)  # all valid before any model loads


def test_a_cache_only_arm_keeps_its_identity_and_every_field_changes_it() -> None:
    fb = ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 0.2})
    # the identity cache-only arms had before arms grew other kinds: their evidence stays valid
    assert arm_digest(fb) == digest_obj({"cache_class": "FirstBlockCacheConfig", "cache_params": {"threshold": 0.2}})
    variants = [ArmSpec("x", steps=2), ArmSpec("x", steps=3), ArmSpec("x", guidance=1.0),
                ArmSpec("x", scheduler_class="FlowMatchEulerDiscreteScheduler"),
                ArmSpec("x", scheduler_class="FlowMatchEulerDiscreteScheduler", scheduler_params={"shift": 2.0}),
                ArmSpec("x", model=ModelSpec("local", Path("/m/student"))), ArmSpec("x", dtype="bfloat16"),
                ArmSpec("x", attention_backend="native"), ArmSpec("x", search=SearchSpec(2, "temporal_flickering")),
                ArmSpec("x", search=SearchSpec(3, "temporal_flickering")),
                ArmSpec("x", search=SearchSpec(2, "dynamic_degree")), fb]
    assert len({arm_digest(v) for v in variants}) == len(variants)


@pytest.mark.parametrize("arms, words", [
    ({"control": {"steps": 2, "guidance": 1.0}, "t": {"steps": 1}},
     ["arm 'control' sets 'arms/control/steps', 'arms/control/guidance'", "changes nothing"]),
    ({"control": {"scheduler": {"class": "FlowMatchEulerDiscreteScheduler"}}, "t": {"steps": 1}},
     ["arm 'control' sets 'arms/control/scheduler'"]),
    ({"control": {"cache": None}, "t": {}}, ["arm 't' declares no change"]),
    ({"control": {"cache": None}, "t": {"stpes": 2}}, ["stpes", "did you mean 'steps'"]),
    ({"control": {"cache": None}, "t": {"search": {"n": 0, "verifier": "psnr"}}}, ["arms/t/search/n"]),
])
def test_bad_arms_are_refused_by_the_config(tmp_path: Path, tiny_model: Path, arms: dict, words: list) -> None:
    with pytest.raises(ConfigError) as e:
        study_from_raw(small_config(tmp_path, tiny_model, arms=arms), tmp_path)
    for w in words:
        assert w in str(e.value)
    assert "overrides" not in str(e.value)  # the user wrote steps, guidance or scheduler


def test_an_arm_names_its_keys_as_the_user_wrote_them() -> None:
    """``keys`` (what messages say) are the config's key names; ``kinds`` (what records
    carry) group steps, guidance and scheduler as overrides."""
    few = ArmSpec("few", steps=2, scheduler_class="FlowMatchEulerDiscreteScheduler")
    assert declared_keys(few) == ("steps", "scheduler") and declared_kinds(few) == ("overrides",)
    assert declared_keys(ArmSpec("g", guidance=1.0)) == ("guidance",)
    assert declared_keys(ArmSpec("x", "FirstBlockCacheConfig", dtype="bfloat16", search=SearchSpec(2, "temporal_flickering"),
                                 model=ModelSpec("local", Path("/m")))) == ("cache", "model", "dtype", "search")


@pytest.mark.parametrize("arm, words", [
    (ArmSpec("s", scheduler_class="FlowMatchEulerScheduler"), ["arms/s/scheduler/class", "FlowMatchEulerDiscreteScheduler"]),
    (ArmSpec("s", scheduler_class="FlowMatchEulerDiscreteScheduler", scheduler_params={"shfit": 2}),
     ["arms/s/scheduler/params/shfit", "did you mean 'shift'"]),
    (ArmSpec("b", attention_backend="flash"), ["arms/b/attention_backend", "'flash'", "Usable here", "native"]),
    (ArmSpec("b", attention_backend="flex"), ["arms/b/attention_backend", "'flex'", "FLOP counter", "native"]),
    (ArmSpec("v", search=SearchSpec(2, "psnr")), ["arms/v/search/verifier", "NR metric"]),
])
def test_arm_kinds_are_checked_before_any_model_loads(tiny_model: Path, arm: ArmSpec, words: list) -> None:
    with pytest.raises(ConfigError) as e:
        check_arms((CONTROL, arm), ModelSpec("embedded-tiny", tiny_model))
    for w in words:
        assert w in str(e.value)


def test_a_family_cache_combination_diffusers_refuses_names_the_caches_that_apply(tmp_path: Path) -> None:
    """diffusers registers no FirstBlockCache block for LTX-2's transformer: refused at
    config time (enabled on the transformer built on the meta device), with the list."""
    model = tmp_path / "ltx2"
    (model / "transformer").mkdir(parents=True)
    (model / "transformer" / "config.json").write_text(json.dumps({"_class_name": "LTX2VideoTransformer3DModel"}))
    spec = ModelSpec("local", model)
    with pytest.raises(ConfigError) as e:
        check_arms((CONTROL, ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 0.1})), spec)
    msg = str(e.value)
    assert "arms/fb/cache/class" in msg and "LTX2VideoTransformer3DModel" in msg
    assert "Caches that apply to LTX2VideoTransformer3DModel" in msg and "PyramidAttentionBroadcastConfig" in msg
    check_arms((CONTROL, ArmSpec("pab", "PyramidAttentionBroadcastConfig",
                                 {"spatial_attention_block_skip_range": 2})), spec)


def student(teacher: Path, dest: Path, vae: dict | None = None, transformer: dict | None = None) -> Path:
    """A student of a tiny model (Wan or CogVideoX): the teacher's files with the VAE
    and/or the transformer rebuilt by their real diffusers classes from the tiny configs
    with ``vae`` / ``transformer`` changed (random weights, seeded)."""
    import diffusers
    import torch

    from pairflow.generation import tinymodel as t

    configs = {"AutoencoderKLWan": t._VAE, "WanTransformer3DModel": t._TRANSFORMER,
               "AutoencoderKLCogVideoX": t._COGVIDEOX_VAE, "CogVideoXTransformer3DModel": t._COGVIDEOX}
    shutil.copytree(teacher, dest)
    torch.manual_seed(0)
    for part, change in (("vae", vae), ("transformer", transformer)):
        if change is not None:
            name = json.loads((dest / part / "config.json").read_text())["_class_name"]
            shutil.rmtree(dest / part)
            getattr(diffusers, name)(**{**configs[name], **change}).save_pretrained(dest / part)
    return dest


@pytest.mark.parametrize("family, vae, transformer", [
    ("wan", {"base_dim": 6, "dim_mult": [1, 2, 2, 2]}, {"ffn_dim": 48}),
    ("cogvideox", {"block_out_channels": (16, 16, 16, 16)}, None),  # refused before: widths were compared
])
def test_a_student_that_differs_only_in_widths_is_accepted_and_starts_from_the_pairs_noise(
        tiny_model: Path, tmp_path: Path, family: str, vae: dict, transformer: dict | None) -> None:
    """Block widths decide no latent: a student whose VAE (and transformer) differ only
    in channel widths passes the check, loads, and draws the control's latent shape from
    the pair's seed."""
    from pairflow.arms import latent_signature
    from pairflow.generation.tinymodel import build_tiny_model

    path = tiny_model if family == "wan" else build_tiny_model(tmp_path / family, family)
    narrow = student(path, tmp_path / "student", vae=vae, transformer=transformer)
    changed = json.loads((narrow / "vae" / "config.json").read_text())
    assert all(changed[k] == (list(v) if isinstance(v, tuple) else v) for k, v in vae.items())
    teacher = ModelSpec("local", path)
    arm = ArmSpec("student", model=ModelSpec("local", narrow))
    check_arms((CONTROL, arm), teacher)
    assert latent_signature(arm.model) == latent_signature(teacher)
    gen = GEN if family == "wan" else dataclasses.replace(GEN, frames=9)  # CogVideoX decodes 4k+1 frames from 9
    base = run_arm(arm_pipeline(CONTROL, teacher, gen), "a red fox", 5, CONTROL, gen, 16, count=True)
    other = run_arm(arm_pipeline(arm, teacher, gen), "a red fox", 5, arm, gen, 16, count=True)
    assert other.compute["latent_shape"] == base.compute["latent_shape"]
    assert other.frames.shape == base.frames.shape


@pytest.mark.parametrize("vae, transformer, words", [
    ({"z_dim": 8}, None, ["VAE latent channels 8 (the study's model: 16)"]),
    ({"temperal_downsample": [False, False, True], "scale_factor_temporal": 2}, None,
     ["VAE temporal compression 2 (the study's model: 4)"]),
    ({"dim_mult": [1, 1, 1, 1, 1], "temperal_downsample": [False, True, True, False], "scale_factor_spatial": 16},
     None, ["VAE spatial compression 16 (the study's model: 8)"]),
    (None, {"in_channels": 8, "out_channels": 8}, ["transformer input channels 8 (the study's model: 16)"]),
])
def test_a_student_with_other_latents_is_refused_naming_what_differs(tiny_model: Path, tmp_path: Path, vae: dict,
                                                                     transformer: dict, words: list) -> None:
    other = student(tiny_model, tmp_path / "student", vae=vae, transformer=transformer)
    with pytest.raises(ConfigError) as e:
        check_arms((CONTROL, ArmSpec("student", model=ModelSpec("local", other))), ModelSpec("embedded-tiny",
                                                                                             tiny_model))
    msg = str(e.value)
    for w in [*words, "arms/student/model/path", "makes other latents", "share its initial noise"]:
        assert w in msg, msg
    assert "base_dim" not in msg and "block_out_channels" not in msg


def test_a_student_of_another_family_or_not_on_disk_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    from pairflow.generation.tinymodel import build_tiny_model

    cog = build_tiny_model(tmp_path / "cog", "cogvideox")
    with pytest.raises(ConfigError, match=r"pipeline class CogVideoXPipeline \(the study's model: WanPipeline\)"):
        check_arms((CONTROL, ArmSpec("student", model=ModelSpec("local", cog))), ModelSpec("embedded-tiny",
                                                                                           tiny_model))
    with pytest.raises(ConfigError, match="no model_index.json"):
        check_arms((CONTROL, ArmSpec("student", model=ModelSpec("local", tmp_path / "none"))),
                   ModelSpec("embedded-tiny", tiny_model))


@pytest.mark.parametrize("family", ["wan", "cogvideox", "ltx", "hunyuanvideo"])
def test_the_latent_signature_reads_compression_as_each_pipeline_does(tmp_path: Path, family: str) -> None:
    """For every family the tiny builder makes, the signature's compression and channels
    equal what the loaded diffusers pipeline uses to shape its noise."""
    from diffusers import DiffusionPipeline

    from pairflow.arms import latent_signature
    from pairflow.generation.tinymodel import build_tiny_model

    path = build_tiny_model(tmp_path / family, family)
    sig = latent_signature(ModelSpec("local", path))
    pipe = DiffusionPipeline.from_pretrained(path)
    spatial = getattr(pipe, "vae_scale_factor_spatial", None) or pipe.vae_spatial_compression_ratio
    temporal = getattr(pipe, "vae_scale_factor_temporal", None) or pipe.vae_temporal_compression_ratio
    assert sig is not None and sig["pipeline class"] == type(pipe).__name__
    assert (sig["VAE spatial compression"], sig["VAE temporal compression"]) == (spatial, temporal)
    assert sig["transformer input channels"] == pipe.transformer.config.in_channels


def test_the_arms_check_writes_its_marker_only_when_every_arm_passes(tiny_model: Path, tmp_path: Path) -> None:
    model = ModelSpec("embedded-tiny", tiny_model)
    good = (CONTROL, ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 0.2}))
    out = tmp_path / "checks" / "arms.json"
    write_arms_check(good, model, out)
    marker = json.loads(out.read_text())
    assert marker["passed"] is True and marker["arms"] == ["control", "fb"]
    assert marker["key"] == arms_check_key(good, model)
    bad = (CONTROL, ArmSpec("fb", "FirstBlockCachConfig", {"threshold": 0.2}))
    out.unlink()
    with pytest.raises(ConfigError, match=r"arms/fb/cache/class.*did you mean 'FirstBlockCacheConfig'"):
        write_arms_check(bad, model, out)
    assert not out.exists()


def test_the_arms_check_key_follows_every_arm_field_and_its_inputs_the_model_files(tiny_model: Path,
                                                                                    tmp_path: Path) -> None:
    model = ModelSpec("embedded-tiny", tiny_model)
    fb = ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 0.2})
    key = arms_check_key((CONTROL, fb), model)
    assert key.startswith("xxh3_128:") and key == arms_check_key((CONTROL, fb), model)
    assert key != arms_check_key((CONTROL, ArmSpec("fb", "FirstBlockCacheConfig", {"threshold": 0.3})), model)
    assert key != arms_check_key((CONTROL, fb, ArmSpec("few", steps=2)), model)
    # The embedded model is built by a rule (the check waits for its output); a local
    # model's and a student's index, transformer and VAE configs are the check's inputs
    # (a student's VAE decides its latents).
    assert arms_check_inputs((CONTROL, fb), model) == []
    student = tmp_path / "student"
    shutil.copytree(tiny_model, student)
    local = ModelSpec("local", student)
    read = [student / "model_index.json", student / "transformer" / "config.json", student / "vae" / "config.json"]
    assert arms_check_inputs((CONTROL, ArmSpec("s", model=local)), model) == read
    assert arms_check_inputs((CONTROL,), local) == read


def _broken(kind: str, model: Path, tmp_path: Path) -> Path:
    """A model folder that no job could load, made ``kind``-wise from a copy of ``model``."""
    folder = tmp_path / kind
    if kind == "a file":
        folder.write_text("not a folder\n")
    elif kind != "missing":
        shutil.copytree(model, folder)
        index = folder / "model_index.json"
        if kind == "no index":  # a copy that did not finish, or not a diffusers folder
            index.unlink()
        elif kind == "unreadable index":  # read_text fails (a folder: chmod means nothing to root)
            index.unlink()
            index.mkdir()
        elif kind == "index not JSON":
            index.write_text("{not json")
        elif kind == "component missing":
            shutil.rmtree(folder / "vae")
    return folder


BROKEN = {"missing": "which does not exist", "a file": "which is a file, not a folder",
          "no index": "which holds no model_index.json", "unreadable index": "whose model_index.json cannot be read",
          "index not JSON": "whose model_index.json is not JSON text",
          "component missing": "whose model_index.json names the component(s) ['vae'] but which has no folder for it"}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_model_no_job_could_load_is_refused_naming_the_key_the_folder_and_a_fix(tiny_model: Path, tmp_path: Path,
                                                                                 kind: str) -> None:
    """Issue 41: a model.path pointing at nothing passed check-config, the dry run and the
    arms' check ("passed ... against" it) and failed 13 s into rule calibrate. Each way a
    folder cannot load is refused, for the study's model and an arm's own, by key."""
    folder = _broken(kind, tiny_model, tmp_path)
    local = ModelSpec("local", folder)
    with pytest.raises(ConfigError) as e:
        check_models(local, (CONTROL,), "config/x.yaml")
    assert str(e.value).startswith(f"config/x.yaml: key 'model/path' names the local model {folder}, {BROKEN[kind]}")
    assert f"or build a tiny one there: pairflow build-tiny-model {shlex.quote(str(folder))}" in str(e.value)
    with pytest.raises(ConfigError, match=f"key 'arms/s/model/path' names the local model {folder}, "):
        check_models(ModelSpec("embedded-tiny", tiny_model), (CONTROL, ArmSpec("s", model=local)), "c")
    assert model_problem(ModelSpec("local", tiny_model)) is None


def test_a_model_a_rule_builds_may_be_missing_until_it_runs(tiny_model: Path, tmp_path: Path) -> None:
    """The default study's model is built by rule build_tiny_model: missing (or a folder
    without its index, which the rule replaces) it passes with a note naming the command
    that builds it; a built one that cannot load is refused with the command that rebuilds
    it. Any other folder a rule does not build is refused."""
    tiny = ModelSpec("embedded-tiny", tmp_path / "tiny-wan")
    built = frozenset([tiny.path])
    notes = check_models(tiny, (CONTROL,), "c", built=built, project=tmp_path)
    assert notes == [f"model {tiny.path} (model/path) is not built yet: a run builds it first (rule build_tiny_model), "
                     f"and checks every arm against it then; to build it now: {BUILD_RULE} (in {tmp_path})"]
    broken = ModelSpec("embedded-tiny", _broken("index not JSON", tiny_model, tmp_path))
    with pytest.raises(ConfigError, match=re.escape(f"rebuild it: pairflow build-tiny-model {shlex.quote(str(broken.path))} (replaces")):
        check_models(broken, (CONTROL,), "c", built=frozenset([broken.path]))
    with pytest.raises(ConfigError, match=f"build it: {BUILD_RULE} \\(in the project\\), or pairflow build-tiny"):
        check_models(tiny, (CONTROL,), "c")
    mirror = ModelSpec("hub-mirror", tmp_path, id="org/model", revision="abc123")
    with pytest.raises(ConfigError, match="holds no snapshot of org/model at revision abc123 .*snapshot_download"):
        check_models(mirror, (CONTROL,), "c")


def test_the_arms_check_never_passes_against_a_missing_model(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "checks" / "arms.json"
    with pytest.raises(ConfigError, match=f"key 'model/path' names the local model {tmp_path / 'none'}, which does"):
        write_arms_check((CONTROL, ArmSpec("few", steps=2)), ModelSpec("local", tmp_path / "none"), out)
    assert not out.exists() and "passed" not in caplog.text


def test_the_fix_a_refusal_names_builds_a_model_that_passes(tmp_path: Path) -> None:
    """The command a refused local model's message names, run as written, makes a folder
    every check accepts."""
    folder = tmp_path / "models" / "mine"
    with pytest.raises(ConfigError) as e:
        check_models(ModelSpec("local", folder), (CONTROL,), "c")
    command = str(e.value).split("build a tiny one there: ")[1].split(";")[0]
    assert shlex.split(command) == ["pairflow", "build-tiny-model", str(folder)]
    subprocess.run([str(Path(sys.executable).with_name("pairflow")), *shlex.split(command)[1:]], check=True,
                   capture_output=True, timeout=600)
    assert check_models(ModelSpec("local", folder), (CONTROL,), "c") == []


@pytest.mark.slow
def test_the_command_that_builds_the_embedded_model_builds_it(tiny_model: Path, tmp_path: Path) -> None:
    """Issue 41: the fix once named, 'snakemake resources/tiny-wan', fails with
    MissingRuleException (the rule's output is the model's index file). ``BUILD_RULE``,
    run as written in a project whose model is not built yet, builds it there."""
    project = copy_project(tmp_path / "project")
    cfg = small_config(project, tiny_model)
    cfg["model"]["path"] = "resources/tiny-wan"
    write_config(project, cfg)
    model = ModelSpec("embedded-tiny", project / "resources" / "tiny-wan")
    assert check_models(model, (CONTROL,), "c", built=frozenset([model.path])) != []  # a note: not built yet
    argv = BUILD_RULE.split()
    run = subprocess.run([str(Path(sys.executable).with_name(argv[0])), *argv[1:]], cwd=project, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert check_models(model, (CONTROL,), "c") == []  # built: nothing to note, nothing refused
    assert (model.path / "model_index.json").read_bytes() == (tiny_model / "model_index.json").read_bytes()


PLAN_PROBE = """import json, sys
from snakemake.cli import main
out, sys.argv = sys.argv[1], ["snakemake", *sys.argv[2:]]
try:
    main()
finally:
    open(out, "w").write(json.dumps(sorted(m for m in ("torch", "diffusers") if m in sys.modules)))
"""


@pytest.mark.slow
def test_planning_imports_no_torch_and_a_bad_arm_stops_the_run_before_any_model_loads(tiny_model: Path,
                                                                                       tmp_path: Path) -> None:
    """Snakemake plans without importing torch or diffusers (the arms' check is its own
    job, rule check_arms); run, that job refuses a misspelled cache class, naming the arm,
    the key and the fix, and no generation starts."""
    project = copy_project(tmp_path / "project")
    cfg = small_config(tmp_path, tiny_model)
    cfg["arms"]["fb"] = {"cache": {"class": "FirstBlockCachConfig", "params": {"threshold": 0.1}}}
    write_config(project, cfg)
    seen = tmp_path / "modules.json"
    plan = subprocess.run([sys.executable, "-c", PLAN_PROBE, str(seen), "-n", "--cores", "1"], cwd=project,
                          capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert json.loads(seen.read_text()) == []
    assert "check_arms" in plan.stdout and "generate_score_panel" in plan.stdout  # fleet.panel_jobs: combined
    gen = tmp_path / "results" / "scratch" / "panels" / "t" / "generation.json"
    run = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--cores", "1", str(gen)], cwd=project,
                         capture_output=True, text=True)
    assert run.returncode != 0
    log = (tmp_path / "results" / "scratch" / "logs" / "check_arms.log").read_text()
    assert "arms/fb/cache/class" in log and "did you mean 'FirstBlockCacheConfig'" in log
    assert not gen.exists() and not (tmp_path / "results" / "scratch" / "panels" / "t" / "records").exists()


def test_search_seeds_start_at_the_pairs_stream_and_are_derived_from_it() -> None:
    seeds = search_seeds(12345, 4)
    assert seeds[0] == 12345 and len(set(seeds)) == 4
    assert seeds == search_seeds(12345, 4) and search_seeds(12345, 2) == seeds[:2]
    assert search_seeds(12346, 4)[1:] != seeds[1:]
    assert all(0 <= s < 2 ** 63 for s in seeds)


def test_search_keeps_the_verifiers_best_and_every_candidates_evidence(tiny_model: Path) -> None:
    from pairflow.arms import Verifier
    from pairflow.generation.generate import generate, load_pipeline
    from pairflow.plan.config import EncoderSpec

    pipe = load_pipeline(ModelSpec("embedded-tiny", tiny_model), "float32", 1)
    enc = EncoderSpec(ffmpeg="", codec="libx264", crf=18, preset="medium", pix_fmt="yuv420p", gop=9, threads=1,
                      lossless=False, fail_on_flat=False)
    verifier = Verifier("temporal_flickering", True, enc, None, 16, 8)
    arm = ArmSpec("best3", search=SearchSpec(3, "temporal_flickering"))
    r = run_arm(pipe, "a red fox", 99, arm, GEN, 64, count=True, verifier=verifier)
    scores = [c["score"] for c in r.candidates]
    assert [c["seed"] for c in r.candidates] == search_seeds(99, 3)
    assert r.chosen == int(np.argmax(scores))
    best = generate(pipe, "a red fox", search_seeds(99, 3)[r.chosen], CONTROL, GEN, 64).frames
    assert np.array_equal(r.frames, best)
    assert len({c["raw_digest"] for c in r.candidates}) == 3
    assert r.compute["generations"] == 3 and r.seconds >= sum(c["generate_s"] for c in r.candidates)


def test_student_and_dtype_arms_run_on_their_own_pipeline_from_the_pairs_noise(tiny_model: Path,
                                                                               tmp_path: Path) -> None:
    """A student that is a byte copy of its teacher reproduces control bit for bit (same
    noise, same weights); a bfloat16 arm runs its own pipeline, starts from the same
    latent shape, and computes other pixels."""

    student = tmp_path / "student"
    shutil.copytree(tiny_model, student)
    teacher = ModelSpec("embedded-tiny", tiny_model)
    base = run_arm(arm_pipeline(CONTROL, teacher, GEN), "a red fox", 5, CONTROL, GEN, 64, count=True)
    copy = ArmSpec("student", model=ModelSpec("local", student))
    pipe = arm_pipeline(copy, teacher, GEN)
    assert pipe is not arm_pipeline(CONTROL, teacher, GEN)
    same = run_arm(pipe, "a red fox", 5, copy, GEN, 64, count=True)
    assert np.array_equal(same.frames, base.frames)
    bf16 = ArmSpec("bf16", dtype="bfloat16")
    # on the copy, so this process's load count of the session's tiny model stays 1 (test_generate)
    low = run_arm(arm_pipeline(bf16, ModelSpec("local", student), GEN), "a red fox", 5, bf16, GEN, 64, count=True)
    assert low.compute["latent_shape"] == base.compute["latent_shape"]
    assert not np.array_equal(np.asarray(low.frames, dtype=np.float32), base.frames)


def _before() -> tuple[dict, object]:
    """``tests/data/arms_before.json`` (recorded before the arms were split into one module
    per kind) and the script that computes the same fields with the current code."""
    import importlib.util

    data = Path(__file__).parent / "data"
    spec = importlib.util.spec_from_file_location("arms_before", data / "arms_before.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return json.loads((data / "arms_before.json").read_text()), module


def test_the_default_study_and_every_kind_keep_their_ids_digests_and_records() -> None:
    """The split into pairflow.arms.kinds changed no identity: the default study's 56
    candidate ids, panel digests and arm records, and one arm per kind's digest, keys,
    kinds and record, equal what the code computed before it (commit 05e63e5)."""
    before, script = _before()
    now = script.identities(Path(__file__).resolve().parents[1])  # type: ignore[attr-defined]
    assert len(now["default_study"]["candidates"]) == 56
    assert now["default_study"] == before["default_study"]
    assert now["variants"] == before["variants"]


def _generate(script: object, root: Path, model: Path) -> tuple[dict, dict[str, str]]:
    """``script.frames`` arm by arm, as JSON values; with ``ATEN_CPU_CAPABILITY`` forcing torch's
    kernels below the CPU's, an arm torch cannot run there (bf16 attention: "pack_vnni2 is only
    supported when avx512 is supported", torch 2.14.1 on an AVX512 CPU) is set aside, with why."""
    out: dict = {}
    unavailable: dict[str, str] = {}
    for arm in script.GENERATED:  # type: ignore[attr-defined]
        try:
            out.update(script.frames(root, model, [arm]))  # type: ignore[attr-defined]
        except RuntimeError as e:
            if not os.environ.get("ATEN_CPU_CAPABILITY"):
                raise
            unavailable[arm.name] = str(e).strip().splitlines()[0]
    return json.loads(json.dumps(out)), unavailable


def test_every_kind_generates_the_frames_it_generated_before(tiny_model: Path) -> None:
    """The same frames, bit for bit, for control and one arm per kind (a cache, steps and
    guidance, a scheduler, an attention backend, a dtype, a search with its candidates'
    seeds, scores and frame digests) as before the split (commit 05e63e5).

    Bit-for-bit frames are a property of the code *and* of the numeric stack (torch build,
    CPU kernels, threads, CPU features, numpy, diffusers, transformers), so
    ``arms_before.json`` keeps them per stack. On any stack: generating twice in this
    process gives the same bits; a search's first candidate (the stream seed) is the
    control's generation, through the search's own path; and what is the code's alone
    (arms, effective settings, candidate indices and seeds) equals every recording. The
    recorded digests are compared only where this stack was recorded
    (``python tests/data/arms_before.py --record`` records it); elsewhere that part skips,
    naming this stack and the recorded ones."""
    from pairflow.arms import verifier_for
    from pairflow.generation.generate import text_tokens
    from pairflow.identity import digest_bytes
    from pairflow.media.video import prepare_frames
    from pairflow.plan.config import load_study

    before, script = _before()
    root = Path(__file__).resolve().parents[1]
    now, unavailable = _generate(script, root, tiny_model)
    assert _generate(script, root, tiny_model) == (now, unavailable)  # the same bits, twice in one process
    recorded = before["tiny_frames"]
    for key, rec in recorded.items():
        code_only = script.stack_independent(rec["frames"])  # type: ignore[attr-defined]
        assert script.stack_independent(now) == {a: code_only[a] for a in now}, key  # type: ignore[attr-defined]

    study = load_study(root / "config" / "config.yaml", root)
    m = ModelSpec("embedded-tiny", tiny_model)
    pipe = arm_pipeline(CONTROL, m, GEN)
    control = run_arm(pipe, "a red fox in snow", 1234, CONTROL, GEN, text_tokens(pipe, GEN))
    assert digest_bytes(np.ascontiguousarray(control.frames, dtype=np.float32).tobytes()) == now["control"]["frames"]
    (search,) = [a for a in script.GENERATED if a.search is not None]  # type: ignore[attr-defined]

    class Study:  # what verifier_for reads of a study
        encoder, weights, scoring, generation = study.encoder, study.weights, study.scoring, GEN

    shown, _ = prepare_frames(control.frames, verifier_for(search, Study).encoder)
    assert now[search.name]["candidates"][0]["seed"] == 1234
    assert now[search.name]["candidates"][0]["raw_digest"] == digest_bytes(shown.tobytes())

    key = script.stack_key(script.stack())  # type: ignore[attr-defined]  # after generating: its threads
    if key not in recorded or unavailable:
        why = ("this numeric stack has no recording in tests/data/arms_before.json" if key not in recorded
               else "some arms could not run")
        pytest.skip(f"bitwise frame digests not compared: {why}.\n  this stack: {key}"
                    + (f" (ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']})"
                       if os.environ.get("ATEN_CPU_CAPABILITY") else "")
                    + "\n  recorded: " + "\n            ".join(recorded)
                    + "".join(f"\n  not run here: {a}: {e}" for a, e in unavailable.items())
                    + "\n  (within-run checks passed; `python tests/data/arms_before.py --record` records this stack)")
    assert now == recorded[key]["frames"], f"frames differ, bit for bit, from those recorded on this stack: {key}"


def test_the_registry_is_the_one_declaration_of_kinds_keys_and_precisions() -> None:
    """Schemas, messages and docs come from or agree with the kinds' own modules: the
    config schema's arm properties are exactly the registered keys, every dtype enum is
    PRECISIONS' loadable list, and every key has a row in docs/arms.md naming its
    kind's module."""
    from pairflow.arms import KEYS, KINDS, LOADABLE, PRECISIONS
    from pairflow.plan.config import _schema
    from pairflow.records.store import load_schema

    schema = _schema()["properties"]
    assert list(schema["arms"]["additionalProperties"]["properties"]) == list(KEYS)
    assert schema["generation"]["properties"]["dtype"]["enum"] == list(LOADABLE)
    assert schema["arms"]["additionalProperties"]["properties"]["dtype"]["enum"] == list(LOADABLE)
    assert load_schema("record.generation")["$defs"]["generation_settings"]["properties"]["dtype"]["enum"] == list(
        LOADABLE)
    assert LOADABLE == ("float32", "float16", "bfloat16")
    assert {p.name for p in PRECISIONS if p.quantised} == {"int8", "fp8"}
    assert {"cache", "overrides", "model", "dtype", "attention_backend", "search", "vae_dtype"} <= {k.name for k in KINDS}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "arms.md").read_text()
    table = docs.split("\n## Arm keys\n", 1)[1].split("| key | default | meaning |\n|---|---|---|\n", 1)[1]
    table = table.split("\n\n", 1)[0]  # the rows that follow the header, up to the first blank line
    for k in KINDS:
        module = sys.modules[type(k).__module__].__file__
        assert module is not None
        for key in k.keys:
            assert f"| `arms.<name>.{key}` (`kinds/{Path(module).name}`) |" in table, key


def test_a_quantised_precision_is_declared_but_refused_with_the_reason() -> None:
    from pairflow.arms import torch_dtype

    with pytest.raises(ConfigError, match="'int8'.*weight-only int8.*quantisation backend"):
        torch_dtype("int8")
    with pytest.raises(ConfigError, match="'int4' is not one PairFlow declares"):
        torch_dtype("int4")
    import torch

    assert torch_dtype("bfloat16") is torch.bfloat16


def test_an_arm_that_fails_to_apply_leaves_the_shared_pipeline_as_it_was() -> None:
    """arms.applied restores every kind it entered when one of them fails (here the
    scheduler swap, on a pipeline shared by every arm of a worker)."""
    from pairflow.arms import applied

    class Pipe:
        scheduler = "original"

    arm = ArmSpec("x", scheduler_class="NoSuchScheduler")
    pipe = Pipe()
    with pytest.raises(ConfigError, match="arms/x/scheduler/class"):
        with applied(arm, pipe, "cpu"):
            pass
    assert pipe.scheduler == "original"


@pytest.mark.slow
def test_every_kind_runs_end_to_end_and_its_record_sections_verify(finished_study: Path, tmp_path: Path) -> None:
    """One study with an arm of every kind (a cache, overrides, a student, a dtype, an
    attention backend, a search, a VAE-decode precision: the session's shared finished
    study, run through Snakemake); each record carries its kinds' fields and sections,
    fits its schema (checked on write and by verify), and the study verifies."""
    project = copy_study(finished_study, tmp_path / "proj")  # verify may write its memo
    cfg = study_config(project)
    assert {"control", "mix", "student", "best2", "vae16"} <= set(cfg["arms"])
    assert cfg["arms"]["student"]["dtype"] == "bfloat16" and cfg["arms"]["mix"] == SHARED_ARMS["mix"]
    scratch = project / cfg["storage"]["scratch"]
    recs = {json.loads(p.read_text())["arm"]["name"]: json.loads(p.read_text())
            for p in (scratch / "panels" / "t" / "records").glob("*/a1-s0.json")}
    assert recs.keys() == cfg["arms"].keys()
    assert recs["mix"]["arm"]["kinds"] == ["cache", "overrides", "attention_backend"]
    assert recs["mix"]["effective_generation"]["steps"] == 2
    assert recs["student"]["arm"]["kinds"] == ["model", "dtype"] and recs["student"]["arm_model"]["weights"]
    assert recs["student"]["effective_generation"]["dtype"] == "bfloat16"
    assert recs["best2"]["search"]["n"] == 2 and len(recs["best2"]["search"]["candidates"]) == 2
    assert recs["vae16"]["arm"]["vae_dtype"] == "float16" and recs["vae16"]["arm"]["kinds"] == ["vae_dtype"]
    assert "search" not in recs["vae16"] and "arm_model" not in recs["control"]
    verify = subprocess.run([str(Path(sys.executable).with_name("pairflow")), "verify", str(scratch),
                             "--configfile", "config/config.yaml"], cwd=project, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout[-4000:]

"""The VAE-decode precision arm (pairflow.arms.kinds.vae_dtype), added through the arms
registry alone: config, schema, digest, record, check, apply and restore."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import small_config
from jsonschema import Draft202012Validator

from pairflow.arms import KINDS, check_arms
from pairflow.arms.registry import arm_digest, arm_fields, declared_keys, declared_kinds
from pairflow.errors import ConfigError
from pairflow.generation.armrun import arm_pipeline, run_arm
from pairflow.generation.provenance import arm_record
from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec, study_from_raw
from pairflow.records.store import load_schema

GEN = GenerationSpec(frames=5, height=32, width=32, steps=3, guidance=5.0, fps=8, dtype="float32", threads=1)


def test_the_key_is_typed_digested_recorded_and_validated(tmp_path: Path, tiny_model: Path) -> None:
    raw = small_config(tmp_path, tiny_model, arms={"control": {"cache": None}, "vae16": {"vae_dtype": "bfloat16"}})
    arm = study_from_raw(raw, tmp_path).arms[1]
    assert arm.extra == {"vae_dtype": "bfloat16"}
    assert declared_kinds(arm) == ("vae_dtype",) and declared_keys(arm) == ("vae_dtype",)
    assert arm_fields(arm) == {"cache_class": None, "cache_params": {}, "vae_dtype": "bfloat16"}
    assert arm_digest(arm) != arm_digest(ArmSpec("vae16")) != arm_digest(ArmSpec("vae16", extra={"vae_dtype": "float16"}))
    assert "vae_dtype" in {k.name for k in KINDS}  # found by the registry, wherever it sorts
    rec = dict(arm_record(arm))
    assert rec["vae_dtype"] == "bfloat16" and rec["kinds"] == ["vae_dtype"]
    defs = load_schema("record.generation")["$defs"]  # the record schema knows the field and its type
    assert Draft202012Validator({"$defs": defs, "$ref": "#/$defs/arm"}).is_valid(rec)
    assert not Draft202012Validator({"$defs": defs, "$ref": "#/$defs/arm"}).is_valid({**rec, "vae_dtype": 16})
    bad = small_config(tmp_path, tiny_model, arms={"control": {"cache": None}, "v": {"vae_dtype": "int8"}})
    with pytest.raises(ConfigError, match="arms/v/vae_dtype.*int8.*float32"):
        study_from_raw(bad, tmp_path)
    ctrl = small_config(tmp_path, tiny_model, arms={"control": {"vae_dtype": "bfloat16"}, "v": {"steps": 2}})
    with pytest.raises(ConfigError, match="'arms/control/vae_dtype'"):
        study_from_raw(ctrl, tmp_path)


def test_a_model_without_a_vae_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model_index.json").write_text(json.dumps({"_class_name": "X", "transformer": ["a", "b"]}))
    arm = ArmSpec("v", extra={"vae_dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="arms/v/vae_dtype.*has no VAE"):
        check_arms((ArmSpec("control"), arm), ModelSpec("local", tmp_path / "m"))


def test_a_half_precision_decode_changes_the_frames_and_restores_the_vae(tiny_model: Path) -> None:
    """The arm's frames differ from control's (same seed) only through the decode: a
    float16 decode stays close (the tiny model's random VAE amplifies bfloat16's 8-bit
    mantissa far more: mean |diff| 0.08, correlation 0.82, measured); the shared
    pipeline's VAE is the float32 original again afterwards, with the same weights, so
    control's next video is bit-identical to its first."""
    import torch

    model = ModelSpec("embedded-tiny", tiny_model)
    control, arm = ArmSpec("control"), ArmSpec("vae16", extra={"vae_dtype": "float16"})
    check_arms((control, arm), model)
    pipe = arm_pipeline(arm, model, GEN)
    assert pipe is arm_pipeline(control, model, GEN)  # one pipeline: only the decode changes
    vae, weights = pipe.vae, {k: v.clone() for k, v in pipe.vae.state_dict().items()}
    first = run_arm(pipe, "a red fox", 7, control, GEN, 16).frames
    treated = run_arm(pipe, "a red fox", 7, arm, GEN, 16).frames
    again = run_arm(pipe, "a red fox", 7, control, GEN, 16).frames
    assert pipe.vae is vae and vae.dtype == torch.float32
    assert all(torch.equal(v, weights[k]) for k, v in vae.state_dict().items())
    assert np.array_equal(first, again)
    assert treated.dtype == np.float32 and treated.shape == first.shape
    assert not np.array_equal(treated, first)
    assert np.abs(treated - first).mean() < 0.01 and np.corrcoef(treated.ravel(), first.ravel())[0, 1] > 0.99
    bf16 = run_arm(pipe, "a red fox", 7, ArmSpec("vae_bf16", extra={"vae_dtype": "bfloat16"}), GEN, 16).frames
    assert not np.array_equal(bf16, treated) and not np.array_equal(bf16, first) and pipe.vae is vae

"""Kind ``model``: another checkpoint (a distilled student) that makes the same latents
from the same seed as the study's model.

Config: ``model: {kind, path, id, revision}``. Checked before any model loads (and again
when the pipeline loads, once the embedded model exists): the student's pipeline class,
VAE latent channels and compression and transformer input channels and temporal patch
(``latent_signature``) equal the study model's, so a pair still shares its initial noise.
Digest: the student's identity (never its path, a site fact). Record section
``arm_model``: its identity, path and the digest of every file.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from ...errors import ConfigError
from ...identity import digest_tree
from ...specs import ArmSpec, ModelSpec
from ..base import ArmKind, ParseContext


def _component(model: ModelSpec, part: str) -> dict[str, Any] | None:
    path = model.root / "model_index.json" if part == "model_index" else model.root / part / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _with_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """A component's ``config.json`` with the keys it leaves out filled from its diffusers
    class's defaults, as ``from_pretrained`` fills them (a checkpoint saved by an older
    diffusers lacks keys a newer one reads, e.g. AutoencoderKLWan's ``scale_factor_*``)."""
    import diffusers  # heavy: only checks import it, never planning

    cls = getattr(diffusers, str(cfg.get("_class_name")), None)
    if cls is None:
        return cfg
    params = inspect.signature(cls.__init__).parameters.values()
    return {**{p.name: p.default for p in params if p.default is not inspect.Parameter.empty}, **cfg}


def _compression(vae: dict[str, Any]) -> tuple[Any, Any]:
    """(spatial, temporal) compression of a VAE config, read as the pipelines read it:
    Wan's ``scale_factor_spatial``/``_temporal``; else HunyuanVideo's and LTX's
    ``spatial_``/``temporal_compression_ratio``; else LTX's ``patch_size`` times 2 per
    ``spatio_temporal_scaling`` stage; else CogVideoX's 2 per ``block_out_channels`` stage
    after the first (spatial) and ``temporal_compression_ratio``. None where a VAE says nothing."""
    spatial = vae.get("scale_factor_spatial") or vae.get("spatial_compression_ratio")
    temporal = vae.get("scale_factor_temporal") or vae.get("temporal_compression_ratio")
    stages = vae.get("spatio_temporal_scaling")
    if stages is not None:
        spatial = spatial or vae.get("patch_size", 1) * 2 ** sum(map(bool, stages))
        temporal = temporal or vae.get("patch_size_t", 1) * 2 ** sum(map(bool, stages))
    if spatial is None and vae.get("block_out_channels"):
        spatial = 2 ** (len(vae["block_out_channels"]) - 1)
    return spatial, temporal


def latent_signature(model: ModelSpec) -> dict[str, Any] | None:
    """What decides the latents ``model`` draws from a seed, i.e. their shape for a given
    video size: the pipeline class, the VAE's latent channels (``z_dim`` or
    ``latent_channels``) and spatial and temporal compression, the transformer's input
    channels (the channels the pipelines draw noise in) and temporal patch (CogVideoX pads
    latent frames to it). Not the widths inside the VAE or the transformer, which change
    no latent. None when the model is not on disk yet."""
    index = _component(model, "model_index")
    if index is None:
        return None
    vae = _with_defaults(_component(model, "vae") or {})
    transformer = _with_defaults(_component(model, "transformer") or {})
    spatial, temporal = _compression(vae)
    return {"pipeline class": index.get("_class_name"),
            "VAE latent channels": vae.get("z_dim", vae.get("latent_channels")),
            "VAE spatial compression": spatial, "VAE temporal compression": temporal,
            "transformer input channels": transformer.get("in_channels"),
            "transformer temporal patch": transformer.get("patch_size_t")}


def check_same_latents(arm: ArmSpec, model: ModelSpec) -> None:
    """Refuse a ``model`` arm whose checkpoint would not draw the same initial noise as
    the study's model from the same seed (``latent_signature`` differs: another pipeline
    class, latent channels or compression): its pairs would not share their noise. A
    student whose VAE or transformer differs only in inner widths passes. Skipped while
    either model is not on disk (the embedded model is built by a rule; generation checks
    again)."""
    if arm.model is None:
        return
    a, b = latent_signature(model), latent_signature(arm.model)
    if a is None or b is None:
        if b is None and arm.model.kind != "hub-mirror":
            raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/model/path' is {str(arm.model.path)!r}, which "
                              "has no model_index.json; point it at a diffusers checkpoint directory")
        return
    diff = [f"{k} {b[k]} (the study's model: {a[k]})" for k in a if a[k] != b[k]]
    if diff:
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/model/path' is {str(arm.model.path)!r}, which "
                          f"makes other latents than the study's model {model.path} from the same seed: "
                          f"{'; '.join(diff)}. A pair must share its initial noise: use a student with the "
                          "teacher's pipeline class, latent channels and VAE compression (inner widths may differ)")


def arm_model(arm: ArmSpec, model: ModelSpec) -> ModelSpec:
    """The model ``arm`` runs: its own checkpoint, else the study's ``model``."""
    return arm.model or model


class Student(ArmKind):
    name = "model"
    rank = 30
    keys = ("model",)
    docs = "another checkpoint (a distilled student) that makes the same latents"
    schema: ClassVar[Mapping[str, Any]] = {"model": {
        "type": "object", "additionalProperties": False, "required": ["path"],
        "description": ("another checkpoint (a distilled student); refused unless it makes the same latent shape "
                        "from the same seed as the study's model"),
        "properties": {"kind": {"type": "string", "enum": ["local", "hub-mirror"], "default": "local"},
                       "path": {"type": "string", "minLength": 1}, "id": {"type": "string"},
                       "revision": {"type": "string"}}}}
    record_schema: ClassVar[Mapping[str, Any]] = {"model": {"type": "object"}}

    def parse(self, raw: Mapping[str, Any], ctx: ParseContext) -> dict[str, Any]:
        m = raw.get("model")
        return {"model": ctx.model(f"arms/{ctx.arm}/model/path", m) if m is not None else None}

    def fields(self, arm: ArmSpec) -> dict[str, Any]:
        return {"model": arm.model.identity()} if arm.model is not None else {}

    def check(self, arm: ArmSpec, model: ModelSpec, device: str) -> None:
        check_same_latents(arm, model)

    def section(self, arm: ArmSpec, result: Any, model: ModelSpec) -> dict[str, Any]:
        m = arm_model(arm, model)
        return {"arm_model": {**m.identity(), "weights": digest_tree(m.path) if m.path.is_dir() else {},
                              "path": str(m.path)}}


KIND = Student()

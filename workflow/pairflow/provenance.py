"""What every record of a run says about how it was made: code, environment, model
weights, encoder recipe and fingerprint, config digest; and what it says of its arm."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from .config import ArmSpec, StudySpec
from .recordtypes import ArmFields, CodeFields, ModelFields, Provenance


def provenance(study: StudySpec) -> Provenance:
    """Fields shared by every record of a run (computed once in the driver)."""
    from .envinfo import code_version, environment
    from .generate import model_digests
    from .video import encoder_fingerprint, recipe, recipe_digest

    fingerprint = encoder_fingerprint(study.encoder)
    return {
        "code": cast(CodeFields, code_version(str(study.root))),
        "environment": environment(),
        "model": cast(ModelFields, {**study.model.identity(), "weights": model_digests(study.model)}),
        "encoder": {"recipe": recipe(study.encoder, study.generation.fps),
                    "recipe_digest": recipe_digest(study.encoder, study.generation.fps),
                    "fingerprint": {"version": fingerprint["version"], "digest": fingerprint["digest"]}},
        "config_digest": study.subtree_digest("study", "model", "arms", "generation", "encoder"),
        # Where things were on this site: run-specific, not part of what was computed.
        "site": {"model_path": str(study.model.path), "ffmpeg_binary": fingerprint["binary"],
                 "scratch": str(study.scratch)},
    }


def arm_record(arm: ArmSpec) -> ArmFields:
    """What a record says of its arm: name, kinds of change and every output-changing field."""
    return cast(ArmFields, {"name": arm.name, "kinds": list(arm.kinds), **arm.asdict(), "digest": arm.digest})


def arm_of(record: Mapping[str, Any]) -> ArmSpec:
    """The arm a record names, as far as scoring needs it (its name decides control)."""
    return ArmSpec(record["arm"]["name"], record["arm"].get("cache_class"), record["arm"].get("cache_params", {}))

"""What every record of a run says about how it was made: code, environment, model
weights, encoder recipe and fingerprint, config digest; and what it says of its arm."""

from __future__ import annotations

from typing import Any

from .config import ArmSpec, StudySpec


def provenance(study: StudySpec) -> dict[str, Any]:
    """Fields shared by every record of a run (computed once in the driver)."""
    from .envinfo import code_version, environment
    from .generate import model_digests
    from .video import encoder_fingerprint, recipe, recipe_digest

    fingerprint = encoder_fingerprint(study.encoder)
    return {
        "code": code_version(str(study.root)),
        "environment": environment(),
        "model": {**study.model.identity(), "weights": model_digests(study.model)},
        "encoder": {"recipe": recipe(study.encoder, study.generation.fps),
                    "recipe_digest": recipe_digest(study.encoder, study.generation.fps),
                    "fingerprint": {k: fingerprint[k] for k in ("version", "digest")}},
        "config_digest": study.subtree_digest("study", "model", "arms", "generation", "encoder"),
        # Where things were on this site: run-specific, not part of what was computed.
        "site": {"model_path": str(study.model.path), "ffmpeg_binary": fingerprint["binary"],
                 "scratch": str(study.scratch)},
    }


def arm_record(arm: ArmSpec) -> dict[str, Any]:
    """What a record says of its arm: name, kinds of change and every output-changing field."""
    return {"name": arm.name, "kinds": list(arm.kinds), **arm.asdict(), "digest": arm.digest}


def arm_of(record: dict[str, Any]) -> ArmSpec:
    """The arm a record names, as far as scoring needs it (its name decides control)."""
    return ArmSpec(record["arm"]["name"], record["arm"].get("cache_class"), record["arm"].get("cache_params", {}))

"""What every record of a run says about how it was made: code, environment, model
weights, encoder recipe and fingerprint, config digest; what it says of its arm; and the
config snapshot a manifest carries, from which verify rebuilds the study."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from ..arms.registry import arm_digest, arm_fields, declared_kinds
from ..envinfo import code_version, environment
from ..media.recipe import encoder_fingerprint, recipe, recipe_digest
from ..plan.config import ArmSpec, Prompt, StudySpec, study_from_raw
from ..records.types import ArmFields, CodeFields, ModelFields, Provenance
from .generate import model_digests


def provenance(study: StudySpec) -> Provenance:
    """Fields shared by every record of a run (computed once in the driver)."""
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
    return cast(ArmFields, {"name": arm.name, "kinds": list(declared_kinds(arm)), **arm_fields(arm),
                              "digest": arm_digest(arm)})


def arm_of(record: Mapping[str, Any]) -> ArmSpec:
    """The arm a record names, as far as scoring needs it (its name decides control)."""
    return ArmSpec(record["arm"]["name"], record["arm"].get("cache_class"), record["arm"].get("cache_params", {}))


def config_snapshot(study: StudySpec) -> dict[str, Any]:
    """What verify needs to rebuild the study years later: the defaults-filled config,
    the project root it was resolved against, and every panel's planned prompts (sheets
    move; a group-sequential study's release is read from its looks' decisions)."""
    return {"raw": study.raw, "root": str(study.root),
            "prompts": {p.name: [[q.prompt_id, q.text] for q in p.planned] for p in study.panels}}


def study_from_snapshot(snapshot: dict[str, Any], scratch: Path) -> StudySpec:
    """The study a manifest recorded, with its scratch root set to ``scratch`` (where the
    tree is now). Raises ConfigError when the snapshot does not validate."""
    raw = json.loads(json.dumps(snapshot["raw"]))
    raw["storage"]["scratch"] = str(Path(scratch).resolve())
    prompts = {name: tuple(Prompt(pid, text) for pid, text in rows) for name, rows in snapshot["prompts"].items()}
    return study_from_raw(raw, Path(snapshot["root"]), source="the config snapshot recorded in the manifests",
                          prompts=prompts)

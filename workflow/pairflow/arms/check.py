"""The arms' check before any model loads: every declared kind's ``check`` of every arm,
run by rule ``check_arms`` (``write_arms_check``) and ``pairflow check-config``, never by
the planning process (it imports diffusers). ``arms_check_key`` and ``arms_check_inputs``
are what the rule reruns on; they read only the config and the model files' presence.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..atomic import write_text
from ..envinfo import package_version
from ..identity import digest_obj
from ..specs import ArmSpec, ModelSpec
from .base import device
from .registry import KINDS, arm_fields

log = logging.getLogger(__name__)


def check_arms(arms: tuple[ArmSpec, ...], model: ModelSpec) -> None:
    """Every check of every arm that needs no weights loaded, kind by kind (caches: class,
    params, support by the arm's transformer; scheduler class and params; a student's
    latent compatibility; attention backend usable on this machine; a search verifier
    that is an NR metric; and any other registered kind's). Raises ConfigError naming the
    arm, the key, the value and what is allowed."""
    here = None
    for kind in KINDS:
        for arm in arms:
            if kind.declared(arm):
                here = here or device()
                kind.check(arm, model, here)


def arms_check_key(arms: tuple[ArmSpec, ...], model: ModelSpec) -> str:
    """What the arms' check depends on besides the model files (rule ``check_arms`` takes
    those as inputs): every field of every arm (students included), the model's identity
    and the installed diffusers version, read from package metadata so that planning
    never imports diffusers or torch. A change reruns the check (a ``params`` trigger)."""
    return digest_obj({"arms": [arm_fields(a) for a in arms], "model": model.identity(),
                       "diffusers": package_version("diffusers")})


def arms_check_inputs(arms: tuple[ArmSpec, ...], model: ModelSpec) -> list[Path]:
    """The model files the arms' check reads that exist when the run is planned: the
    ``model_index.json``, transformer config and VAE config of the study's model and of
    each arm's own model (a student: ``latent_signature`` reads all three). The embedded
    model is left out: its files appear when its rule builds it, and rule ``check_arms``
    takes that rule's output instead."""
    models = [m for m in (model, *(a.model for a in arms)) if m is not None and m.kind != "embedded-tiny"]
    files = (m.root / part for m in models for part in ("model_index.json", "transformer/config.json",
                                                        "vae/config.json"))
    return sorted({f for f in files if f.is_file()})


def write_arms_check(arms: tuple[ArmSpec, ...], model: ModelSpec, out: Path) -> None:
    """Rule ``check_arms``: run ``check_arms`` (imports diffusers, in the rule's own
    process, never the planning one) and, when every arm passes, write ``out`` with the
    check's key. Generation jobs take ``out`` as input, so no model loads before the arms
    passed. Raises ConfigError naming the arm, the key, the value and the fix."""
    check_arms(arms, model)
    write_text(out, json.dumps({"check": "arms", "passed": True, "arms": [a.name for a in arms],
                                "key": arms_check_key(arms, model)}, indent=1) + "\n")
    log.info("arms %s passed their check against %s", [a.name for a in arms], model.path)

"""The arms' check before any model loads: every declared kind's ``check`` of every arm,
run by rule ``check_arms`` (``write_arms_check``) and ``pairflow check-config``, never by
the planning process (it imports diffusers). ``arms_check_key`` and ``arms_check_inputs``
are what the rule reruns on; they read only the config and the model files' presence.
``check_models`` refuses a model folder that is missing or unreadable (files only, no
import): planning, ``pairflow check-config`` and rule ``check_arms`` call it.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

from ..atomic import write_text
from ..envinfo import package_version
from ..errors import ConfigError
from ..identity import digest_obj
from ..specs import ArmSpec, ModelSpec
from .base import device
from .registry import KINDS, arm_fields

log = logging.getLogger(__name__)

BUILD_RULE = "snakemake --profile profiles/local build_tiny_model"
"""The command, run in the project, that builds the embedded tiny model where
``model/path`` says (the rule a run starts with; ``tests/test_arms.py`` runs it)."""


def model_problem(model: ModelSpec) -> str | None:
    """What keeps ``model`` from loading, read from its files alone (nothing imported):
    its folder missing, a file, without a ``model_index.json`` (not a diffusers pipeline,
    or a copy that did not finish), that index unreadable or not a JSON mapping, or a
    component it names without its folder. For a hub mirror, the pinned snapshot of
    ``id`` at ``revision`` under ``path``. None when none of these holds."""
    root = model.root
    if model.kind == "hub-mirror" and model.path.is_dir() and not root.is_dir():
        return f"which holds no snapshot of {model.id} at revision {model.revision} (looked for {root})"
    if not root.exists():
        return "which does not exist"
    if not root.is_dir():
        return "which is a file, not a folder"
    index = root / "model_index.json"
    try:
        spec = json.loads(index.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ("which holds no model_index.json (not a diffusers pipeline folder, or a copy that did not "
                "finish)")
    except OSError as e:
        return f"whose model_index.json cannot be read ({e.strerror or e})"
    except ValueError as e:  # UnicodeDecodeError and json.JSONDecodeError both
        return f"whose model_index.json is not JSON text ({e})"
    if not isinstance(spec, dict):
        return f"whose model_index.json is a JSON {type(spec).__name__}, not the mapping diffusers writes"
    missing = sorted(name for name, value in spec.items()
                     if not name.startswith("_") and isinstance(value, list) and len(value) == 2
                     and all(isinstance(v, str) for v in value) and not (root / name).is_dir())
    if missing:
        return (f"whose model_index.json names the component(s) {missing} but which has no folder for "
                f"{'it' if len(missing) == 1 else 'them'} (a copy that did not finish)")
    return None


def check_models(model: ModelSpec, arms: tuple[ArmSpec, ...], source: str,
                 built: frozenset[Path] = frozenset(), project: Path | None = None) -> list[str]:
    """Refuse, before any job, a model no job could load: the study's (``model/path``)
    or an arm's own (``arms/<arm>/model/path``) with a ``model_problem``. ``built``: the
    folders a rule builds (the embedded tiny model, rule ``build_tiny_model``), which
    may be missing or incomplete until it runs; their builds are returned as notes.
    ``project``: the folder snakemake runs in, named where a fix runs snakemake.
    Raises ConfigError naming the key, the folder, what is wrong and a fix that works."""
    rule = f"{BUILD_RULE} (in {project})" if project is not None else f"{BUILD_RULE} (in the project)"
    notes = []
    for key, m in (("model/path", model), *((f"arms/{a.name}/model/path", a.model) for a in arms
                                             if a.model is not None)):
        problem = model_problem(m)
        if problem is None:
            continue
        if m.path in built and not (m.root / "model_index.json").exists():
            notes.append(f"model {m.path} ({key}) is not built yet: a run builds it first (rule build_tiny_model), "
                         f"and checks every arm against it then; to build it now: {rule}")
            continue
        raise ConfigError(f"{source}: key {key!r} names the {m.kind} model {m.path}, {problem}; "
                          + _model_fix(m, key, m.path in built, rule))
    return notes


def _model_fix(m: ModelSpec, key: str, built: bool, rule: str) -> str:
    """A fix for ``check_models``'s refusal of model ``m`` at ``key`` that works
    (``rule``: the build rule's command and where to run it)."""
    tiny = f"pairflow build-tiny-model {shlex.quote(str(m.path))}"
    if m.kind == "embedded-tiny":
        return f"rebuild it: {tiny} (replaces the folder)" if built else f"build it: {rule}, or {tiny}"
    if m.kind == "hub-mirror":
        return (f"fill the mirror on a machine with internet (huggingface_hub.snapshot_download({m.id!r}, "
                f"revision={m.revision!r}, cache_dir={str(m.path)!r})), or point {key!r} at the Hugging Face "
                "cache folder that holds it")
    also = ("; for the embedded tiny model set model/kind to embedded-tiny (a run builds it)"
            if key == "model/path" else "")
    return (f"point {key!r} at a diffusers pipeline folder (the one holding model_index.json, e.g. from "
            f"'huggingface-cli download <repo> --local-dir <folder>'), or build a tiny one there: {tiny}{also}")


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
    passed. Raises ConfigError naming the arm, the key, the value and the fix, or (from
    ``check_models``) the model key whose folder cannot be loaded: never a pass against
    a model that is not there."""
    check_models(model, arms, "the arms' check")
    check_arms(arms, model)
    write_text(out, json.dumps({"check": "arms", "passed": True, "arms": [a.name for a in arms],
                                "key": arms_check_key(arms, model)}, indent=1) + "\n")
    log.info("arms %s passed their check against %s", [a.name for a in arms], model.path)

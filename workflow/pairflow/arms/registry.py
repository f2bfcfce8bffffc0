"""The registry of arm kinds: every module of ``pairflow.arms.kinds`` that defines
``KIND`` (an ``ArmKind``), in ``rank`` order, and the operations over all of them that
config, generation and records use. A new kind is one module in ``kinds/`` (plus its test
and its docs row); nothing here or in ``config`` changes.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from typing import Any

# the kinds package by its full name: `from . import kinds` would read as an import of
# pairflow.arms (whose __init__ imports this module back)
import pairflow.arms.kinds as _kinds

from ..errors import ConfigError
from ..identity import digest_obj
from ..specs import ArmSpec, GenerationSpec, ModelSpec
from .base import ArmKind, ParseContext
from .kinds.precision import LOADABLE


def _discover() -> tuple[ArmKind, ...]:
    found = []
    for info in pkgutil.iter_modules(_kinds.__path__):
        module = importlib.import_module(f"{_kinds.__name__}.{info.name}")
        kind = getattr(module, "KIND", None)
        if isinstance(kind, ArmKind):
            found.append(kind)
    found.sort(key=lambda k: (k.rank, k.name))
    names = [k.name for k in found]
    keys = [key for k in found for key in k.keys]
    if len(set(names)) != len(names) or len(set(keys)) != len(keys):
        raise ConfigError(f"pairflow.arms.kinds declares a kind name or config key twice (kinds {names}, keys "
                          f"{keys}); give each kind its own name and keys")
    return tuple(found)


KINDS: tuple[ArmKind, ...] = _discover()
"""Every registered kind of arm, in ``rank`` order."""
KEYS: tuple[str, ...] = tuple(key for k in KINDS for key in k.keys)
"""Every config key an arm may set, in the order messages name them."""


def kind(name: str) -> ArmKind:
    """The registered kind ``name``. Raises ConfigError for an unknown one."""
    for k in KINDS:
        if k.name == name:
            return k
    raise ConfigError(f"arm kind {name!r} is not registered; registered kinds: {[k.name for k in KINDS]}; "
                      f"add a module for it under workflow/pairflow/arms/kinds/")


def declared_kinds(arm: ArmSpec) -> tuple[str, ...]:
    """The kinds of change ``arm`` declares (empty for control)."""
    return tuple(k.name for k in KINDS if k.declared(arm))


def declared_keys(arm: ArmSpec) -> tuple[str, ...]:
    """The config keys ``arm`` sets, as the user writes them."""
    return tuple(key for k in KINDS for key in k.declared_keys(arm))


def arm_fields(arm: ArmSpec) -> dict[str, Any]:
    """Every field that changes ``arm``'s output (what records carry and the digest
    covers), kind by kind: each declared kind's fields (``ArmKind.fields``); the cache's
    two always, so a cache-only arm keeps its old identity."""
    out: dict[str, Any] = {}
    for k in KINDS:
        out.update(k.fields(arm))
    return out


def arm_digest(arm: ArmSpec) -> str:
    """The arm's identity in candidate ids: the digest of ``arm_fields``."""
    return digest_obj(arm_fields(arm))


def parse_arm(raw: Mapping[str, Any], ctx: ParseContext) -> dict[str, Any]:
    """``ArmSpec`` keyword values (``extra`` holding the keys of kinds without an
    attribute of their own) from one validated arm mapping."""
    values: dict[str, Any] = {}
    for k in KINDS:
        values.update(k.parse(raw, ctx))
    attrs = set(ArmSpec.__dataclass_fields__)
    extra = {key: v for key, v in values.items() if key not in attrs and v is not None}
    return {**{key: v for key, v in values.items() if key in attrs}, "extra": extra}


def effective_generation(arm: ArmSpec, gen: GenerationSpec) -> GenerationSpec:
    """The generation settings ``arm`` runs with: the study's, with each declared kind's
    overrides (steps, guidance, dtype, ...)."""
    for k in KINDS:
        if k.declared(arm):
            gen = k.effective(arm, gen)
    return gen


def load_dtype(arm: ArmSpec, gen: GenerationSpec) -> str:
    """The precision ``arm``'s pipeline loads in: a declared kind's, else the study's."""
    for k in KINDS:
        if k.declared(arm):
            got = k.load_dtype(arm)
            if got is not None:
                return got
    return gen.dtype


@contextlib.contextmanager
def applied(arm: ArmSpec, pipe: Any, device: str) -> Iterator[None]:
    """Every declared kind's change applied to ``pipe`` for one generation (in ``order``)
    and restored afterwards in reverse, also when the generation fails."""
    with contextlib.ExitStack() as stack:
        for k in sorted((k for k in KINDS if k.declared(arm)), key=lambda k: k.order):
            stack.enter_context(k.apply(arm, pipe, device))
        yield


def record_sections(arm: ArmSpec, result: Any, model: ModelSpec) -> dict[str, Any]:
    """The top-level generation-record fields the arm's declared kinds add (a search's
    candidates, a student's weights)."""
    out: dict[str, Any] = {}
    for k in KINDS:
        if k.declared(arm):
            out.update(k.section(arm, result, model))
    return out


def config_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``config.schema.yaml`` (parsed) with every kind's keys as the properties of an arm
    and the precision enum filled in (a copy)."""
    out = copy.deepcopy(schema)
    props = out["properties"]
    props["arms"]["additionalProperties"]["properties"] = {key: copy.deepcopy(s) for k in KINDS
                                                           for key, s in k.schema.items()}
    props["arms"]["description"] = ("control (no change) and treatments; a treatment declares one or more kinds "
                                    "of change: " + ", ".join(KEYS))
    props["generation"]["properties"]["dtype"]["enum"] = list(LOADABLE)
    return out


def record_defs(defs: dict[str, Any]) -> dict[str, Any]:
    """``record.common``'s ``$defs`` with the arm's kind fields, the kinds enum and the
    precision enum filled in from the registry (a copy)."""
    out = copy.deepcopy(defs)
    arm = out["arm"]
    arm["properties"]["kinds"]["items"]["enum"] = [k.name for k in KINDS]
    for k in KINDS:
        for key, s in k.record_schema.items():
            arm["properties"][key] = copy.deepcopy(s)
    out["generation_settings"]["properties"]["dtype"]["enum"] = list(LOADABLE)
    return out

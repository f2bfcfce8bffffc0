"""Arms: the kinds of change a treatment declares against control, one module each.

An arm (``specs.ArmSpec``) declares one or more kinds of change; each kind is one module
of ``arms/kinds/`` defining ``KIND`` (an ``arms.base.ArmKind``): its config keys and
schema, its parsing, its digest and record fields, its check before any model loads, its
apply-and-restore around a generation and its record section. ``arms.registry`` finds
them and runs each operation over an arm's declared kinds, in rank order. ``KINDS``
lists them; ``docs/arms.md`` names each config key's module. A new kind is one
module in ``kinds/`` (plus its test and its row there): the config and record schemas,
an arm's keys, kinds and digest (``registry.declared_keys``, ``declared_kinds``,
``arm_digest``), the arms' check, generation and records all reach it through the registry.

``arms.check`` runs every kind's check (rule ``check_arms``). This package builds on
``pairflow.specs`` only (``config`` builds on it) and, with its kinds, imports neither torch
nor diffusers at import time (planning reads it). Running an arm for one pair (its
pipeline, a search's N candidates) is ``pairflow.generation.armrun``, above ``generate``, imported by
workers only.

Importing this package defers ``torch._dynamo`` in this process until something compiles
(``arms.dynamo``: no arm of a default study compiles, yet diffusers, transformers and
torchvision import dynamo, about 1 s per process); every process that generates imports
it first (``generation.generate`` does). ``PAIRFLOW_DEFER_DYNAMO=0`` turns that off.
"""

from __future__ import annotations

import os

from .base import ArmKind, ParseContext, device
from .check import BUILD_RULE, arms_check_inputs, arms_check_key, check_arms, check_models, write_arms_check
from .dynamo import defer_dynamo
from .kinds.precision import LOADABLE, PRECISIONS, Precision, torch_dtype
from .kinds.search import Verifier, check_verifier, search_seeds, verifier_for
from .kinds.student import arm_model, check_same_latents, latent_signature
from .registry import KEYS, KINDS, applied, effective_generation, kind, load_dtype, record_sections

__all__ = ["BUILD_RULE", "KEYS", "KINDS", "LOADABLE", "PRECISIONS", "ArmKind", "ParseContext", "Precision",
           "Verifier", "applied", "arm_model", "arms_check_inputs", "arms_check_key", "check_arms", "check_models",
           "check_same_latents", "check_verifier", "device", "effective_generation", "kind", "latent_signature",
           "load_dtype", "record_sections", "search_seeds", "torch_dtype", "verifier_for",
           "write_arms_check"]

if os.environ.get("PAIRFLOW_DEFER_DYNAMO", "1") != "0":
    defer_dynamo()

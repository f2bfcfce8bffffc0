"""Kind ``dtype``, and the one declaration of the precisions PairFlow knows.

``PRECISIONS`` is the only list of precision names: the config schema's
``generation/dtype`` and ``arms/<arm>/dtype`` enums and the records' ``dtype`` enum are
filled from it (``LOADABLE``), and ``torch_dtype`` turns a name into what
``DiffusionPipeline.from_pretrained`` takes. A precision is either a floating-point dtype
the pipeline loads in (``float32``, ``float16``, ``bfloat16``) or a weight-only quantised
format (``int8``, ``fp8``: weights stored in 8 bits, computed in ``compute`` after
dequantising). The quantised ones are declared so that configs, messages and records
have one name for them, but are not loadable here yet: loading them needs a quantisation
backend (torchao or optimum-quanto) that PairFlow does not depend on, so the schema
refuses them and ``torch_dtype`` names why.

Kind ``dtype``: the arm's pipeline is loaded (once per worker, like control's) in its
own precision; the arm's effective generation settings name it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...errors import ConfigError
from ...specs import ArmSpec, GenerationSpec
from ..base import ArmKind


@dataclass(frozen=True)
class Precision:
    """One precision: ``name`` as configs and records write it; ``torch`` the torch dtype
    attribute weights load in (for a quantised one: the dtype they are computed in);
    ``quantised``: None, or the weight-only format (``int8``, ``float8_e4m3fn``);
    ``loadable``: whether PairFlow can load a pipeline in it; ``why``: why not."""

    name: str
    torch: str
    quantised: str | None = None
    loadable: bool = True
    why: str = ""


_NO_BACKEND = ("weight-only quantised loading needs a quantisation backend (torchao or optimum-quanto), "
               "which PairFlow does not install or implement yet; use float32, float16 or bfloat16")
PRECISIONS = (
    Precision("float32", "float32"),
    Precision("float16", "float16"),
    Precision("bfloat16", "bfloat16"),
    Precision("int8", "bfloat16", quantised="int8", loadable=False, why=_NO_BACKEND),
    Precision("fp8", "bfloat16", quantised="float8_e4m3fn", loadable=False, why=_NO_BACKEND),
)
LOADABLE = tuple(p.name for p in PRECISIONS if p.loadable)
"""The precision names a config may set (the schemas' enum)."""


def precision(name: str) -> Precision:
    """The declared precision ``name``; ConfigError naming the declared ones otherwise."""
    for p in PRECISIONS:
        if p.name == name:
            return p
    raise ConfigError(f"precision {name!r} is not one PairFlow declares; use one of {list(LOADABLE)}")


def torch_dtype(name: str) -> Any:
    """The ``torch.dtype`` a pipeline loads in for precision ``name``. Raises ConfigError
    for an undeclared or not loadable (quantised) precision, naming why and the fix."""
    import torch  # heavy: only workers load pipelines

    p = precision(name)
    if not p.loadable:
        raise ConfigError(f"precision {name!r} (weight-only {p.quantised}) cannot be loaded: {p.why}")
    return getattr(torch, p.torch)


class Dtype(ArmKind):
    name = "dtype"
    rank = 40
    keys = ("dtype",)
    docs = "another precision the arm's pipeline loads in"
    schema: ClassVar[Mapping[str, Any]] = {"dtype": {"type": "string", "enum": list(LOADABLE),
                        "description": "precision of this arm; unset: generation/dtype"}}
    record_schema: ClassVar[Mapping[str, Any]] = {"dtype": {"type": "string"}}

    def effective(self, arm: ArmSpec, gen: GenerationSpec) -> GenerationSpec:
        return dataclasses.replace(gen, dtype=arm.dtype or gen.dtype)

    def load_dtype(self, arm: ArmSpec) -> str | None:
        return arm.dtype


KIND = Dtype()

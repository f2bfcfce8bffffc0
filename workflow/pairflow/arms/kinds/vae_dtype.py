"""Kind ``vae_dtype``: decode the latents in another precision (e.g. a bfloat16 VAE decode
beside a float32 transformer), the rest of the pipeline unchanged.

Config: ``vae_dtype``, a loadable precision (``precision.LOADABLE``). The pipeline's VAE is
swapped, for the arm's video only, for a copy of it in that precision (made once per
worker and VAE, then reused) and put back in ``finally``. A copy rather than casting the
VAE in place and back: a float32 -> bfloat16 -> float32 round trip would lose the
weights' low bits for every later candidate of the worker. The pipelines cast the
latents to the VAE's dtype before decoding and the frames to float32 after, so only
the decode's precision changes. Checked before any model loads: the model (the arm's or
the study's) has a VAE. Digest and records: ``vae_dtype``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from ...errors import ConfigError
from ...specs import ArmSpec, ModelSpec
from ..base import ArmKind
from .precision import LOADABLE, torch_dtype

_COPIES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
"""A worker's VAE copies: original VAE module -> precision name -> its copy."""


def vae_in(vae: Any, precision: str) -> Any:
    """``vae`` in ``precision``: itself when it already is, else a copy (made once)."""
    dtype = torch_dtype(precision)
    if vae.dtype == dtype:
        return vae
    copies = _COPIES.setdefault(vae, {})
    if precision not in copies:
        copies[precision] = copy.deepcopy(vae).to(dtype)
    return copies[precision]


class VaeDtype(ArmKind):
    name = "vae_dtype"
    rank = 70
    keys = ("vae_dtype",)
    docs = "another precision for the VAE decode only"
    schema: ClassVar[Mapping[str, Any]] = {"vae_dtype": {
        "type": "string", "enum": list(LOADABLE),
        "description": "precision of this arm's VAE decode only (the transformer runs as control's)"}}
    record_schema: ClassVar[Mapping[str, Any]] = {"vae_dtype": {"type": "string"}}

    def check(self, arm: ArmSpec, model: ModelSpec, device: str) -> None:
        m = arm.model or model
        index = m.root / "model_index.json"
        if index.is_file() and "vae" not in json.loads(index.read_text()):
            raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/vae_dtype' is {arm.extra['vae_dtype']!r}, "
                              f"but the model {m.path} has no VAE (no 'vae' in its model_index.json); remove the key "
                              "or use a pipeline with a VAE")

    @contextlib.contextmanager
    def apply(self, arm: ArmSpec, pipe: Any, device: str) -> Iterator[None]:
        vae = pipe.vae
        try:
            pipe.vae = vae_in(vae, arm.extra["vae_dtype"])
            yield
        finally:
            pipe.vae = vae


KIND = VaeDtype()

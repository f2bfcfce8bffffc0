"""Kind ``attention_backend``: another attention kernel (a diffusers attention backend,
``transformer.set_attention_backend``), set for one generation and reset in ``finally``.

Checked before any model loads: the backend is one diffusers can use on this machine
(``attention_backends``); hub kernels, downloaded at run time, are never offered, nor is
a backend the FLOP counter cannot run under (``UNCOUNTABLE``: flex).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from ...errors import ConfigError
from ...specs import ArmSpec, ModelSpec
from ..base import ArmKind

CPU_BACKENDS = ("native", "_native_math")
"""Attention backends usable without an accelerator (torch's own kernels)."""
UNCOUNTABLE = {"flex": "it compiles flex_attention with torch.compile, which cannot run under the FLOP counter's "
                       "dispatch mode (torch: 'non-infra torch dispatch mode present'), so the bulk pass, which "
                       "counts every arm's compute, would fail on it"}
"""Backends refused on every device, and why."""


def attention_backends(device: str) -> list[str]:
    """The diffusers attention backends usable here: on CPU torch's own (``CPU_BACKENDS``);
    on CUDA every backend whose package diffusers finds, except hub kernels (downloaded
    at run time, which jobs never do)."""
    # heavy: only checks and workers import diffusers, never planning
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    out = []
    for b in AttentionBackendName:
        if b.value.endswith("_hub") or b.value in UNCOUNTABLE or (device != "cuda" and b.value not in CPU_BACKENDS):
            continue
        if any(k in b.value for k in ("npu", "xla")):
            continue
        try:
            _check_attention_backend_requirements(b)
        except (RuntimeError, ImportError):
            continue
        out.append(b.value)
    return sorted(out)


def check_attention_backend(arm: ArmSpec, device: str) -> None:
    """Refuse an arm's attention backend that diffusers does not offer on ``device``,
    naming the ones it does."""
    if arm.attention_backend is None:
        return
    usable = attention_backends(device)
    if arm.attention_backend in UNCOUNTABLE:
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/attention_backend' is {arm.attention_backend!r}: "
                          f"{UNCOUNTABLE[arm.attention_backend]}. Usable here: {usable}")
    if arm.attention_backend not in usable:
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/attention_backend' is {arm.attention_backend!r}, "
                          f"which diffusers cannot use on this {device} machine. Usable here: {usable}")


class Attention(ArmKind):
    name = "attention_backend"
    rank = 50
    keys = ("attention_backend",)
    docs = "another attention kernel of diffusers"
    order = 1
    schema: ClassVar[Mapping[str, Any]] = {"attention_backend": {
        "type": "string", "minLength": 1,
        "description": ("a diffusers attention backend (transformer.set_attention_backend) available on this "
                        "device, e.g. native, _native_math")}}
    record_schema: ClassVar[Mapping[str, Any]] = {"attention_backend": {"type": "string"}}

    def check(self, arm: ArmSpec, model: ModelSpec, device: str) -> None:
        check_attention_backend(arm, device)

    @contextlib.contextmanager
    def apply(self, arm: ArmSpec, pipe: Any, device: str) -> Iterator[None]:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry  # heavy: workers only

        backend = _AttentionBackendRegistry._active_backend
        try:
            check_attention_backend(arm, device)
            pipe.transformer.set_attention_backend(arm.attention_backend)
            yield
        finally:
            pipe.transformer.reset_attention_backend()
            if backend is not None:  # diffusers keeps the last backend set as the process default
                _AttentionBackendRegistry.set_active_backend(backend)


KIND = Attention()

"""Exact compute per video: block forwards computed vs skipped, and FLOPs.

Counted, never inferred. Hooks on every transformer block (and every attention module
inside one) see each call; a call is *computed* when any child module of the block ran
inside it and *skipped* when none did, which is what a diffusers cache does when it
returns a cached residual or attention output instead of running the block. FLOPs come
from ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and attention,
exact for the shapes that ran); the transformer's share is read off the counter's total
before and after each transformer call. Counting runs in the bulk (untimed) pass only:
the timed pass measures latency without it.

The counts are hardware-independent: the same arm on the same shapes gives the same
numbers on CPU and GPU, so the compute ratio (treatment FLOPs / control FLOPs) is tested
on CPU (tests/test_compute.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

BLOCK_LISTS = ("blocks", "transformer_blocks", "single_transformer_blocks", "temporal_transformer_blocks")
"""Attribute names of the ``ModuleList``s holding a diffusers video transformer's blocks
(Wan: ``blocks``; CogVideoX, LTX, HunyuanVideo: ``transformer_blocks`` and, for
HunyuanVideo, ``single_transformer_blocks``)."""


@dataclass
class ComputeCount:
    """What one or more pipeline calls did in the transformer. ``latent_shape`` is the
    hidden-states shape of the first transformer call without its batch axis (classifier-
    free guidance batches change only the batch), so two arms that start from the same
    noise show the same shape."""

    blocks_computed: int = 0
    blocks_skipped: int = 0
    attention_computed: int = 0
    attention_skipped: int = 0
    transformer_calls: int = 0
    transformer_flops: int = 0
    total_flops: int = 0
    verifier_flops: int = 0
    generations: int = 0
    latent_shape: list[int] | None = None
    counter: str = "torch.utils.flop_counter.FlopCounterMode"
    _open: dict[int, bool] = field(default_factory=dict, repr=False)

    def asdict(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if not k.startswith("_")}, "work_flops": self.work}

    @property
    def work(self) -> int:
        """The FLOPs the compute ratio compares: transformer work plus any verifier scoring."""
        return self.transformer_flops + self.verifier_flops

    def add(self, other: ComputeCount) -> None:
        """Add ``other``'s counts (the search arm's N generations add up to its cost)."""
        for k in ("blocks_computed", "blocks_skipped", "attention_computed", "attention_skipped",
                  "transformer_calls", "transformer_flops", "total_flops", "verifier_flops", "generations"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        if self.latent_shape is None:
            self.latent_shape = other.latent_shape


def transformer_blocks(transformer: Any) -> list[Any]:
    """The transformer's blocks, in order (every ``BLOCK_LISTS`` ModuleList it has).
    Raises ConfigError when it has none: its compute could not be counted."""
    blocks = [b for name in BLOCK_LISTS for b in (getattr(transformer, name, None) or [])]
    if not blocks:
        raise ConfigError(f"{type(transformer).__name__} has none of the block lists {BLOCK_LISTS}, so its "
                          "compute cannot be counted; "
                         "add its block list's attribute name to pairflow.compute.BLOCK_LISTS")
    return blocks


def _is_attention(module: Any) -> bool:
    return type(module).__name__.endswith("Attention") or type(module).__name__ == "Attention"


@contextlib.contextmanager
def counting(transformer: Any) -> Iterator[ComputeCount]:
    """Count the transformer's block and attention forwards (computed vs skipped) and
    FLOPs for everything run inside the ``with`` block; hooks are removed on exit, even
    on error. Yields the ComputeCount being filled."""
    from torch.utils.flop_counter import FlopCounterMode

    count = ComputeCount()
    handles: list[Any] = []
    flops = FlopCounterMode(display=False)
    start: list[int] = []

    def watch(module: Any, computed: str, skipped: str) -> None:
        key = id(module)

        def pre(_m: Any, _args: Any) -> None:
            count._open[key] = False

        def post(_m: Any, _args: Any, _out: Any) -> None:
            ran = count._open.pop(key, False)
            setattr(count, computed if ran else skipped, getattr(count, computed if ran else skipped) + 1)

        def child_ran(_m: Any, _args: Any) -> None:
            if key in count._open:
                count._open[key] = True

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
        for child in module.children():
            handles.append(child.register_forward_pre_hook(child_ran))

    for block in transformer_blocks(transformer):
        watch(block, "blocks_computed", "blocks_skipped")
        for sub in block.modules():
            if sub is not block and _is_attention(sub):
                watch(sub, "attention_computed", "attention_skipped")

    def t_pre(_m: Any, args: Any, kwargs: Any) -> None:
        start.append(flops.get_total_flops())
        if count.latent_shape is None:
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if hidden is not None and hasattr(hidden, "shape"):
                count.latent_shape = list(hidden.shape[1:])

    def t_post(_m: Any, _args: Any, _out: Any) -> None:
        count.transformer_calls += 1
        count.transformer_flops += flops.get_total_flops() - start.pop()

    handles.append(transformer.register_forward_pre_hook(t_pre, with_kwargs=True))
    handles.append(transformer.register_forward_hook(t_post))
    try:
        with flops:
            yield count
        count.total_flops = int(flops.get_total_flops())
        count.transformer_flops = int(count.transformer_flops)
        count.generations = max(count.generations, 1)
    finally:
        for h in handles:
            h.remove()

"""Seeded, paired generation with a pipeline loaded once per worker process.

The pipeline is loaded with ``DiffusionPipeline.from_pretrained`` (the embedded tiny
model takes the same path as a real checkpoint) and kept in a module-level cache, so a
Parsl worker that runs many candidates loads it once. A treatment's cache is enabled
for its video and disabled in ``finally``: a failure never leaks cache state.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ArmSpec, GenerationSpec, ModelSpec
from .errors import ConfigError

log = logging.getLogger(__name__)

_PIPELINES: dict[tuple[str, str, str], Any] = {}
LOAD_COUNTS: dict[str, int] = {}
"""How many times this process loaded each model (key: model path); goes into records."""


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_pipeline(model: ModelSpec, dtype: str, threads: int) -> Any:
    """Return this process's pipeline for ``model``, loading it on first use.

    Sets torch's intra-op thread count to ``threads`` (outputs depend on it). With
    ``kind: hub-mirror`` the id and revision are resolved from the local mirror at
    ``model.path`` with ``local_files_only``; nothing is downloaded (jobs also run with
    HF_HUB_OFFLINE=1, see ``caches.cache_env``).
    """
    import torch
    from diffusers import DiffusionPipeline

    torch.set_num_threads(threads)
    key = (str(model.path), dtype, _device())
    if key in _PIPELINES:
        return _PIPELINES[key]
    if model.kind == "hub-mirror":
        kwargs: dict[str, Any] = {"cache_dir": str(model.path), "revision": model.revision,
                                  "local_files_only": True}
        source = model.id or ""
    else:
        if not (model.path / "model_index.json").is_file():
            raise ConfigError(f"model path {model.path} has no model_index.json; for the embedded "
                              "model run 'snakemake resources/tiny-wan' (the build rule), otherwise "
                              "point 'model/path' at a diffusers checkpoint directory")
        kwargs, source = {}, str(model.path)
    started = time.perf_counter()
    pipe = DiffusionPipeline.from_pretrained(source, dtype=getattr(torch, dtype), **kwargs)
    pipe.to(_device())
    pipe.set_progress_bar_config(disable=True)
    LOAD_COUNTS[str(model.path)] = LOAD_COUNTS.get(str(model.path), 0) + 1
    log.info("loaded %s in %.2fs (load #%d in pid %d)", source, time.perf_counter() - started,
             LOAD_COUNTS[str(model.path)], os.getpid())
    _PIPELINES[key] = pipe
    return pipe


def cache_config(arm: ArmSpec, pipe: Any) -> Any:
    """Build the diffusers cache config object an arm names, or None for no cache.

    Configs that need the pipeline's current timestep (PAB, FasterCache) get a callback
    bound to ``pipe``; everything else comes from the arm's params.
    """
    if arm.cache_class is None:
        return None
    import diffusers

    cls = getattr(diffusers, arm.cache_class, None)
    if cls is None:
        raise ConfigError(f"arm {arm.name!r}: diffusers {diffusers.__version__} has no {arm.cache_class}")
    params = dict(arm.cache_params)
    fields = getattr(cls, "__dataclass_fields__", {})
    if "current_timestep_callback" in fields:
        params["current_timestep_callback"] = lambda: pipe.current_timestep
    for key in ("spatial_attention_timestep_skip_range", "temporal_attention_timestep_skip_range",
                "cross_attention_timestep_skip_range"):
        if key in params:
            params[key] = tuple(params[key])
    unknown = set(params) - set(fields)
    if unknown:
        raise ConfigError(f"arm {arm.name!r}: {arm.cache_class} has no parameter(s) {sorted(unknown)}; "
                          f"allowed: {sorted(f for f in fields if not f.endswith('callback'))}")
    return cls(**params)


@dataclass(frozen=True)
class GenerationResult:
    """Frames from one candidate and how they were made."""

    frames: Any  # float32 numpy (F, H, W, 3) in [0, 1]
    seconds: float
    peak_rss_mb: float
    device: str
    threads: int


def generate(pipe: Any, prompt: str, seed: int, arm: ArmSpec, gen: GenerationSpec,
             max_sequence_length: int | None = None) -> GenerationResult:
    """Generate one video from a fresh ``torch.Generator`` seeded with ``seed``.

    The arm's cache is enabled for this call only and always disabled afterwards.
    """
    import resource

    import torch

    config = cache_config(arm, pipe)
    kwargs: dict[str, Any] = {}
    if max_sequence_length is not None:
        kwargs["max_sequence_length"] = max_sequence_length
    device = _device()
    if config is not None:
        pipe.transformer.enable_cache(config)
    try:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.inference_mode():
            out = pipe(prompt=prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                       width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                       guidance_scale=gen.guidance, generator=generator, output_type="np", **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    finally:
        if config is not None:
            pipe.transformer.disable_cache()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return GenerationResult(out.frames[0], seconds, peak, device, torch.get_num_threads())


def max_text_tokens(model: ModelSpec) -> int | None:
    """The tiny model's short text length; None (the pipeline default) for real checkpoints."""
    if model.kind != "embedded-tiny":
        return None
    from .tinymodel import MAX_TEXT_TOKENS

    return MAX_TEXT_TOKENS


def model_digests(model: ModelSpec) -> dict[str, str]:
    """xxh3 digest of every file of a local model directory (empty for hub ids)."""
    from .identity import digest_tree

    path = Path(model.path)
    return digest_tree(path) if path.is_dir() else {}

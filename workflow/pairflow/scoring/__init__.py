"""Metric registry: every metric declares its meaning where it is registered.

A metric is a pure function over decoded uint8 frames plus a declared spec (name,
version, kind, direction, range, weights). pyiqa-backed metrics take their FR/NR mode,
direction and range from pyiqa's own table (``DEFAULT_CONFIGS``) instead of retyping it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class MetricSpec:
    """What a score means. ``kind``: 'NR' (per video) or 'FR' (against the control video
    of the same prompt and seed)."""

    name: str
    version: str
    kind: str
    higher_is_better: bool
    range: str
    source: str
    weights: tuple[str, ...] = ()

    def asdict(self) -> dict[str, Any]:
        return asdict(self)


def _pyiqa_spec(name: str, version: str, source: str) -> MetricSpec:
    from pyiqa.default_model_configs import DEFAULT_CONFIGS

    cfg = DEFAULT_CONFIGS[name]
    import pyiqa

    return MetricSpec(name=name, version=f"{version}+pyiqa-{pyiqa.__version__}",
                      kind=cfg["metric_mode"], higher_is_better=not cfg.get("lower_better", False),
                      range=str(cfg.get("score_range", "")), source=source)


def metric_spec(name: str) -> MetricSpec:
    """The declared spec of a registered metric. Raises ConfigError for unknown names."""
    if name == "temporal_flickering":
        from .flicker import SPEC

        return SPEC
    if name in ("psnr", "ssim"):
        return _pyiqa_spec(name, "1", f"pyiqa.create_metric('{name}'), per frame, mean over frames")
    raise ConfigError(f"scorer {name!r} is not registered; known: temporal_flickering, psnr, ssim")


def score(name: str, frames: np.ndarray, reference: np.ndarray | None = None) -> float:
    """Score uint8 (F, H, W, 3) ``frames`` (against ``reference`` for FR metrics)."""
    spec = metric_spec(name)
    if spec.kind == "FR":
        if reference is None:
            raise ConfigError(f"metric {name} is full-reference and needs the control video")
        from .fidelity import fidelity

        return fidelity(name, frames, reference)
    from .flicker import temporal_flickering

    return temporal_flickering(frames)

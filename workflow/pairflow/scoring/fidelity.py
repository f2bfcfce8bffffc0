"""Fidelity of a treatment video to its control (same prompt and seed) through pyiqa.

Each metric is computed frame by frame on RGB in [0, 1] and averaged over frames.
pyiqa metrics are built once per process and reused.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..errors import PairingError


@functools.lru_cache(maxsize=8)
def _metric(name: str) -> Any:
    import pyiqa

    return pyiqa.create_metric(name, device="cpu", as_loss=False)


def fidelity(name: str, frames: np.ndarray, reference: np.ndarray) -> float:
    """Mean over frames of pyiqa metric ``name`` of ``frames`` against ``reference``.

    Both are uint8 (F, H, W, 3) of the same shape; raises PairingError otherwise.
    """
    import torch

    if frames.shape != reference.shape:
        raise PairingError(f"cannot compare videos of shapes {frames.shape} and {reference.shape}")

    def to_tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).permute(0, 3, 1, 2).to(torch.float32) / 255.0

    with torch.inference_mode():
        per_frame = _metric(name)(to_tensor(frames), to_tensor(reference))
    return float(per_frame.double().mean())

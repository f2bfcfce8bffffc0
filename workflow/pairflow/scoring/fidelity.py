"""Fidelity of a treatment video to its control (same prompt and seed) through pyiqa.

PSNR, SSIM, MS-SSIM and LPIPS, each frame by frame on RGB in [0, 1] (pyiqa's defaults:
PSNR on RGB, SSIM and MS-SSIM on YIQ's Y, LPIPS v0.1 on AlexNet), aggregated per video
as the mean over frames. Specs (FR, direction, range) come from pyiqa's own table.
pyiqa metrics are built once per process and reused; frames go through in batches.
Which frames were compared (decoded lossy video, or lossless copies) is written into
the score record by the caller.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..errors import PairingError, ScoringError
from . import MetricSpec, models, pyiqa_spec

MS_SSIM_MIN_SIDE = 11 * 2 ** 4
"""MS-SSIM's five scales halve the frame four times and need an 11-pixel window at the last."""


def spec(name: str) -> MetricSpec:
    needs = models.needs("lpips") if name == "lpips" else ()
    how = {"psnr": "RGB", "ssim": "Y channel", "ms_ssim": "Y channel, 5 scales", "lpips": "v0.1 AlexNet"}[name]
    return pyiqa_spec(name, "1", f"pyiqa.create_metric('{name}') ({how}), per frame against the control's "
                      "frame, mean over frames", needs)


@functools.lru_cache(maxsize=8)
def _metric(name: str) -> Any:
    import pyiqa

    return pyiqa.create_metric(name, device="cpu", as_loss=False)


def fidelity(name: str, frames: np.ndarray, reference: np.ndarray, mirror: str = "", batch: int = 16) -> float:
    """Mean over frames of pyiqa metric ``name`` of ``frames`` against ``reference``.

    Both are uint8 (F, H, W, 3) of the same shape; raises PairingError otherwise, and
    ScoringError for MS-SSIM on frames smaller than ``MS_SSIM_MIN_SIDE``."""
    if frames.shape != reference.shape:
        raise PairingError(f"cannot compare videos of shapes {frames.shape} and {reference.shape}")
    if name == "ms_ssim" and min(frames.shape[1:3]) < MS_SSIM_MIN_SIDE:
        raise ScoringError(f"ms_ssim needs frames at least {MS_SSIM_MIN_SIDE} px on the shorter side (5 scales of "
                           f"an 11-tap window), got {frames.shape[2]}x{frames.shape[1]}; use ssim for smaller videos")
    metric = models.load("lpips", mirror) if name == "lpips" else _metric(name)
    x = models.float_frames(frames) / 255.0
    y = models.float_frames(reference) / 255.0
    idx = np.arange(frames.shape[0])
    per_frame = models.batched(lambda i: metric(x[i], y[i]).reshape(-1), idx, batch)
    return float(per_frame.double().mean())


def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: Any) -> float:
    if reference is None:
        raise PairingError(f"{name} is full-reference and needs the control video")
    return fidelity(name, frames, reference, str(ctx.mirror or ""), ctx.batch)

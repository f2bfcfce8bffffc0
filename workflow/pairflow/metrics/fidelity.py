"""Fidelity of a treatment video to its control (same prompt and seed) through pyiqa.

PSNR and LPIPS, each frame by frame on RGB in [0, 1] (pyiqa's defaults: PSNR on RGB,
LPIPS v0.1 on AlexNet), aggregated per video as the mean over frames. Specs (FR,
direction, range) come from pyiqa's own table. SSIM and MS-SSIM are the standard
definitions in ``structural`` (pyiqa's clamp negative contrast-structure values).

PSNR cap: pyiqa computes ``10 log10(1 / (MSE + 1e-8))``, so identical frames score
exactly ``PSNR_CAP_DB`` = 80 dB instead of infinity, and a video's mean over frames is
finite. A value of 80 means "identical"; nothing else reaches it, but the epsilon
compresses near-identical frames (one 8-bit step on one pixel of a 64x64 RGB frame is
89.0 dB uncapped and 79.5 dB with it), so PSNR above about 70 dB ranks, it does not measure.
pyiqa metrics are built once per process and reused; frames go through in batches.
Which frames were compared (decoded lossy video, or lossless copies) is written into
the score record by the caller.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import numpy as np

from . import MetricSpec, ScoreContext, metric, models, pyiqa_spec

# Lazy on purpose: pyiqa (and torch) are imported inside the scorer: the registry imports this module to
# register it.

PSNR_CAP_DB = 80.0
"""pyiqa's PSNR of identical frames: 10 log10(1 / 1e-8)."""


def build_spec(name: str) -> MetricSpec:
    needs = models.needs("lpips") if name == "lpips" else ()
    how = {"psnr": "RGB; identical frames score 80 dB, the epsilon's cap", "lpips": "v0.1 AlexNet"}[name]
    s = pyiqa_spec(name, "1", f"pyiqa.create_metric('{name}') ({how}), per frame against the control's "
                   "frame, mean over frames", needs)
    # pyiqa's table gives PSNR's typical range; the value it can actually take tops out at the cap
    return replace(s, range=f"{s.range}; at most {PSNR_CAP_DB:g} (identical frames)") if name == "psnr" else s


@functools.lru_cache(maxsize=8)
def _metric(name: str, device: str = "cpu") -> Any:
    import pyiqa

    return pyiqa.create_metric(name, device=device, as_loss=False)


def fidelity(name: str, frames: np.ndarray, reference: np.ndarray, mirror: str = "", batch: int = 16,
             device: str = "cpu") -> float:
    """Mean over frames of pyiqa metric ``name`` of ``frames`` against ``reference``.

    Both are uint8 (F, H, W, 3) of the same shape (``scoring.score`` refuses others with
    a PairingError before calling)."""
    metric = models.load("lpips", mirror, device=device) if name == "lpips" else _metric(name, device)
    x = models.float_frames(frames, device) / 255.0
    y = models.float_frames(reference, device) / 255.0
    idx = np.arange(frames.shape[0])
    per_frame = models.batched(lambda i: metric(x[i], y[i]).reshape(-1), idx, batch)
    return float(per_frame.double().mean())


@metric("psnr", "lpips", spec=build_spec)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    assert reference is not None  # FR: the registry refuses a missing reference before calling
    return fidelity(name, frames, reference, str(ctx.mirror or ""), ctx.batch, ctx.device)

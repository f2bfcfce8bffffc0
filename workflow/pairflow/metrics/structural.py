"""Standard SSIM and MS-SSIM of a treatment video against its control (same prompt and seed).

Channel: BT.709 luma ``Y' = 0.2126 R' + 0.7152 G' + 0.0722 B'`` of the decoded uint8 RGB
frames, as float on a 0-255 scale (not rounded). BT.709 is the matrix every PairFlow video
is encoded with, so this is the encoded luma up to rounding.

SSIM (Wang, Bovik, Sheikh, Simoncelli 2004): 11x11 Gaussian window, sigma 1.5 (the taps of
``scipy.ndimage.gaussian_filter`` at ``truncate=3.5``, normalised), K1 0.01, K2 0.03, L 255,
population (1/N) moments, the map taken over "valid" window positions only (what
scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
use_sample_covariance=False, data_range=255)`` averages after cropping its border), mean
over the map, **no clamp**: unrelated frames score about 0, negatively correlated frames
score below 0; the range is [-1, 1].

MS-SSIM (Wang, Simoncelli, Bovik 2003): five scales with weights (0.0448, 0.2856, 0.3001,
0.2363, 0.1333); at scales 1-4 the mean contrast-structure term ``cs``, at scale 5 the mean
SSIM; between scales a 2x2 mean and subsampling by 2 (Wang's MATLAB ``msssim.m``; an odd
last row or column is dropped). ``MS-SSIM = prod_j sgn(x_j) |x_j|^w_j``: Wang's definition
for non-negative factors; a negative factor (anticorrelated structure at that scale) has no
real fractional power, so its sign is kept instead of clamping it to 0 (pyiqa, pytorch_msssim
and TensorFlow clamp with ``relu``, which maps every anticorrelated pair to 0).

Why our own ~30 lines instead of pyiqa's ``ssim``/``ms_ssim``: pyiqa clamps negative
contrast-structure values to 0 (``F.relu(cs_map)``) and rounds a YIQ (BT.601) luma, so
unrelated frames read 0.08 instead of 0.01 and every partly anticorrelated region inflates
the score. scikit-image has no MS-SSIM and no batched torch path. The test suite checks
both functions against scikit-image and a from-the-paper reference within 1e-4.

Per video: the mean over frames of the per-frame value.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..errors import ScoringError
from . import MetricSpec, ScoreContext, metric

# Lazy on purpose: torch is imported inside the scorers: the registry imports this module to register it.

WINDOW, SIGMA, K1, K2, DATA_RANGE = 11, 1.5, 0.01, 0.03, 255.0
MS_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
MS_SSIM_MIN_SIDE = WINDOW * 2 ** (len(MS_WEIGHTS) - 1)
"""MS-SSIM's five scales halve the frame four times and need an 11-pixel window at the last."""
BT709_LUMA = (0.2126, 0.7152, 0.0722)

_SOURCE = {
    "ssim": "standard SSIM (Wang et al. 2004; Gaussian 11x11, sigma 1.5, K1 0.01, K2 0.03, no clamp) on BT.709 "
            "luma (float, 0-255) of the decoded frames, per frame against the control's frame, mean over frames; "
            "equals scikit-image structural_similarity(gaussian_weights=True, sigma=1.5, "
            "use_sample_covariance=False) on that luma",
    "ms_ssim": "standard MS-SSIM (Wang et al. 2003; 5 scales, weights 0.0448/0.2856/0.3001/0.2363/0.1333, 2x2 mean "
               "downsampling, SSIM window as ssim, no clamp: a negative factor keeps its sign) on BT.709 luma, per "
               "frame against the control's frame, mean over frames",
}


def build_spec(name: str) -> MetricSpec:
    return MetricSpec(name=name, version="2", kind="FR", higher_is_better=True, range="-1, 1", source=_SOURCE[name])


@functools.lru_cache(maxsize=1)
def _taps() -> np.ndarray:
    # scipy.ndimage.gaussian_filter's kernel at sigma 1.5, truncate 3.5: radius 5, 11 taps.
    x = np.arange(WINDOW, dtype=np.float64) - WINDOW // 2
    g = np.exp(-0.5 * (x / SIGMA) ** 2)
    taps: np.ndarray = g / g.sum()
    return taps


def luma(frames: np.ndarray, device: str = "cpu") -> Any:
    """uint8 (F, H, W, 3) RGB → float64 torch tensor (F, 1, H, W) of BT.709 luma, 0-255,
    on ``device`` (the uint8 frames are moved, then converted there)."""
    import torch

    w = torch.tensor(BT709_LUMA, dtype=torch.float64, device=device)
    x = torch.from_numpy(np.array(frames)).to(device).to(torch.float64)  # a copy: decoded frames are read-only
    return (x @ w).unsqueeze(1)


def _filter(x: Any) -> Any:
    """Separable 'valid' Gaussian filtering of (N, 1, H, W)."""
    import torch
    import torch.nn.functional as F

    g = torch.from_numpy(_taps()).to(x.device)
    x = F.conv2d(x, g.view(1, 1, 1, -1))
    return F.conv2d(x, g.view(1, 1, -1, 1))


def _ssim_cs(x: Any, y: Any) -> tuple[Any, Any]:
    """Per image (dim 0): mean SSIM and mean contrast-structure term over valid windows."""
    c1, c2 = (K1 * DATA_RANGE) ** 2, (K2 * DATA_RANGE) ** 2
    mx, my = _filter(x), _filter(y)
    sxx = _filter(x * x) - mx * mx
    syy = _filter(y * y) - my * my
    sxy = _filter(x * y) - mx * my
    cs = (2 * sxy + c2) / (sxx + syy + c2)
    ssim = (2 * mx * my + c1) / (mx * mx + my * my + c1) * cs
    return ssim.mean(dim=(1, 2, 3)), cs.mean(dim=(1, 2, 3))


def ssim_frames(x: Any, y: Any) -> Any:
    """Per-frame standard SSIM of luma tensors (N, 1, H, W), 0-255."""
    return _ssim_cs(x, y)[0]


def ms_ssim_frames(x: Any, y: Any) -> Any:
    """Per-frame standard MS-SSIM of luma tensors (N, 1, H, W), 0-255."""
    import torch
    import torch.nn.functional as F

    w = torch.tensor(MS_WEIGHTS, dtype=torch.float64, device=x.device)
    factors = []
    for j in range(len(MS_WEIGHTS)):
        s, cs = _ssim_cs(x, y)
        factors.append(s if j == len(MS_WEIGHTS) - 1 else cs)
        x, y = F.avg_pool2d(x, 2), F.avg_pool2d(y, 2)
    f = torch.stack(factors, dim=1)
    return (torch.sign(f) * f.abs() ** w).prod(dim=1)


def structural(name: str, frames: np.ndarray, reference: np.ndarray, batch: int = 16, device: str = "cpu") -> float:
    """Mean over frames of ``name`` (``ssim`` or ``ms_ssim``) of ``frames`` against ``reference``.

    Both are uint8 (F, H, W, 3) of one shape (``scoring.score`` refuses others with a
    PairingError before calling); raises ScoringError for frames smaller than the window
    (SSIM) or ``MS_SSIM_MIN_SIDE`` (MS-SSIM)."""
    import torch

    need = MS_SSIM_MIN_SIDE if name == "ms_ssim" else WINDOW
    if min(frames.shape[1:3]) < need:
        raise ScoringError(f"{name} needs frames at least {need} px on the shorter side"
                           + (" (5 scales of an 11-tap window); use ssim for smaller videos" if name == "ms_ssim"
                              else " (an 11-tap window)") + f", got {frames.shape[2]}x{frames.shape[1]}")
    fn = ms_ssim_frames if name == "ms_ssim" else ssim_frames
    with torch.inference_mode():
        x, y = luma(frames, device), luma(reference, device)  # each moved once
        per_frame = torch.cat([fn(x[i:i + batch], y[i:i + batch]) for i in range(0, frames.shape[0], batch)])
    return float(per_frame.mean())


@metric("ssim", "ms_ssim", spec=build_spec)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    assert reference is not None  # FR: the registry refuses a missing reference before calling
    return structural(name, frames, reference, ctx.batch, ctx.device)

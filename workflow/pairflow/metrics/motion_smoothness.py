"""motion_smoothness_proxy: VBench's motion_smoothness procedure with linear frame
interpolation in place of AMT (a proxy; its name and spec say so).

VBench (``vbench/motion_smoothness.py``): drop every odd frame, reconstruct the odd
frames from their even neighbours with the AMT-S frame-interpolation network, and score
``(255 - mean |reconstructed - original|) / 255`` over the odd frames (uint8 frames,
mean absolute difference per frame, then mean over frames). AMT is not available here
(its code and weights are outside every package we install), so each odd frame is
reconstructed as the rounded mean of its two even neighbours. Smooth, slow motion
scores near 1 under both; the proxy penalises fast motion more than AMT would, so its
values are not comparable with published VBench numbers, only between arms.
"""

from __future__ import annotations

import numpy as np

from ..errors import ScoringError
from . import MetricSpec, ScoreContext, metric

SPEC = MetricSpec(name="motion_smoothness_proxy", version="1", kind="NR", higher_is_better=True, range="0, 1",
                  source="PROXY of VBench motion_smoothness: odd frames reconstructed by linear interpolation of "
                  "their even neighbours instead of AMT; (255 - mean |reconstructed - original|) / 255",
                  vbench_reader="opencv")



def motion_smoothness_proxy(frames: np.ndarray) -> float:
    """Score uint8 (F, H, W, 3) frames, F >= 3, in [0, 1]. Raises ScoringError for fewer
    than 3 frames (no odd frame has two neighbours)."""
    if frames.shape[0] < 3:
        raise ScoringError(f"motion_smoothness_proxy needs at least 3 frames, got {frames.shape[0]}")
    even = frames[0::2].astype(np.uint16)
    recon = ((even[:-1] + even[1:] + 1) // 2).astype(np.int16)  # round half up, as uint8 output would
    odd = frames[1::2][: recon.shape[0]].astype(np.int16)
    per_frame = np.abs(recon - odd).reshape(recon.shape[0], -1).mean(axis=1)
    return float((255.0 - per_frame.mean()) / 255.0)


@metric("motion_smoothness_proxy", spec=SPEC)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    return motion_smoothness_proxy(frames)

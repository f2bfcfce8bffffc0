"""VBench temporal_flickering.

Procedure (VBench ``vbench/temporal_flickering.py``, ``cal_score``): read every frame of
the video, take the mean absolute difference of each consecutive pair of frames (as
float32, over all pixels and channels), average over pairs, and normalise as
``(255 - mean_mae) / 255`` so 1.0 is perfectly still. Per video; the study value is the
mean over videos.

VBench applies it only to videos that pass its RAFT static filter. A paired comparison
must use the same subset for both arms, so PairFlow scores every video of both arms
(``scoring/static_filter: none``); the score record and the report say so. Needs no weights.
"""

from __future__ import annotations

import numpy as np

from . import MetricSpec, ScoreContext, metric

SPEC = MetricSpec(name="temporal_flickering", version="1", kind="NR", higher_is_better=True,
                  range="0, 1", source="VBench temporal_flickering: (255 - mean |f[t+1]-f[t]|) / 255; "
                  "all frames; no static filter (same set for both arms)", vbench_reader="opencv")



def temporal_flickering(frames: np.ndarray) -> float:
    """Score uint8 (F, H, W, 3) frames (values 0-255); the score is in [0, 1] and higher
    means less flicker. Differences are absolute: brightening and darkening both count.

    A single-frame video has no pairs and scores 1.0.
    """
    if frames.shape[0] < 2:
        return 1.0
    x = frames.astype(np.int16)
    mae = np.abs(x[1:] - x[:-1]).reshape(frames.shape[0] - 1, -1).mean(axis=1)
    return float((255.0 - mae.mean()) / 255.0)


@metric("temporal_flickering", spec=SPEC)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    return temporal_flickering(frames)

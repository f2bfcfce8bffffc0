"""VBench subject_consistency: DINO ViT-B/16 features of every frame.

Procedure (VBench ``vbench/subject_consistency.py`` with ``utils.dino_transform``):
every frame, shorter side resized to 224 (bilinear, no antialias, no crop), /255,
ImageNet normalisation; DINO ViT-B/16 (``facebookresearch/dino`` ``dino_vitb16``; here
timm's identical architecture loading the same file, with DINO's own position-embedding
interpolation for non-square frames, ``models.dino_pos_embed``) gives the [CLS] feature, L2
normalised. For each frame t > 0: ``(max(0, cos(f_t, f_{t-1})) + max(0, cos(f_t, f_0))) / 2``;
the video's score is the mean over t (VBench's per-video ``video_results``). VBench's
study value weights videos by frame count; PairFlow's unit is the video.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ScoringError
from . import MetricSpec, ScoreContext, metric, models

# Lazy on purpose: torch is imported inside the scorer: the registry imports this module to register it.

SPEC = MetricSpec(name="subject_consistency", version="2", kind="NR", higher_is_better=True, range="0, 1",
                  source="VBench subject_consistency: DINO ViT-B/16 [CLS] per frame (resize 224, ImageNet norm); "
                  "mean over t>0 of (relu cos(f_t,f_t-1) + relu cos(f_t,f_0)) / 2", needs=models.needs("dino"),
                  vbench_reader="decord")



def consistency(features: Any) -> float:
    """VBench's consistency formula on per-frame features ``(F, D)`` (any scale: they are
    L2-normalised here). Raises ScoringError for fewer than two frames."""
    import torch
    import torch.nn.functional as F

    f = F.normalize(torch.as_tensor(features, dtype=torch.float32), dim=-1, p=2)
    if f.shape[0] < 2:
        raise ScoringError(f"consistency needs at least 2 frames, got {f.shape[0]}")
    prev = F.cosine_similarity(f[1:], f[:-1], dim=-1).clamp(min=0.0)
    first = F.cosine_similarity(f[1:], f[:1].expand_as(f[1:]), dim=-1).clamp(min=0.0)
    return float(((prev.double() + first.double()) / 2).mean())


@metric("subject_consistency", spec=SPEC)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    model = models.load("dino", str(ctx.mirror or ""), device=ctx.device)
    x = models.dino_input(models.float_frames(frames, ctx.device))
    return consistency(models.batched(model, x, ctx.batch))

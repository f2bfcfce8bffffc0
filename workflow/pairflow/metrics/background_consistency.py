"""VBench background_consistency: CLIP ViT-B/32 image features of every frame.

Procedure (VBench ``vbench/background_consistency.py`` with ``utils.clip_transform``):
every frame, shorter side resized to 224 (bicubic, no antialias), centre crop 224, /255,
CLIP normalisation; OpenAI CLIP ViT-B/32 ``encode_image`` (float32, or fp16 as VBench on GPUs
under ``scoring/clip_precision``; features then in float32), L2 normalised; then the same
formula as subject_consistency (mean over t > 0 of the clamped cosine similarities to
the previous and the first frame, halved). Per video.
"""

from __future__ import annotations

import numpy as np

from . import MetricSpec, ScoreContext, metric, models
from .subject_consistency import consistency

SPEC = MetricSpec(name="background_consistency", version="1", kind="NR", higher_is_better=True, range="0, 1",
                  source="VBench background_consistency: CLIP ViT-B/32 image features per frame (resize 224 "
                  "bicubic, centre crop, CLIP norm); mean over t>0 of (relu cos(f_t,f_t-1) + relu cos(f_t,f_0)) / 2",
                  needs=models.needs("clip_b32"), vbench_reader="decord")



@metric("background_consistency", spec=SPEC)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    model = models.load("clip_b32", str(ctx.mirror or ""), ctx.clip_precision, ctx.device)
    x = models.clip_input(models.float_frames(frames, ctx.device))
    return consistency(models.batched(model.encode_image, x, ctx.batch))

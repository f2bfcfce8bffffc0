"""VBench aesthetic_quality: the LAION aesthetic predictor on CLIP ViT-L/14 features.

Procedure (VBench ``vbench/aesthetic_quality.py``): every frame through
``clip_transform(224)`` (shorter side 224 bicubic without antialias, centre crop, /255,
CLIP normalisation), OpenAI CLIP ViT-L/14 ``encode_image`` (float32, or fp16 as VBench on
GPUs under ``scoring/clip_precision``; features then in float32), L2 normalised,
then LAION's linear aesthetic head (``sa_0_4_vit_l_14_linear.pth``, ``nn.Linear(768,
1)``, the head VBench downloads; pyiqa's ``laion_aes`` uses a different MLP head). Each
frame's score is divided by 10; the video's score is the mean over frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import MetricSpec, ScoreContext, metric, models

# Lazy on purpose: torch is imported inside the scorer: the registry imports this module to register it.

SPEC = MetricSpec(name="aesthetic_quality", version="1", kind="NR", higher_is_better=True, range="~0, ~1",
                  source="VBench aesthetic_quality: LAION linear aesthetic head on L2-normalised CLIP ViT-L/14 "
                  "image features, per frame / 10, mean over frames",
                  needs=models.needs("clip_l14") + models.needs("aesthetic_head"), vbench_reader="decord")



@metric("aesthetic_quality", spec=SPEC)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    import torch.nn.functional as F

    clip_model = models.load("clip_l14", str(ctx.mirror or ""), ctx.clip_precision, ctx.device)
    head = models.load("aesthetic_head", str(ctx.mirror or ""), device=ctx.device)
    x = models.clip_input(models.float_frames(frames, ctx.device))

    def per_frame(batch: Any) -> Any:
        feats = F.normalize(clip_model.encode_image(batch).float(), dim=-1, p=2)
        return head(feats).squeeze(-1)

    return float((models.batched(per_frame, x, ctx.batch).double() / 10).mean())

"""VBench imaging_quality: MUSIQ (trained on SPAQ) through pyiqa's MUSIQ architecture.

Procedure (VBench ``vbench/imaging_quality.py``, default preprocessing ``longer``):
every frame as float 0-255; if the longer side exceeds 512 the frame is resized so it
is 512 (bilinear, no antialias); /255; MUSIQ in eval mode (``musiq_spaq_ckpt``, the
checkpoint VBench loads) per frame; the video's score is the mean over frames / 100.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import MetricSpec, ScoreContext, metric, models

# Lazy on purpose: torchvision is imported inside the scorer: the registry imports this module to register it.

SPEC = MetricSpec(name="imaging_quality", version="1", kind="NR", higher_is_better=True, range="~0, ~1",
                  source="VBench imaging_quality: pyiqa MUSIQ-SPAQ per frame (longer side limited to 512), "
                  "mean over frames / 100", needs=models.needs("musiq_spaq"), vbench_reader="decord")



def longer_side_512(x: Any) -> Any:
    """VBench's ``transform(images, 'longer')`` on float (F, 3, H, W) 0-255: [0, 1] frames
    whose longer side is at most 512."""
    import torchvision.transforms.functional as TF

    h, w = x.shape[-2:]
    if max(h, w) > 512:
        s = 512.0 / max(h, w)
        x = TF.resize(x, [int(s * h), int(s * w)], antialias=False)
    return x / 255.0


@metric("imaging_quality", spec=SPEC)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    model = models.load("musiq_spaq", str(ctx.mirror or ""), device=ctx.device)
    x = longer_side_512(models.float_frames(frames, ctx.device))
    per_frame = models.batched(lambda b: model(b).reshape(-1), x, ctx.batch)
    return float(per_frame.double().mean() / 100.0)

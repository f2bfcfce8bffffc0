"""VBench dynamic_degree: is the video moving, by RAFT optical flow (per video 0 or 1).

Procedure (VBench ``vbench/dynamic_degree.py``): sample every ``max(1, round(fps / 8))``-th
frame (about 8 fps); for each consecutive pair of sampled frames, pad both to a
multiple of 8 by edge replication (RAFT's ``InputPadder``, 'sintel' mode), run RAFT
large (raft-things weights; here torchvision's port ``raft_large_C_T_V1``) with 20 flow
updates, and take the mean of the top 5 % flow magnitudes (``int(h * w * 0.05)`` values
of the padded frame). The threshold is ``6.0 * min(H, W) / 256`` and the pair count
needed is ``round(4 * n_sampled / 16)`` (Python rounding, as VBench); the video is
dynamic (1.0) when that many pairs exceed the threshold, else 0.0. The study value is
the share of dynamic videos; PairFlow compares arms pair by pair on the 0/1 values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ScoringError
from . import MetricSpec, ScoreContext, metric, models

# Lazy on purpose: torch is imported inside the scorer: the registry imports this module to register it.

MIN_SIDE = 128
"""torchvision's RAFT needs feature maps of at least 16 px, i.e. frames of at least 128 px."""

SPEC = MetricSpec(name="dynamic_degree", version="1", kind="NR", higher_is_better=True, range="0, 1",
                  source="VBench dynamic_degree: RAFT-large flow between frames sampled at ~8 fps, 20 iterations; "
                  "a pair moves when its top-5% flow magnitude mean exceeds 6*min(H,W)/256; dynamic (1) when "
                  "round(4*n/16) pairs move", needs=models.needs("raft_large"), vbench_reader="opencv")



def sample_indices(n_frames: int, fps: int) -> list[int]:
    """VBench's frame sampling for dynamic_degree: every ``max(1, round(fps / 8))``-th frame."""
    return list(range(0, n_frames, max(1, round(fps / 8))))


def pad8(x: Any) -> Any:
    """RAFT's InputPadder ('sintel'): replicate-pad H and W to multiples of 8, split evenly."""
    import torch.nn.functional as F

    h, w = x.shape[-2:]
    ph, pw = (-h) % 8, (-w) % 8
    return F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2], mode="replicate")


def top5_mean(flow: Any) -> Any:
    """Per pair: mean of the largest 5 % flow magnitudes of (N, 2, H, W) flow → (N,)."""
    import torch

    rad = torch.sqrt(flow[:, 0] ** 2 + flow[:, 1] ** 2).flatten(1)
    k = int(rad.shape[1] * 0.05)
    return rad.topk(k, dim=1).values.double().mean(dim=1)


def is_dynamic(pair_scores: list[float], min_side: int, n_sampled: int) -> bool:
    """VBench's ``check_move`` with ``set_params``: threshold and pair count from the
    frame size and the number of sampled frames."""
    thres = 6.0 * (min_side / 256.0)
    count_num = round(4 * (n_sampled / 16.0))
    count = 0
    for s in pair_scores:
        if s > thres:
            count += 1
        if count >= count_num:
            return True
    return False


def pair_motion(frames: np.ndarray, ctx: Any) -> tuple[list[float], int]:
    """Top-5% flow magnitude of every consecutive pair of sampled frames, and how many
    frames were sampled."""
    if min(frames.shape[1:3]) < MIN_SIDE:
        raise ScoringError(f"dynamic_degree needs frames at least {MIN_SIDE} px on the shorter side (torchvision's "
                           f"RAFT correlation pyramid), got {frames.shape[2]}x{frames.shape[1]}")
    model = models.load("raft_large", str(ctx.mirror or ""), device=ctx.device)
    x = models.float_frames(frames[sample_indices(frames.shape[0], ctx.fps)], ctx.device)
    n = x.shape[0]
    if n < 2:
        return [], n
    x = pad8(2 * (x / 255.0) - 1)  # RAFT's own input scaling, [-1, 1]
    pairs = range(n - 1)

    def flow(idx: Any) -> Any:
        i = idx.tolist()
        return top5_mean(model(x[i], x[[j + 1 for j in i]], num_flow_updates=20)[-1])

    import torch

    scores = models.batched(flow, torch.tensor(list(pairs)), ctx.batch)
    return [float(s) for s in scores], n


@metric("dynamic_degree", spec=SPEC)
def score(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: ScoreContext) -> float:
    scores, n = pair_motion(frames, ctx)
    return 1.0 if is_dynamic(scores, min(frames.shape[1:3]), n) else 0.0

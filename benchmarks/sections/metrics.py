"""The ``metrics`` section of ``benchmarks/run.py``. Metric throughput and scorer load time on
this CPU."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import (
    frames,
    median_time,
)

QUICK_METRICS = ("psnr", "ssim", "temporal_flickering", "motion_smoothness_proxy")
"""Metrics without weights: the quick mode measures these only (no 2 GB test mirror)."""


def bench_metrics(runs: int, quick: bool = False, mirror: Path | None = None) -> dict[str, Any]:
    """Every registered metric on 8 frames of 256x256 on this CPU (1 torch thread):
    frames per second, the cold load of its scorer (weight verification included), and
    load time against scoring one video. Weighted metrics use ``mirror`` or a
    random-initialised test mirror (same architectures, so the same cost)."""
    from pairflow.metrics import METRICS, ScoreContext, metric_spec, models, score, weights
    from pairflow.metrics import fidelity as fid

    tmp = None
    if mirror is None and not quick:
        tmp = Path(tempfile.mkdtemp())
        weights.build_test_mirror(tmp)
        mirror = tmp
    f = 8
    a, b = frames(f, 256, 256), frames(f, 256, 256)[::-1].copy()
    if quick:
        a, b = a[:, :64, :64].copy(), b[:, :64, :64].copy()
    ctx = ScoreContext(mirror=mirror, batch=8, fps=8)
    out = {}
    scorer_models = {"subject_consistency": ["dino"], "background_consistency": ["clip_b32"],
                     "aesthetic_quality": ["clip_l14", "aesthetic_head"], "imaging_quality": ["musiq_spaq"],
                     "dynamic_degree": ["raft_large"], "lpips": ["lpips"]}
    for name in (QUICK_METRICS if quick else METRICS):
        spec = metric_spec(name)
        models.clear_cache()
        fid._metric.cache_clear()
        weights._verified.cache_clear()
        t = time.perf_counter()  # cold build of the scorer, as a worker does once (weights verified first)
        for m in scorer_models.get(name, []):
            models.load(m, str(mirror))
        if name == "psnr":  # ssim and ms_ssim (metrics/structural.py) build nothing
            fid._metric(name)
        load = time.perf_counter() - t
        ref = b if spec.kind == "FR" else None
        score(name, a[:3], None if ref is None else ref[:3], ctx)  # warm-up
        s = median_time(lambda n=name, r=ref: score(n, a, r, ctx), runs if not spec.needs else min(runs, 2))
        out[name] = {"kind": spec.kind, "weights": list(spec.needs), "frames": f, "fps_256x256": f / s,
                     "load_s": load, "score_one_video_s": s, "load_over_one_video": load / s}
        print(f"  {name}: {f / s:.1f} fps, load {load:.2f} s, one video {s:.2f} s", flush=True)
    origin = weights.read_lock(mirror).origin if mirror is not None else "none (quick: metrics without weights)"
    if tmp is not None:
        shutil.rmtree(tmp)
    return {"mirror_origin": origin, "threads": 1, "metrics": out}

"""The ``loads`` section of ``benchmarks/run.py``. Model loads: once per worker against once
per candidate, on the tiny model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .common import (
    median_time,
)


def bench_loads(runs: int, quick: bool = False) -> dict[str, Any]:
    """Load once per worker vs once per candidate, on the tiny model (8 candidates)."""
    from pairflow.generation import generate as g
    from pairflow.generation.tinymodel import build_tiny_model
    from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec

    model = ModelSpec("embedded-tiny", build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    gen = GenerationSpec(5, 32, 32, 3, 5.0, 8, "float32", 1) if quick else GenerationSpec(9, 64, 64, 6, 5.0, 8,
                                                                                          "float32", 1)
    arm = ArmSpec("control", None)

    def load() -> Any:
        g._PIPELINES.clear()
        return g.load_pipeline(model, "float32", 1)

    load()  # imports and file cache warm
    load_s = median_time(load, runs)
    pipe = load()
    gen_s = median_time(lambda: g.generate(pipe, "a fox", 0, arm, gen, 64), runs)
    n = 2 if quick else 8
    return {"candidates": n, "load_median_s": load_s, "generate_median_s": gen_s,
            "once_per_worker_s": load_s + n * gen_s, "per_candidate_s": n * (load_s + gen_s),
            "saved_share": 1 - (load_s + n * gen_s) / (n * (load_s + gen_s)),
            "loads_once_per_worker": 1, "loads_per_candidate": n}

"""The ``stats`` section of ``benchmarks/run.py``. Statistics: coverage and false-positive rate
at 3 to 30 prompts, per data shape."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .common import (
    machine,
)


def _lognormal(rng: np.random.Generator, shape: tuple[int, int], skew: float) -> np.ndarray:
    """Standardised lognormal draws (mean 0, sd 1) of population skewness ``skew`` (> 0)."""
    from scipy.optimize import brentq

    v = brentq(lambda s: (math.exp(s * s) + 2) * math.sqrt(math.exp(s * s) - 1) - skew, 1e-4, 3.0)
    x = rng.lognormal(0.0, v, shape)
    return (x - math.exp(v * v / 2)) / math.sqrt((math.exp(v * v) - 1) * math.exp(v * v))


def _cell_diffs(rng: np.random.Generator, reps: int, n: int, shape: str) -> tuple[np.ndarray, float]:
    """Per-prompt values of ``reps`` synthetic studies at ``n`` prompts, and their true mean.
    normal / t3: sd 1 (t3 scaled to sd 1); skew+-k: standardised lognormal of skewness +-k
    (skew-: a few prompts lose a lot, the cache-regression shape); binary: a 0/1 metric on 2
    seeds per prompt, control 0.5 and treatment 0.6 (per-prompt differences in steps of 0.5);
    clustered: 2 seeds per prompt correlated 0.92; latency: log of control / treatment
    latency ratio, lognormal latencies with per-prompt sd 0.3 and run noise 0.05."""
    if shape == "normal":
        return rng.normal(0, 1, (reps, n)), 0.0
    if shape == "t3":
        return rng.standard_t(3, (reps, n)) / math.sqrt(3.0), 0.0
    if shape.startswith("skew"):
        k = float(shape[5:])
        return (1.0 if shape[4] == "+" else -1.0) * _lognormal(rng, (reps, n), k), 0.0
    if shape == "binary":
        c = rng.random((reps, n, 2)) < 0.5
        t = rng.random((reps, n, 2)) < 0.6
        return (t.astype(float) - c.astype(float)).mean(axis=-1), 0.1
    if shape == "clustered":
        prompt = rng.normal(0, 1, (reps, n, 1))
        seeds = math.sqrt(0.92) * prompt + math.sqrt(0.08) * rng.normal(0, 1, (reps, n, 2))
        return seeds.mean(axis=-1), 0.0
    if shape == "latency":
        base = rng.normal(0, 0.3, (reps, n, 2))
        ctrl = np.exp(base + rng.normal(0, 0.05, (reps, n, 2)))
        treat = np.exp(base + math.log(0.5) + rng.normal(0, 0.05, (reps, n, 2)))
        return np.log(ctrl / treat).mean(axis=-1), math.log(2.0)
    raise ValueError(shape)


STAT_SHAPES = ("normal", "t3", "skew+0.5", "skew+1", "skew+2", "skew-1", "skew-2", "skew+4", "binary", "clustered",
               "latency")


def bench_stats(runs: int, quick: bool = False) -> dict[str, Any]:
    """Coverage and false-positive rate of the union test PairFlow reports
    (``inference.union_p``: max of Student t, Hall's skew-corrected t and the exact
    sign-flip test) against the plain t-test it replaced, per shape and prompt count
    (``reps`` synthetic studies per cell). Coverage: the true mean is accepted (studies
    drawn with their true mean); false positive: a null study (shifted to mean 0) is
    rejected; power: a study shifted by 0.8 sd (normal) is rejected."""
    from pairflow.analysis.inference import signflip_min_p, signflip_signs, union_p
    from pairflow.analysis.stats import t_procedure

    reps = 300 if quick else 6000
    rng = np.random.default_rng(20261201)
    rows = []
    t0 = time.perf_counter()
    for shape in (("normal", "skew+2") if quick else STAT_SHAPES):
        for n in ((3, 10) if quick else (3, 4, 5, 7, 10, 15, 30)):
            signs = signflip_signs(n, 2000, 0)
            x, mu = _cell_diffs(rng, reps, n, shape)
            x0, mu0 = _cell_diffs(rng, reps, n, shape)
            x0 = x0 - mu0  # a true null: mean 0
            _lo, _hi, p_t = t_procedure(x - mu, 0.95)
            _lo0, _hi0, p_t0 = t_procedure(x0, 0.95)
            row = {"shape": shape, "prompts": n, "reps": reps,
                   "coverage_union": float(np.mean(union_p(x, mu, signs) >= 0.05)),
                   "coverage_t": float(np.mean(p_t >= 0.05)),
                   "false_positive_union": float(np.mean(union_p(x0, 0.0, signs) < 0.05)),
                   "false_positive_t": float(np.mean(p_t0 < 0.05)),
                   "signflip_min_p": signflip_min_p(n)}
            if shape == "normal":
                _l, _h, p_tp = t_procedure(x + 0.8, 0.95)
                row["power_t"] = float(np.mean(p_tp < 0.05))
                row["power_union"] = float(np.mean(union_p(x + 0.8, 0.0, signs) < 0.05))
            rows.append(row)
            print(f"  {shape} n={n}: coverage union {row['coverage_union']:.3f} t {row['coverage_t']:.3f}; "
                  f"false pos. union {row['false_positive_union']:.3f} t {row['false_positive_t']:.3f}", flush=True)
    return {"machine": {k: v for k, v in machine().items() if k in ("platform", "cpus", "date", "code")},
            "rows": rows, "level": 0.95, "procedure": "union", "seconds": time.perf_counter() - t0}

"""The ``power`` section of ``benchmarks/run.py``. Planning: the power that "prompts needed"
and "about N prompts would decide it" deliver at the N they state, by an independent
simulation of fresh studies from the true population (issue 39)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .common import machine
from .stats import _cell_diffs

ALPHA = 0.05
TARGET = 0.8


def _delivered(rng: np.random.Generator, shape: str, n: int, truth: float, boundary: float, reps: int) -> float:
    """Share of ``reps`` fresh studies of ``n`` prompts from ``shape`` (sd 1) shifted to mean
    ``truth`` whose union test (``inference.union_p``, the full procedure) rejects
    ``boundary`` at ALPHA with the mean on the truth's side."""
    from pairflow.analysis.inference import signflip_signs, union_p

    out = []
    for lo in range(0, reps, 500):  # chunks: (reps x n) at n = 2000 stays small
        x, mu = _cell_diffs(rng, min(500, reps - lo), n, shape)
        x = x - mu + truth
        p = union_p(x, boundary, signflip_signs(n, 200, 0))
        out.append((p < ALPHA) & (np.sign(truth - boundary) * (x.mean(axis=1) - boundary) > 0))
    return float(np.mean(np.concatenate(out)))


KEYS = ("ttest", "pilot", "after")
"""The stated N compared: the t-test at the pilot's SD (before issue 39), the simulation on
the pilot's own shape (``model="pilot"``, issue 39's first plan) and the plan as shipped
(``model="stressed"``: the larger of that and the pilot's SD with a loss tail of skewness 2)."""
BANDS = ((6, 15), (16, 40), (41, 100), (101, 2000))


def _stated(cell: Any, truth: float, boundary: float, start: int, now: int | None) -> dict[str, int | None]:
    """Each of ``KEYS``' stated N for one pilot."""
    from pairflow.analysis.inference import plan_prompts, required_prompts

    ttest = required_prompts(cell.sd, abs(truth - boundary), 1 - ALPHA, TARGET, limit=2000)
    return {"ttest": None if ttest is None else max(ttest, start),
            **{key: plan_prompts(cell, truth, boundary, ALPHA, TARGET, start=start, now=now, model=model).prompts
               for key, model in (("pilot", "pilot"), ("after", "stressed"))}}


def bench_power(runs: int, quick: bool = False) -> dict[str, Any]:
    """Per family (normal, t3, skew toward losses, skew toward gains) and pilot size:
    pilots drawn from the family; each pilot's stated N (``KEYS``); the power fresh
    studies of that N from the true family deliver, averaged over pilots, and per band of
    N (``BANDS``). ``needed``: the planning table's question (true difference 0,
    non-inferiority at margin 0.5 sd; fresh-study power cached per (family, N)).
    ``decide``: an inconclusive pilot (true difference 0, margin 0.5 sd), truth set to its
    estimate, the boundary its margin; N above the pilot's own count."""
    from pairflow.analysis.inference import Cell, min_prompts, signflip_signs

    pilots = 8 if quick else 40
    reps = 300 if quick else 600
    shapes = ("normal", "skew-2") if quick else ("normal", "t3", "skew-1", "skew-2", "skew+2")
    sizes = (8,) if quick else (8, 15)
    questions = ("needed",) if quick else ("needed", "decide")
    margin = 0.5
    rng = np.random.default_rng(20261203)
    rows = []
    t0 = time.perf_counter()
    for shape in shapes:
        cache: dict[int, float] = {}
        for n in sizes:
            for question in questions:
                got: dict[str, list[tuple[int, float]]] = {k: [] for k in KEYS}
                over = dict.fromkeys(KEYS, 0)
                used = 0
                while used < pilots:
                    x, mu = _cell_diffs(rng, 1, n, shape)
                    cell = Cell(x[0] - mu, signflip_signs(n, 2000, 0))
                    truth = 0.0 if question == "needed" else cell.mean
                    lo, _hi, _why = cell.interval(1 - ALPHA)
                    if question == "decide" and (lo is None or lo > -margin or cell.mean <= -margin):
                        continue  # only inconclusive pilots (estimate inside the margin) are told "about N"
                    start = min_prompts(ALPHA, cell.quantised)
                    if question == "decide":
                        start = max(start, n + 1)
                    used += 1
                    for key, N in _stated(cell, truth, -margin, start, n if question == "decide" else None).items():
                        if N is None:
                            over[key] += 1
                        elif question == "needed":
                            if N not in cache:
                                cache[N] = _delivered(rng, shape, N, truth, -margin, reps)
                            got[key].append((N, cache[N]))
                        else:
                            got[key].append((N, _delivered(rng, shape, N, truth, -margin, reps)))
                row: dict[str, Any] = {"shape": shape, "pilot_prompts": n, "question": question, "pilots": pilots,
                                       "reps": reps, "margin_sd": margin}
                for key in KEYS:
                    ns = [N for N, _p in got[key]]
                    row[f"{key}_power"] = float(np.mean([p for _N, p in got[key]])) if got[key] else None
                    row[f"{key}_median_n"] = float(np.median(ns)) if ns else None
                    row[f"{key}_mean_n"] = float(np.mean(ns)) if ns else None
                    row[f"{key}_over_cap"] = over[key]
                    row[f"{key}_bands"] = {f"{a}-{b}": {"pilots": len(ps), "power": float(np.mean(ps)) if ps else None}
                                           for a, b in BANDS for ps in [[p for N, p in got[key] if a <= N <= b]]}
                rows.append(row)
                print(f"  {shape} n={n} {question}: " + "; ".join(
                    f"{k} {row[f'{k}_power']:.3f} (median N {row[f'{k}_median_n']})" for k in KEYS), flush=True)
    return {"machine": {k: v for k, v in machine().items() if k in ("platform", "cpus", "date", "code")},
            "rows": rows, "alpha": ALPHA, "target": TARGET, "seconds": time.perf_counter() - t0,
            "se_per_row": math.sqrt(TARGET * (1 - TARGET) / (pilots * reps))}

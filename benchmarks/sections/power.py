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


def _before_after(cell: Any, truth: float, boundary: float, start: int, now: int | None) -> tuple[int | None, int | None]:
    """(the t-test's N as PairFlow stated it before issue 39, the simulated plan's N)."""
    from pairflow.analysis.inference import plan_prompts, required_prompts

    before = required_prompts(cell.sd, abs(truth - boundary), 1 - ALPHA, TARGET, limit=2000)
    before = None if before is None else max(before, start)
    return before, plan_prompts(cell, truth, boundary, ALPHA, TARGET, start=start, now=now).prompts


def bench_power(runs: int, quick: bool = False) -> dict[str, Any]:
    """Per family (normal, t3, skew toward losses, skew toward gains) and pilot size:
    pilots drawn from the family; each pilot's stated N before (t-test at the pilot's SD)
    and after (``inference.plan_prompts``); the power fresh studies of that N from the
    true family deliver, averaged over pilots. ``needed``: the planning table's question
    (true difference 0, non-inferiority at margin 0.5 sd). ``decide``: an inconclusive
    pilot (true difference 0, margin 0.5 sd), truth set to its estimate, the boundary its
    margin; N above the pilot's own count."""
    from pairflow.analysis.inference import Cell, min_prompts, signflip_signs

    pilots = 6 if quick else 120
    reps = 200 if quick else 1000
    shapes = ("normal", "skew-2") if quick else ("normal", "t3", "skew-1", "skew-2", "skew+2")
    sizes = (8,) if quick else (6, 10, 20)
    margin = 0.5
    rng = np.random.default_rng(20261203)
    rows = []
    t0 = time.perf_counter()
    for shape in shapes:
        for n in sizes:
            for question in ("needed", "decide"):
                got: dict[str, list[float]] = {"before": [], "after": []}
                small: dict[str, list[float]] = {"before": [], "after": []}
                ns: dict[str, list[int]] = {"before": [], "after": []}
                over = {"before": 0, "after": 0}
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
                    for key, N in zip(("before", "after"), _before_after(cell, truth, -margin, start,
                                                                          n if question == "decide" else None),
                                      strict=True):
                        if N is None:
                            over[key] += 1
                            continue
                        power = _delivered(rng, shape, N, truth, -margin, reps)
                        got[key].append(power)
                        ns[key].append(N)
                        if N <= 15:
                            small[key].append(power)
                row: dict[str, Any] = {"shape": shape, "pilot_prompts": n, "question": question, "pilots": pilots,
                                       "reps": reps, "margin_sd": margin}
                for key in ("before", "after"):
                    row[f"{key}_power"] = float(np.mean(got[key])) if got[key] else None
                    row[f"{key}_power_n_le_15"] = float(np.mean(small[key])) if small[key] else None
                    row[f"{key}_share_n_le_15"] = len(small[key]) / pilots
                    row[f"{key}_median_n"] = float(np.median(ns[key])) if ns[key] else None
                    row[f"{key}_over_cap"] = over[key]
                rows.append(row)
                print(f"  {shape} n={n} {question}: power before {row['before_power']:.3f} (median N "
                      f"{row['before_median_n']}) after {row['after_power']:.3f} (median N {row['after_median_n']})",
                      flush=True)
    return {"machine": {k: v for k, v in machine().items() if k in ("platform", "cpus", "date", "code")},
            "rows": rows, "alpha": ALPHA, "target": TARGET, "seconds": time.perf_counter() - t0,
            "se_per_row": math.sqrt(TARGET * (1 - TARGET) / (pilots * reps))}

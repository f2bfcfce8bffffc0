"""The tail statement against the shapes caches have (issue 39): how often a cell reads
"better" when the treatment is not, and whether each such cell carries the outlier flag or
sits beside a tail bound that admits the breakage.

Families of per-prompt differences (treatment - control, better-direction units; every
family's true mean is 0, so a "better" verdict is false):

* ``normal``, ``t3`` (sd 1): the flag's noise;
* ``break<pi>``: most prompts change little, N(pi * B, 1), and a share ``pi`` breaks by
  ``B`` = 6 sd (issue 39: "10-20% of prompts losing a lot");
* ``skew-<k>``: a standardised lognormal of skewness -k (a few prompts lose a lot).

False "better": the union test (``inference.union_p``, what a cell's verdict reads) rejects
mean 0 at 0.05 with a positive mean. The breakage: the family's true share of prompts
whose loss exceeds the margin (``--margin`` sd), from 400000 draws. Admitted: the
Clopper-Pearson upper bound (``tail.cp_upper``; also the one-sided 95% bound for contrast)
is at least that share. Flagged: ``tail.outlying``'s robust z above ``tail.OUTLIER_Z``.

    .venv/bin/python benchmarks/tail_bench.py [--reps 10000] [--out benchmarks/tail_bench.json]

prints the Markdown table of BENCHMARKS.md's "Tails" section.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from pairflow.analysis.inference import signflip_signs, union_p  # noqa: E402
from pairflow.analysis.tail import MIN_PROMPTS_FLAG, OUTLIER_Z, robust_z  # noqa: E402

FAMILIES = ("normal", "t3", "break0.1", "break0.2", "skew-2", "skew-6")
PROMPTS = (7, 10, 15, 30)
BREAK = 6.0
"""How far a breaking prompt falls, in sd of the prompts that change little."""


def _lognormal(rng: np.random.Generator, shape: tuple[int, int], skew: float) -> np.ndarray:
    """Standardised lognormal draws (mean 0, sd 1) of population skewness ``skew`` (> 0)."""
    from scipy.optimize import brentq

    v = brentq(lambda s: (math.exp(s * s) + 2) * math.sqrt(math.exp(s * s) - 1) - skew, 1e-4, 3.0)
    x = rng.lognormal(0.0, v, shape)
    return np.asarray((x - math.exp(v * v / 2)) / math.sqrt((math.exp(v * v) - 1) * math.exp(v * v)))


def draw(rng: np.random.Generator, reps: int, n: int, family: str) -> np.ndarray:
    """(reps, n) per-prompt differences of ``family`` (true mean 0)."""
    if family == "normal":
        return rng.normal(0.0, 1.0, (reps, n))
    if family == "t3":
        return rng.standard_t(3, (reps, n)) / math.sqrt(3.0)
    if family.startswith("skew-"):
        return -_lognormal(rng, (reps, n), float(family[5:]))
    if family.startswith("break"):
        pi = float(family[5:])
        return rng.normal(pi * BREAK, 1.0, (reps, n)) - BREAK * (rng.random((reps, n)) < pi)
    raise ValueError(family)


def true_share(family: str, margin: float) -> float:
    """The family's share of prompts whose loss (-difference) exceeds ``margin``."""
    return float(np.mean(-draw(np.random.default_rng(9), 1, 400_000, family)[0] > margin))


def cp_upper_rows(k: np.ndarray, n: int, confidence: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bounds at ``confidence`` for counts ``k`` of ``n``."""
    from scipy.stats import beta

    return np.asarray(np.where(k >= n, 1.0, beta.ppf(confidence, k + 1, np.maximum(n - k, 1))))


def cell(rng: np.random.Generator, family: str, n: int, reps: int, margin: float, share: float,
         level: float = 0.95) -> dict[str, Any]:
    """One (family, prompts) cell of the table."""
    x = draw(rng, reps, n, family)
    better = (union_p(x, 0.0, signflip_signs(n, 2000, 0)) < 1 - level) & (x.mean(axis=1) > 0)
    loss = -x
    flag = (robust_z(loss) > OUTLIER_Z) if n >= MIN_PROMPTS_FLAG else np.zeros(reps, bool)
    k = np.sum(loss > margin, axis=1)
    admit = cp_upper_rows(k, n, 1 - (1 - level) / 2) >= share  # the two-sided interval's upper end
    admit95 = cp_upper_rows(k, n, level) >= share  # a one-sided 95% bound, for contrast
    nb = int(better.sum())

    def among(v: np.ndarray) -> float | None:
        return float(v[better].mean()) if nb else None

    return {"family": family, "prompts": n, "reps": reps, "true_share": share, "false_better": nb / reps,
            "flag_rate": float(flag.mean()), "flagged_among_false_better": among(flag),
            "admitted_among_false_better": among(admit), "admitted_one_sided_95": among(admit95),
            "goal_met": among(flag | admit), "goal_met_one_sided_95": among(flag | admit95), "false_better_n": nb}


def run(reps: int, margin: float, seed: int = 20261207, prompts: tuple[int, ...] = PROMPTS,
        families: tuple[str, ...] = FAMILIES) -> list[dict[str, Any]]:
    """Every (family, prompts) cell, seeded."""
    rng = np.random.default_rng(seed)
    rows = []
    for f in families:
        share = true_share(f, margin)
        for n in prompts:
            rows.append(cell(rng, f, n, reps, margin, share))
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table for BENCHMARKS.md."""
    out = ["| family | prompts | true share losing > margin | false 'better' | flag rate (all cells) | "
           "flagged (of false 'better') | bound admits (two-sided 95% CP) | one-sided 95% bound admits | "
           "goal: flagged or admitted |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['family']} | {r['prompts']} | {r['true_share']:.3f} | {_pct(r['false_better'])} | "
                   f"{_pct(r['flag_rate'])} | {_pct(r['flagged_among_false_better'])} | "
                   f"{_pct(r['admitted_among_false_better'])} | {_pct(r['admitted_one_sided_95'])} | "
                   f"{_pct(r['goal_met'])} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10_000)
    ap.add_argument("--margin", type=float, default=1.0, help="margin in sd of the prompts that change little")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "tail_bench.json")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = run(a.reps, a.margin)
    a.out.write_text(json.dumps({"reps": a.reps, "margin": a.margin, "outlier_z": OUTLIER_Z, "break": BREAK,
                                 "seconds": time.perf_counter() - t0, "rows": rows}, indent=1) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()

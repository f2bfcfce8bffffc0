"""Power and size of the tests of a 0/1 metric's mean difference at few prompts (issue 39):
the union test PairFlow used (``inference.union_p``: t, Hall's t and the exact sign-flip
test), McNemar's exact conditional test, and the exact unconditional paired-proportions
test now used (``analysis.exact``). Exact by enumeration of every outcome (no simulation
noise, so no seed): ``.venv/bin/python benchmarks/exact_power.py``."""

from __future__ import annotations

import numpy as np

from pairflow.analysis import exact
from pairflow.analysis.inference import signflip_signs, union_p

ALPHA = 0.05
ALTERNATIVES = ((0.5, 0.0), (0.6, 0.05), (0.4, 0.05), (0.3, 0.0))
"""(p+, p-): the probability a prompt gains 1, loses 1."""


def tests(n: int) -> dict[str, object]:
    signs = signflip_signs(n, 2 ** n, 0)

    def union(b: int, c: int) -> bool:
        x = np.array([[1.0] * b + [-1.0] * c + [0.0] * (n - b - c)])
        return bool(union_p(x, 0.0, signs)[0] < ALPHA)

    return {"union (before)": union, "McNemar exact": lambda b, c: exact.mcnemar_exact(b, c) < ALPHA,
            "exact unconditional (now)": lambda b, c: exact.two_sided(b, c, n, 0.0) < ALPHA}


def main() -> None:
    print("| prompts | test | size (max over p+ = p-) | " + " | ".join(f"power p+={a}, p-={b}" for a, b in ALTERNATIVES)
          + " |")
    print("|---|---|---|" + "---|" * len(ALTERNATIVES))
    for n in (6, 7):
        for name, rejects in tests(n).items():
            size = max(exact.rejection_rate(n, q, q, rejects) for q in np.linspace(0.01, 0.5, 50))  # type: ignore[arg-type]
            power = [exact.rejection_rate(n, a, b, rejects) for a, b in ALTERNATIVES]  # type: ignore[arg-type]
            print(f"| {n} | {name} | {size:.3f} | " + " | ".join(f"{p:.3f}" for p in power) + " |")


if __name__ == "__main__":
    main()

"""The Markdown study table: every cell a paired estimate with its interval.

Imports without torch.
"""

from __future__ import annotations

from typing import Any


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def markdown(stats: dict[str, Any], title: str, provenance: dict[str, str]) -> str:
    """Render ``stats`` (from ``stats.analyse``) as Markdown, with the manifest roots
    every number came from."""
    lines = [f"# {title}", "", f"Estimand: {stats['estimand']}.",
             f"Intervals: {stats['level']:.0%} bootstrap, {stats['resamples']} resamples, seed {stats['seed']}. "
             f"Missing pairs: {stats['missing_policy']}.", ""]
    metric_names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    head = ["arm", "pairs", "latency ctrl/treat (s, median)", "speedup [CI]"] + [
        f"{n} Δ or value [CI] (p_holm)" for n in metric_names]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in stats["comparisons"]:
        by = {m["metric"]: m for m in c["metrics"]}
        cells = [c["treatment"], str(c["n_pairs"]),
                 f"{_fmt(c['latency']['control_median_s'], 3)} / {_fmt(c['latency']['treatment_median_s'], 3)}",
                 f"{c['speedup']['geomean']:.3f}× [{c['speedup']['ci'][0]:.3f}, {c['speedup']['ci'][1]:.3f}]"]
        for n in metric_names:
            m = by.get(n)
            if m is None:
                cells.append("")
                continue
            point = m["diff"] if m["diff"] is not None else m["treatment_mean"]
            p = f" (p={_fmt(m.get('p_holm'), 3)})" if m.get("p_holm") is not None else ""
            cells.append(f"{_fmt(point)} [{_fmt(m['ci'][0])}, {_fmt(m['ci'][1])}]{p}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for c in stats["comparisons"]:
        for f in c["flags"] + c["notes"]:
            lines.append(f"- **{c['treatment']}**: {f}")
    lines += ["", "Latency pass: " + ", ".join(sorted({p for c in stats["comparisons"] for p in c["latency"]["pass"]}))
              + " (median of repeated batch-one runs in the exclusive timed pass, after warm-up; "
              "bulk generation times are never reported).",
              "Fidelity metrics (FR) compare each treatment video with its control decoded from the encoded files; "
              "temporal_flickering follows VBench with no static filter (same videos for both arms).",
              "", "## Provenance", ""]
    lines += [f"- `{name}`: `{root}`" for name, root in sorted(provenance.items())]
    return "\n".join(lines) + "\n"

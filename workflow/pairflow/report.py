"""The Markdown study table: every cell a paired estimate with its interval.

Imports without torch.
"""

from __future__ import annotations

from typing import Any


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def table(stats: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The paper-style table: a header and one row per treatment, every cell a paired
    estimate with its interval."""
    metric_names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    head = ["arm", "pairs", "latency ctrl/treat (s, median)", "speedup [CI]"] + [
        f"{n} Δ or value [CI] (p_holm)" for n in metric_names]
    rows = []
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
        rows.append(cells)
    return head, rows


def _notes(stats: dict[str, Any]) -> list[str]:
    notes = [f"{c['treatment']}: {f}" for c in stats["comparisons"] for f in c["flags"] + c["notes"]]
    passes = ", ".join(sorted({p for c in stats["comparisons"] for p in c["latency"]["pass"]}))
    setups = [c.get("scoring", {}) for c in stats["comparisons"]]
    frames = sorted({f for sc in setups for f in sc.get("compared_frames", [])})
    filters = sorted({f for sc in setups for f in sc.get("static_filter", [])}) or ["none"]
    builds = sorted({str(sc.get("scorer_build")) for sc in setups})
    origins = sorted({str(sc.get("weights_origin")) for sc in setups if sc.get("weights_origin")})
    metrics = {m["metric"] for c in stats["comparisons"] for m in c["metrics"]}
    latency = (f"Latency pass: {passes} (median of repeated batch-one runs in the exclusive timed pass, after "
               "warm-up; bulk generation times are never reported).")
    fidelity = ("Fidelity metrics (FR) compare each treatment video with its control, frame by frame, on: "
                + ("; ".join(frames) or "decoded encoded videos") + ".")
    flicker = (f"temporal_flickering static filter: {', '.join(filters)} (VBench scores only videos its RAFT "
               "filter calls static; 'none': every video of both arms; 'intersection': only pairs whose two videos "
               "are both static; either way both arms use the same subset).")
    build = (f"Both arms of every pair were scored by one scorer build ({', '.join(builds)}; same code, weights, "
             "device, precision and process layout).")
    out = [*notes, latency, fidelity, flicker, build]
    if "motion_smoothness_proxy" in metrics:
        out.append("motion_smoothness_proxy is a PROXY of VBench motion_smoothness: linear frame interpolation "
                   "replaces AMT, so values compare arms but not published VBench numbers.")
    if "random-init" in origins:
        out.append("WARNING: scorer weights come from a random-initialised test mirror; weight-based scores "
                   "mean nothing about quality.")
    return out


def markdown(stats: dict[str, Any], title: str, provenance: dict[str, str]) -> str:
    """Render ``stats`` (from ``stats.analyse``) as Markdown, with the manifest roots
    every number came from."""
    head, rows = table(stats)
    lines = [f"# {title}", "", f"Estimand: {stats['estimand']}.",
             f"Intervals: {stats['level']:.0%} bootstrap, {stats['resamples']} resamples, seed {stats['seed']}. "
             f"Missing pairs: {stats['missing_policy']}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [""] + [f"- {n}" for n in _notes(stats)] + ["", "## Provenance", ""]
    lines += [f"- `{name}`: `{root}`" for name, root in sorted(provenance.items())]
    return "\n".join(lines) + "\n"


def html(stats: dict[str, Any], title: str, provenance: dict[str, str]) -> str:
    """The same content as ``markdown`` as a standalone HTML page (for Snakemake's report)."""
    from html import escape

    head, rows = table(stats)
    parts = [f"<html><head><meta charset='utf-8'><title>{escape(title)}</title><style>"
             "body{font-family:sans-serif;margin:1em} td,th{border:1px solid #ccc;padding:4px 8px}"
             "table{border-collapse:collapse} code{font-size:90%}</style></head><body>",
             f"<h1>{escape(title)}</h1><p>Estimand: {escape(stats['estimand'])}.</p>",
             f"<p>Intervals: {stats['level']:.0%} bootstrap, {stats['resamples']} resamples, seed {stats['seed']}. "
             f"Missing pairs: {escape(stats['missing_policy'])}.</p><table><tr>",
             "".join(f"<th>{escape(h)}</th>" for h in head), "</tr>",
             *("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows),
             "</table><ul>", *(f"<li>{escape(n)}</li>" for n in _notes(stats)), "</ul><h2>Provenance</h2><ul>",
             *(f"<li><code>{escape(k)}</code>: <code>{escape(v)}</code></li>" for k, v in sorted(provenance.items())),
             "</ul></body></html>"]
    return "".join(parts) + "\n"

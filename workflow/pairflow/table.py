"""The Markdown study table: every cell a paired estimate with its interval.

Imports without torch.
"""

from __future__ import annotations

from typing import Any

from .recordtypes import ComputeSummary, MetricResult, StudyStats
from .stats import NO_EFFECT


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def direction(higher_is_better: bool) -> str:
    """How a metric's numbers read, for headers and plot titles."""
    return "higher is better" if higher_is_better else "lower is better"


UNITS = {"psnr": "dB"}
"""Metrics whose values carry a unit (pyiqa's metric table records direction and range,
not units); every other metric is a unitless score."""


def metric_header(name: str, kind: str, higher_is_better: bool) -> str:
    """A metric column's header: what the number is, its unit, its interval and which way
    is better, e.g. ``ssim vs control [CI], higher is better``."""
    unit = f" ({UNITS[name]})" if name in UNITS else ""
    what = f"{name} vs control{unit}" if kind == "FR" else f"{name}: treatment − control{unit}"
    return f"{what} [CI], {direction(higher_is_better)}"


def column_decimals(ms: list[MetricResult]) -> int:
    """One fixed number of decimals for a column: two significant digits of its narrowest
    interval's half-width (1 to 6), so every estimate in the column reads alike and no
    digit is shown that the interval does not support."""
    import math

    halves = [(hi - lo) / 2 for lo, hi in (m["ci"] for m in ms) if lo is not None and hi is not None and hi > lo]
    if not halves:
        return 4
    return max(1, min(6, 1 - math.floor(math.log10(min(halves)))))


def estimate(m: MetricResult, d: int) -> str:
    """A metric's point estimate (difference, or value for FR metrics) and its interval at
    ``d`` fixed decimals: ``0.0123 [0.0101, 0.0145]``."""
    point = m["diff"] if m["diff"] is not None else m["treatment_mean"]
    lo, hi = m["ci"][0], m["ci"][1]
    out = "n/a" if point is None else f"{point:.{d}f}"
    return out + (" [no CI]" if lo is None or hi is None else f" [{lo:.{d}f}, {hi:.{d}f}]")


def cell(m: MetricResult, level: float, decimals: int | None = None) -> str:
    """One metric's cell: the paired difference (value, for FR metrics) with its interval
    at ``decimals`` fixed decimals (default: the cell's own), the t-test p and its Holm
    adjustment, the win rate in the metric's direction, and a warning where the prompt
    count is too small for a distribution-free test."""
    out = estimate(m, column_decimals([m]) if decimals is None else decimals)
    if m.get("p_value") is not None:
        out += f" p={_fmt(m['p_value'], 2)}, Holm {_fmt(m.get('p_holm'), 2)}"
    if m.get("win_rate") is not None:
        out += f", wins {m['win_rate']:.0%}"
    n, min_p = m.get("n_prompts"), m.get("signflip_min_p")
    if m.get("p_value") is not None and n is not None and min_p is not None and min_p > 1 - level:
        out += f"; n={n}: smallest attainable sign-flip p = {min_p:.3g}"
    return out


def table(stats: StudyStats) -> tuple[list[str], list[list[str]]]:
    """The paper-style table: a header and one row per treatment, every cell a paired
    estimate with its interval."""
    metric_names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    hib = {m["metric"]: m["higher_is_better"] for c in stats["comparisons"] for m in c["metrics"]}
    kinds = {m["metric"]: m["kind"] for c in stats["comparisons"] for m in c["metrics"]}
    head = ["arm", "pairs", "latency ctrl / treat (s, geometric mean)", "speedup [CI], higher is faster",
            "compute ratio [CI], lower is cheaper", "repeat CV ctrl / treat (median; pairs over max)"] + [
        metric_header(n, kinds[n], hib[n]) for n in metric_names]
    decimals = {n: column_decimals([m for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == n])
                for n in metric_names}
    rows = []
    for c in stats["comparisons"]:
        by = {m["metric"]: m for m in c["metrics"]}
        lat = c["latency"]
        # An arm whose videos equal control's bit for bit, or whose cache never skipped,
        # changed nothing: say so in its row, not only in the notes.
        no_effect = any(f.startswith(NO_EFFECT) for f in c["flags"])
        cells = [c["treatment"] + (f" ({NO_EFFECT})" if no_effect else ""), str(c["n_pairs"]),
                 f"{_fmt(lat.get('control_geomean_s'), 3)} / {_fmt(lat.get('treatment_geomean_s'), 3)}",
                 ratio(c["speedup"]["geomean"], c["speedup"]["ci"]), compute_cell(c.get("compute")),
                 (f"{_pct(lat.get('control_cv_median'))} / {_pct(lat.get('treatment_cv_median'))}; "
                  f"{lat.get('pairs_over_max_cv', 0)}")]
        for n in metric_names:
            m = by.get(n)
            cells.append("" if m is None else cell(m, stats["level"], decimals[n]))
        rows.append(cells)
    return head, rows


def ratio(point: float, ci: list[float | None]) -> str:
    """A ratio with its interval: ``1.234× [1.1, 1.4]``."""
    return f"{point:.3f}× " + ("[no CI]" if ci[0] is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]")


def compute_cell(compute: ComputeSummary | None) -> str:
    """The compute ratio cell: treatment / control FLOPs with its interval and the block
    forwards the arm skipped; ``n/a`` for records without compute counts."""
    if not compute:
        return "n/a"
    skipped = compute["blocks_skipped"]
    total = skipped + compute["blocks_computed"]
    return ratio(compute["ratio"], compute["ci"]) + f"; skipped {skipped}/{total} blocks"


def pareto(stats: StudyStats) -> tuple[list[str], list[list[str]]]:
    """Quality against cost, one row per arm: its kinds of change, compute ratio [CI],
    measured speedup [CI], and each NR metric's paired difference [CI] (FR metrics: the
    value against control). ``front`` names the metrics on which no other arm (control
    included, at ratio 1 and Δ 0) is at least as cheap and strictly better."""
    metric_names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    ms = {n: [m for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == n] for n in metric_names}
    decimals = {n: column_decimals(ms[n]) for n in metric_names}  # one format per column, as in the table
    head = (["arm", "kinds", "compute ratio [CI], lower is cheaper", "speedup [CI], higher is faster"]
            + [metric_header(n, ms[n][0]["kind"], ms[n][0]["higher_is_better"]) for n in metric_names]
            + ["Pareto front (compute ratio vs metric)"])
    rows = []
    for c in stats["comparisons"]:
        by = {m["metric"]: m for m in c["metrics"]}
        front = [n for n in metric_names if n in by and on_front(stats, c["treatment"], n)]
        rows.append([c["treatment"] + (f" ({NO_EFFECT})" if any(f.startswith(NO_EFFECT) for f in c["flags"]) else ""),
                     ", ".join(c.get("kinds", [])) or "n/a", compute_cell(c.get("compute")),
                     ratio(c["speedup"]["geomean"], c["speedup"]["ci"])]
                    + [("" if n not in by else estimate(by[n], decimals[n])) for n in metric_names]
                    + [", ".join(front) or "none"])
    return head, rows


def _point(m: MetricResult) -> float:
    return m["diff"] if m["diff"] is not None else m["treatment_mean"]


def on_front(stats: StudyStats, arm: str, metric: str) -> bool:
    """Whether ``arm`` is Pareto-optimal for ``metric`` against compute ratio: no other
    arm (control: ratio 1, Δ 0; NR metrics only for control) is at least as cheap and at
    least as good with one of the two strictly. Point estimates; read with the intervals."""
    points = {}
    for c in stats["comparisons"]:
        m = next((m for m in c["metrics"] if m["metric"] == metric), None)
        compute = c["compute"]
        if m is None or not compute:
            continue
        sign = 1 if m["higher_is_better"] else -1
        points[c["treatment"]] = (compute["ratio"], sign * _point(m))
        if m["kind"] == "NR":
            points["control"] = (1.0, 0.0)
    if arm not in points:
        return False
    cost, good = points[arm]
    return not any(o != arm and oc <= cost and og >= good and (oc < cost or og > good)
                   for o, (oc, og) in points.items())


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def planning(stats: StudyStats) -> tuple[list[str], list[list[str]]]:
    """Sample size from this study as a pilot, per arm and tested metric: per-prompt
    standard deviation of the difference, the effect detectable at this prompt count, and
    the prompts needed for each ``stats.target_effects`` entry."""
    power = stats.get("power", 0.8)
    head = ["arm", "metric", "prompts", "sd per prompt", f"detectable Δ ({power:.0%} power)", "target Δ",
            "prompts needed"]
    rows = []
    for c in stats["comparisons"]:
        for m in c["metrics"]:
            pl = m.get("planning")
            if not pl:
                continue
            need = pl["prompts_needed"]
            rows.append([c["treatment"], m["metric"], str(m["n_prompts"]), _fmt(pl["sd_prompt"]),
                         _fmt(pl["detectable_effect"]), _fmt(pl["target_effect"]),
                         ("n/a" if pl["target_effect"] is None else "over 100000" if need is None else str(need))])
    return head, rows


def _notes(stats: StudyStats) -> list[str]:
    notes = [f"{c['treatment']}: {f}" for c in stats["comparisons"] for f in c["flags"] + c["notes"]]
    passes = ", ".join(sorted({p for c in stats["comparisons"] for p in c["latency"]["pass"]}))
    setups = [c.get("scoring", {}) for c in stats["comparisons"]]
    frames = sorted({f for sc in setups for f in sc.get("compared_frames", [])})
    filters = sorted({f for sc in setups for f in sc.get("static_filter", [])}) or ["none"]
    builds = sorted({str(sc.get("scorer_build")) for sc in setups})
    origins = sorted({str(sc.get("weights_origin")) for sc in setups if sc.get("weights_origin")})
    metrics = {m["metric"] for c in stats["comparisons"] for m in c["metrics"]}
    latency = (f"Latency pass: {passes} (each video's latency is the median of its repeated batch-one runs in the "
               "exclusive timed pass, after warm-up, arms in a seeded random order within each repeat round; bulk "
               "generation times are never reported). 'repeat CV' is the median over videos of each video's "
               "coefficient of variation across its repeats, then the count of pairs above timing/max_cv. The "
               "latency columns are geometric means over prompts of the per-prompt geometric mean over seeds, "
               "the units of the speedup, so control / treatment equals the speedup.")
    method = (f"Each cell: treatment − control (FR metrics: the treatment's value against its control) with a "
              f"{stats['level']:.0%} Student t-interval over prompts; p is the two-sided paired t-test, the same "
              "procedure inverted (the interval excludes 0 exactly when p < "
              f"{1 - stats['level']:.2g}); Holm adjusts p across the row's metrics; wins: share of pairs where the "
              "treatment is strictly better in the metric's direction. Lower-is-better metrics improve when Δ < 0.")
    fidelity = ("Fidelity metrics (FR) compare each treatment video with its control, frame by frame, on: "
                + ("; ".join(frames) or "decoded encoded videos") + ".")
    flicker = (f"temporal_flickering static filter: {', '.join(filters)} (VBench scores only videos its RAFT "
               "filter calls static; 'none': every video of both arms; 'intersection': only pairs whose two videos "
               "are both static; either way both arms use the same subset).")
    build = (f"Both arms of every pair were scored by one scorer build ({', '.join(builds)}; same code, weights, "
             "device, precision and process layout).")
    decoding: dict[str, set[str]] = {}
    for sc in setups:
        for name, how in sc.get("decoding", {}).items():
            decoding.setdefault(name, set()).update(how)
    by_how: dict[str, list[str]] = {}
    for name, hows in sorted(decoding.items()):
        by_how.setdefault(" and ".join(sorted(hows)), []).append(name)
    decoded = ("Decoding (YUV to RGB) per metric: " + "; ".join(f"{how}: {', '.join(names)}"
                                                                for how, names in sorted(by_how.items()))
               + ". bt709 is the matrix the videos declare (and how decord, VBench's reader for subject and "
               "background consistency, aesthetic and imaging quality, decodes them); bt601 is how OpenCV 4.x, "
               "VBench's reader for dynamic_degree, motion_smoothness and temporal_flickering, decodes them. "
               "The two differ: on the default study's 42 videos temporal_flickering from bt709 frames reads "
               "0.0025 to 0.0032 higher than VBench's (OpenCV 4.10), about as large as typical cache effects, "
               "and equals it exactly under scoring/decode: vbench; compare with published VBench numbers only "
               "in that mode.") if by_how else None
    out = [*notes, method, latency, fidelity, flicker, *([decoded] if decoded else []), build]
    if "motion_smoothness_proxy" in metrics:
        out.append("motion_smoothness_proxy is a PROXY of VBench motion_smoothness: linear frame interpolation "
                   "replaces AMT, so values compare arms but not published VBench numbers.")
    if "random-init" in origins:
        out.append("WARNING: scorer weights come from a random-initialised test mirror; weight-based scores "
                   "mean nothing about quality.")
    return out


_PLANNING_TEXT = ("Per-prompt standard deviation of each paired difference, the smallest true difference a two-sided "
                  "paired t-test detects at this prompt count, and the prompts needed for the difference set in "
                  "stats/target_effects (noncentral t; same level). Plan the next study's GPU budget from these.")


_PARETO_TEXT = ("One row per arm: compute ratio = treatment / control FLOPs per video (transformer work counted with "
                "torch's FlopCounterMode in the bulk pass, plus a search arm's verifier scorings; hardware-"
                "independent), measured speedup from the timed pass, and each metric's paired difference, all "
                "with their intervals over prompts. The Pareto column names the metrics on which no other arm "
                "(control included) is both at most as costly and at least as good (point estimates). Plot: "
                "plots/pareto.png.")


def _html_table(title: str, text: str, table_: tuple[list[str], list[list[str]]], escape: Any) -> list[str]:
    head, rows = table_
    return [f"<h2>{escape(title)}</h2><p>{escape(text)}</p><table><tr>",
            "".join(f"<th>{escape(h)}</th>" for h in head), "</tr>",
            *("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows), "</table>"]


def _intervals(stats: StudyStats) -> str:
    return (f"{stats['level']:.0%} Student t over prompts, test = the same t procedure inverted, Holm across "
            f"metrics; sign-flip check with up to {stats['resamples']} resamples (exact while 2^n is fewer), "
            f"seed {stats['seed']}")


def _html_planning(stats: StudyStats, escape: Any) -> list[str]:
    head, rows = planning(stats)
    if not rows:
        return []
    return ["<h2>Sample size from this study as a pilot</h2>", f"<p>{escape(_PLANNING_TEXT)}</p><table><tr>",
            "".join(f"<th>{escape(h)}</th>" for h in head), "</tr>",
            *("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows), "</table>"]


def markdown(stats: StudyStats, title: str, provenance: dict[str, str]) -> str:
    """Render ``stats`` (from ``stats.analyse``) as Markdown, with the manifest roots
    every number came from."""
    head, rows = table(stats)
    lines = [f"# {title}", "", f"Estimand: {stats['estimand']}.",
             f"Intervals: {_intervals(stats)}. Missing pairs: {stats['missing_policy']}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [""] + [f"- {n}" for n in _notes(stats)]
    q_head, q_rows = pareto(stats)
    lines += ["", "## Quality against cost", "", _PARETO_TEXT, "",
              "| " + " | ".join(q_head) + " |", "|" + "---|" * len(q_head)]
    lines += ["| " + " | ".join(r) + " |" for r in q_rows]
    p_head, p_rows = planning(stats)
    if p_rows:
        lines += ["", "## Sample size from this study as a pilot", "", _PLANNING_TEXT, "",
                  "| " + " | ".join(p_head) + " |", "|" + "---|" * len(p_head)]
        lines += ["| " + " | ".join(r) + " |" for r in p_rows]
    lines += ["", "## Provenance", ""]
    lines += [f"- `{name}`: `{root}`" for name, root in sorted(provenance.items())]
    return "\n".join(lines) + "\n"


def html(stats: StudyStats, title: str, provenance: dict[str, str]) -> str:
    """The same content as ``markdown`` as a standalone HTML page (for Snakemake's report)."""
    from html import escape

    head, rows = table(stats)
    parts = [f"<html><head><meta charset='utf-8'><title>{escape(title)}</title><style>"
             "body{font-family:sans-serif;margin:1em} td,th{border:1px solid #ccc;padding:4px 8px}"
             "table{border-collapse:collapse} code{font-size:90%}</style></head><body>",
             f"<h1>{escape(title)}</h1><p>Estimand: {escape(stats['estimand'])}.</p>",
             f"<p>Intervals: {escape(_intervals(stats))}. "
             f"Missing pairs: {escape(stats['missing_policy'])}.</p><table><tr>",
             "".join(f"<th>{escape(h)}</th>" for h in head), "</tr>",
             *("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows),
             "</table><ul>", *(f"<li>{escape(n)}</li>" for n in _notes(stats)), "</ul>",
             *_html_table("Quality against cost", _PARETO_TEXT, pareto(stats), escape),
             *_html_planning(stats, escape), "<h2>Provenance</h2><ul>",
             *(f"<li><code>{escape(k)}</code>: <code>{escape(v)}</code></li>" for k, v in sorted(provenance.items())),
             "</ul></body></html>"]
    return "".join(parts) + "\n"

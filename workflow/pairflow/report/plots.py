"""Report figures, drawn with matplotlib's Agg backend (no display needed).

Each figure is made from the statistics JSON and the records it was computed from, and
carries a caption line naming the statistics file and its xxh3 digest (that file lists
the manifest roots of every record behind it), so a figure resolves to its evidence.
Tick labels that would overlap are thinned before saving (``_thin_tick_labels``).
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.verdicts import COLOURS, verdict_text
from ..atomic import atomic_path
from ..errors import PairingError
from ..records.store import IDENTICAL, identical_to_control, in_fidelity_mean
from ..records.types import GenerationRecord, ScoreRecord, StudyStats, TimingRecord
from .table import UNITS, direction

# Lazy on purpose: matplotlib is imported inside the functions that draw (about a second): only the plot rule
# needs it.


def _agg() -> None:
    """Select the Agg backend (no display needed) before pyplot is imported."""
    import matplotlib

    matplotlib.use("Agg")


def _overlaps(a: Any, b: Any) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)


def _thin_tick_labels(fig: Any) -> None:
    """Hide tick labels that would overlap a label already kept on the same axis (major
    labels first, then minor ones, each in axis order), so ticks never collide whatever
    the data's range. Matplotlib has no such option; its locators only estimate spacing."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            kept: list[Any] = []
            for labels in (axis.get_majorticklabels(), axis.get_minorticklabels()):
                shown = [lb for lb in labels if lb.get_visible() and lb.get_text()]
                for lb in shown:
                    box = lb.get_window_extent(renderer)
                    if any(_overlaps(box, k) for k in kept):
                        lb.set_visible(False)
                    else:
                        kept.append(box)


def _save(fig: Any, out: Path, caption: str = "", caption_pt: float = 6) -> None:
    if caption:  # wrapped to the figure's width (about 0.55 em a character), so it never widens the image
        chars = max(40, int(fig.get_figwidth() * 72 / (0.55 * caption_pt)))
        fig.text(0.0, 0.0, textwrap.fill(caption, chars), fontsize=caption_pt, color="dimgrey", ha="left", va="top")
    _thin_tick_labels(fig)
    with atomic_path(Path(out)) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    _agg()
    import matplotlib.pyplot as plt

    plt.close(fig)


def _err(point: float, ci: list[float | None]) -> list[list[float]] | None:
    """matplotlib's asymmetric error bar around ``point`` for interval ``ci`` (None: no interval)."""
    lo, hi = ci
    return None if lo is None or hi is None else [[point - lo], [hi - point]]


PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#999933")
"""Okabe-Ito's colour-blind-safe colours (then two of Tol's), one per treatment arm in order."""
CONTROL_COLOUR = "#444444"


def arm_colours(arms: Sequence[str]) -> dict[str, str]:
    """One colour per arm, the same in every figure and in the gallery: control dark grey,
    the treatments in name order through ``PALETTE`` (repeating past eight), so the colour
    does not depend on where the arm list came from (config or a recorded snapshot)."""
    treatments = sorted(a for a in arms if a != "control")
    return {"control": CONTROL_COLOUR, **{a: PALETTE[i % len(PALETTE)] for i, a in enumerate(treatments)}}


def _colours(arms: Sequence[str], given: dict[str, str] | None) -> dict[str, str]:
    return {**arm_colours(arms), **(given or {})}


def unit(name: str) -> str:
    """`` (dB)`` for a metric with a unit (``table.UNITS``), else empty."""
    return f" ({UNITS[name]})" if name in UNITS else ""


def _plain_log_ticks(axis: Any) -> None:
    """Log-axis ticks written as plain numbers (0.5, 1, 2), never ``2x10^0``: majors at
    1, 2 and 5 per decade, no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def forest_title(stats: StudyStats, name: str) -> str:
    """A forest panel's title: what is plotted and which way is better (a lower-is-better
    metric improves to the left of 0)."""
    ms = [m for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == name]
    better = direction(ms[0]["higher_is_better"])
    if any(m["kind"] == "NR" for m in ms):
        side = "right" if ms[0]["higher_is_better"] else "left"
        return f"{name}: treatment − control\n({better}: better to the {side} of 0)"
    return f"{name} vs control (value; {better})"


DPI = 110
"""Pixels per inch of every saved figure (a point of text is DPI / 72 pixels)."""
FOREST_WIDTH_IN = 9.0
"""The forest plot's width (inches; 990 px at the saved 110 dpi, plus its labels): about
the width the Snakemake report draws a figure at, so its text is not shrunk (issue 41:
one panel per metric side by side made a figure 14-40 inches wide, drawn at ~700 px, its
text ~6 px). Panels are stacked instead, one per row, each the full width, so a verdict's
words (phrase, p, test, family) fit on one line beside its point."""
FOREST_MIN_FONT_PT = 9.0
"""The forest plot's smallest text (points): 13.75 px at 110 dpi, still 10 px where the
report draws the figure at 73% of its width."""


def forest(stats: StudyStats, out: Path, caption: str = "", colours: dict[str, str] | None = None) -> None:
    """Speedup with its interval (first panel, log scale), then each metric's paired
    difference (NR metrics) or value (FR metrics) with its interval at the cell's
    family-adjusted level, the verdict beside each point (coloured as every HTML report
    colours it, ``verdicts.COLOURS``), and the declared margin (dotted, ±) or floor
    (dotted) the verdict was read against; one row and one colour per arm; panels stacked,
    ``FOREST_WIDTH_IN`` wide, no text under ``FOREST_MIN_FONT_PT``."""
    _agg()
    import matplotlib.pyplot as plt

    comps = stats["comparisons"]
    col = _colours([c["treatment"] for c in comps], colours)
    names = sorted({m["metric"] for c in comps for m in c["metrics"]})
    small, body = FOREST_MIN_FONT_PT, FOREST_MIN_FONT_PT + 1
    fig, axes = plt.subplots(len(names) + 1, 1, figsize=(FOREST_WIDTH_IN, (len(names) + 1) * (1.3 + 0.4 * len(comps))),
                             squeeze=False)
    ax = axes[0][0]
    for i, c in enumerate(comps):
        sp = c["speedup"]
        ax.errorbar([sp["geomean"]], [i], xerr=_err(sp["geomean"], sp["ci"]), fmt="o", capsize=4,
                    color=col[c["treatment"]])
    ax.axvline(1, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_title("speedup (control / treatment latency; higher is faster: right of 1)", fontsize=body)
    ax.set_xlabel("speedup (×, log scale)", fontsize=small)
    ax.set_yticks(range(len(comps)), [c["treatment"] for c in comps])
    words: list[tuple[Any, float]] = []  # (a verdict's text, its point)
    for ax, name in zip([row[0] for row in axes[1:]], names, strict=True):
        ms = [m for c in comps for m in c["metrics"] if m["metric"] == name]
        kind = ms[0]["kind"] if ms else "NR"
        for i, c in enumerate(comps):
            m = next((m for m in c["metrics"] if m["metric"] == name), None)
            point = None if m is None else m["diff"] if m["diff"] is not None else m["treatment_mean"]
            if m is None or point is None:
                continue
            ax.errorbar([point], [i], xerr=_err(point, m["ci"]), fmt="o", capsize=4, color=col[c["treatment"]])
            code = m.get("verdict_code")
            if code:
                text = ax.text(point, i + 0.12, verdict_text(m), fontsize=small, va="bottom", color=COLOURS[code])
                text.set_in_layout(False)  # placed below, once the panels' sizes are known
                words.append((text, point))
        ax.set_title(forest_title(stats, name).replace("\n", " "), fontsize=body)
        if any(m["kind"] == "NR" for m in ms):
            ax.axvline(0, color="grey", lw=0.8, ls="--")
        margin = next((m["margin"] for m in ms if m.get("margin")), None)
        floor = next((m["floor"] for m in ms if m.get("floor") is not None), None)
        for x in ([-margin, margin] if margin else []) + ([floor] if floor is not None else []):
            ax.axvline(x, color="tab:red", lw=0.8, ls=":")
        ax.set_xlabel(("Δ " if kind == "NR" else "value ") + name + unit(name), fontsize=small)
        ax.set_yticks(range(len(comps)), [c["treatment"] for c in comps])
    for (ax,) in axes:
        ax.set_ylim(-0.6, len(comps) - 0.2)  # room above the top row for its verdict label
        ax.tick_params(labelsize=body)
        for lb in ax.get_yticklabels():
            lb.set_color(col.get(lb.get_text(), "black"))
    fig.suptitle("Paired estimates per arm; intervals at each cell's family-adjusted level; dotted: margin or floor",
                 fontsize=body + 1, y=1.0)
    fig.tight_layout()
    _place_words(fig, words)
    _save(fig, out, caption, small)


def _place_words(fig: Any, words: list[tuple[Any, float]]) -> None:
    """Centre each verdict's words above its point, shifted just enough to stay inside its
    panel (a verdict with its p, test and family is ~100 characters: centred on a point
    near an edge it would run off the figure, and the figure would widen to hold it)."""
    from matplotlib.transforms import blended_transform_factory

    renderer = fig.canvas.get_renderer()
    for text, point in words:
        ax = text.axes
        width = text.get_window_extent(renderer).width / ax.get_window_extent(renderer).width
        at = ax.transAxes.inverted().transform(ax.transData.transform((point, 0)))[0]
        text.set_transform(blended_transform_factory(ax.transAxes, ax.transData))
        text.set_x(max(0.005, min(at - width / 2, 0.995 - width)))


def latency(timing_records: Sequence[TimingRecord], out: Path, caption: str = "",
            colours: dict[str, str] | None = None) -> None:
    """Paired latency: per treatment, one line per (panel, prompt, seed) joining the control
    video's timed latency to the treatment's (log scale, so equal ratios look equal), with
    each arm's median marked. The pairing is what the speedup is computed over."""
    _agg()
    import matplotlib.pyplot as plt

    lat: dict[str, dict[tuple[str, str, int], float]] = defaultdict(dict)
    for r in timing_records:
        c = r["candidate"]
        seconds = r["timing"]["latency_s"]
        if seconds is None:  # a pair outside the timing/pairs sample
            continue
        lat[r["arm"]["name"]][(c["panel"], c["prompt_id"], int(c["seed"]))] = seconds
    treatments = sorted(a for a in lat if a != "control")
    col = _colours(treatments, colours)
    fig, axes = plt.subplots(1, max(1, len(treatments)), figsize=(2.6 * max(1, len(treatments)) + 0.6, 3.4),
                             squeeze=False, sharey=True)
    for ax, arm in zip(axes[0], treatments, strict=False):
        pairs = sorted(k for k in lat[arm] if k in lat["control"])
        ctrl = np.array([lat["control"][k] for k in pairs])
        treat = np.array([lat[arm][k] for k in pairs])
        for a, b in zip(ctrl, treat, strict=True):
            ax.plot([0, 1], [a, b], color=col[arm], alpha=0.55, lw=0.9, marker="o", ms=3, ls="-" if b < a else ":")
        if pairs:
            ax.plot([0, 1], [np.median(ctrl), np.median(treat)], color="black", lw=2.2, marker="D", ms=6,
                    label="median")
            ratio = float(np.exp(np.mean(np.log(ctrl / treat))))
            ax.set_title(f"control → {arm}\n{len(pairs)} pairs, geo-mean speedup {ratio:.2f}x", fontsize=9)
        ax.set_xticks([0, 1], ["control", arm])
        ax.set_xlim(-0.3, 1.3)
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
        ax.get_xticklabels()[1].set_color(col[arm])
    axes[0][0].set_ylabel("timed latency per video (s, log scale)")
    fig.suptitle("Paired latency from the exclusive timed pass (solid: treatment faster, dotted: slower)",
                 fontsize=10, y=1.02)
    fig.tight_layout()
    _save(fig, out, caption)


def scatter(score_records: Sequence[ScoreRecord], out: Path, caption: str = "",
            colours: dict[str, str] | None = None) -> None:
    """Control value against treatment value, per no-reference metric and pair."""
    _agg()
    import matplotlib.pyplot as plt

    table: dict[str, dict[tuple[str, str, int], dict[str, float]]] = defaultdict(dict)
    kinds: dict[str, str] = {}
    better: dict[str, bool] = {}
    for r in score_records:
        key = (r["candidate"]["panel"], r["candidate"]["prompt_id"], int(r["candidate"]["seed"]))
        for name, s in r["scores"].items():
            kinds[name] = s["spec"]["kind"]
            better[name] = s["spec"]["higher_is_better"]
            table[name].setdefault(key, {})[r["arm"]["name"]] = s["value"]
    names = sorted(n for n, k in kinds.items() if k == "NR")
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(3.4 * max(1, len(names)), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=False):
        rows = table[name].values()
        arms = sorted({a for row in rows for a in row if a != "control"})
        for arm in arms:
            pts = [(row["control"], row[arm]) for row in rows if "control" in row and arm in row]
            ax.scatter(*zip(*pts, strict=True), s=12, label=arm, color=_colours(arms, colours)[arm])
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"control{unit(name)}")
        ax.set_ylabel(f"treatment{unit(name)}")
        ax.set_title(f"{name} ({'above' if better[name] else 'below'} the diagonal: treatment better)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # never over points
    _save(fig, out, caption)


def per_prompt(score_records: Sequence[ScoreRecord], gen_records: Sequence[GenerationRecord], out: Path,
               caption: str = "", colours: dict[str, str] | None = None) -> None:
    """Per-prompt mean (over seeds) of each treatment's difference from control, NR metrics;
    per-prompt value for FR metrics, over the pairs that count for a fidelity mean
    (``records.in_fidelity_mean``: pairs identical to control, read from ``gen_records``,
    are left out, as in the table). A prompt whose every pair is identical has no bar and
    is marked ``=`` on the zero line; each panel's title counts the identical pairs. Raises
    PairingError when a scored candidate has no generation record."""
    _agg()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    vals: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    left_out: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    control: dict[tuple[str, str, str, int], float] = {}
    kinds: dict[str, str] = {}
    better: dict[str, bool] = {}
    gen = {(r["candidate"]["panel"], r["candidate"]["prompt_id"], int(r["candidate"]["seed"]), r["arm"]["name"]): r
           for r in gen_records}
    for r in score_records:
        c = r["candidate"]
        for name, s in r["scores"].items():
            kinds[name] = s["spec"]["kind"]
            better[name] = s["spec"]["higher_is_better"]
            if r["arm"]["name"] == "control":
                control[(name, c["panel"], c["prompt_id"], int(c["seed"]))] = s["value"]
    for r in score_records:
        c, arm = r["candidate"], r["arm"]["name"]
        if arm == "control":
            continue
        key = (c["panel"], c["prompt_id"], int(c["seed"]))
        pair = [gen.get((*key, a)) for a in ("control", arm)]
        if pair[0] is None or pair[1] is None:
            raise PairingError(f"{arm}: prompt {key[0]}/{key[1]} seed {key[2]} is scored but its pair has no "
                               "generation record to tell whether it is identical to control; rerun the panel")
        identical = identical_to_control(pair[0], pair[1])
        prompt = f"{c['panel']}/{c['prompt_id']}"
        for name, s in r["scores"].items():
            if not in_fidelity_mean(kinds[name], identical):
                left_out[name][arm][prompt] += 1
                continue
            base = 0.0 if kinds[name] == "FR" else control[(name, key[0], key[1], key[2])]
            vals[name][arm][prompt].append(s["value"] - base)
    names = sorted(set(vals) | set(left_out))
    prompts = sorted({p for n in names for a in (*vals[n], *left_out[n]) for p in (*vals[n][a], *left_out[n][a])})
    # One shared prompt axis, labelled once at the bottom, vertically: its width grows
    # with the prompts (about 0.28 in each) and its height with the longest label, so
    # labels never overlap each other or the bars.
    label_in = 0.075 * max((len(p) for p in prompts), default=0)
    fig, axes = plt.subplots(len(names), 1, figsize=(max(8.0, 0.28 * len(prompts) + 2.5),
                                                     2.2 * len(names) + label_in), squeeze=False, sharex=True)
    for ax, name in zip(axes[:, 0], names, strict=True):
        arms = sorted(set(vals[name]) | set(left_out[name]))
        width = 0.8 / max(1, len(arms))
        marked = False
        for j, arm in enumerate(arms):
            ys = [float(np.mean(vals[name][arm][p])) if vals[name][arm].get(p) else np.nan for p in prompts]
            ax.bar(np.arange(len(prompts)) + j * width, ys, width, label=arm, color=_colours(arms, colours)[arm])
            # a prompt whose every pair is identical to control: no bar, a mark on the zero line
            only = [i for i, p in enumerate(prompts) if left_out[name][arm].get(p) and not vals[name][arm].get(p)]
            if only:
                ax.scatter(np.array(only) + j * width, np.zeros(len(only)), marker="$=$", s=60, zorder=3,
                           color=_colours(arms, colours)[arm], label=None if marked else f"every pair {IDENTICAL}")
                marked = True
        ax.set_xticks(np.arange(len(prompts)) + 0.4 - width / 2, prompts, rotation=90, fontsize=7)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
        what = 'value' if kinds[name] == 'FR' else 'treatment − control'
        n_out = sum(n for a in left_out[name].values() for n in a.values())
        out_note = f"\n{n_out} pair(s) {IDENTICAL} left out of the mean (as in the table)" if n_out else ""
        ax.set_title(f"{name}: {what} per prompt ({'higher' if better[name] else 'lower'} is better){out_note}",
                     fontsize=9)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylabel(("Δ" if kinds[name] == "NR" else "value") + unit(name), fontsize=8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside: hides no bar
    fig.tight_layout()
    _save(fig, out, caption)


def pareto(stats: StudyStats, out: Path, caption: str = "", colours: dict[str, str] | None = None) -> None:
    """Quality against cost per arm: for each metric, the paired difference [CI] (FR
    metrics: the value) against the compute ratio (top row, FLOPs, exact) and against the
    measured speedup [CI] (bottom row). Control sits at ratio 1 and Δ 0 for NR metrics.
    Arms without compute counts are left out of the top row. With iso-compute controls,
    the plain step counts draw the steps curve (``_steps_curve``)."""
    _agg()
    import matplotlib.pyplot as plt

    names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]}) or ["(no metric)"]
    col = _colours([c["treatment"] for c in stats["comparisons"]], colours)
    fig, axes = plt.subplots(2, len(names), figsize=(3.8 * len(names), 6.4), squeeze=False)
    for j, name in enumerate(names):
        for row, what in enumerate(("compute", "speedup")):
            ax = axes[row][j]
            nr = False
            for c in stats["comparisons"]:
                m = next((m for m in c["metrics"] if m["metric"] == name), None)
                compute = c["compute"]
                x = ((compute["ratio"], compute["ci"]) if compute else None) if what == "compute" else (
                    c["speedup"]["geomean"], c["speedup"]["ci"])
                if m is None or x is None:
                    continue
                nr = nr or m["kind"] == "NR"
                point = m["diff"] if m["diff"] is not None else m["treatment_mean"]
                if point is None:  # an FR metric whose every pair is identical to control
                    continue
                xv, xci = x
                ax.errorbar([xv], [point], xerr=_err(xv, xci), yerr=_err(point, m["ci"]), fmt="o", capsize=3,
                            color=col[c["treatment"]])
                ax.annotate(c["treatment"], (xv, point), fontsize=7, xytext=(3, 3), textcoords="offset points",
                            color=col[c["treatment"]])
            _steps_curve(ax, stats, name, what, nr)
            if nr:
                ax.scatter([1.0], [0.0], marker="s", color="black")
                ax.annotate("control", (1.0, 0.0), fontsize=7, xytext=(3, -9), textcoords="offset points")
                ax.axhline(0, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log")
            _plain_log_ticks(ax.xaxis)
            ax.tick_params(axis="x", which="both", labelsize=7)
            ax.set_xlabel("compute ratio (× control FLOPs, log scale)" if what == "compute"
                          else "measured speedup (×, log scale)", fontsize=8)
            ax.set_ylabel(("Δ " if nr else "value ") + name + unit(name), fontsize=8)
            ax.set_title(_pareto_title(stats, name, nr), fontsize=8)
    fig.suptitle(f"Quality against cost per arm, {stats['level']:.0%} t-intervals over prompts", fontsize=10, y=1.02)
    fig.tight_layout()
    _save(fig, out, caption)


def _steps_curve(ax: Any, stats: StudyStats, name: str, what: str, nr: bool) -> None:
    """The plain arms of the iso-compute controls (stats.json's ``iso_compute.curve``: each
    against control) as a grey line through control, labelled by step count: the cost a
    plain step count buys, with the arms as points beside it."""
    pts = []
    for c in (stats.get("iso_compute") or {}).get("curve", []):
        m = next((m for m in c["metrics"] if m["metric"] == name), None)
        x = (c["compute"]["ratio"] if c.get("compute") else None) if what == "compute" else c["speedup"]["geomean"]
        point = None if m is None else (m["diff"] if m["diff"] is not None else m["treatment_mean"])
        if x is not None and point is not None:
            pts.append((float(x), float(point), c["treatment"].rsplit("-", 1)[-1]))
    if not pts:
        return
    line = sorted(pts + ([(1.0, 0.0, "")] if nr else []))
    ax.plot([p[0] for p in line], [p[1] for p in line], color="grey", lw=1, ls="-", marker=".", zorder=0,
            label="plain steps (equal-compute controls)")
    for x, y, k in pts:
        ax.annotate(f"{k} steps", (x, y), fontsize=6, color="grey", xytext=(3, -8), textcoords="offset points")


def _pareto_title(stats: StudyStats, name: str, nr: bool) -> str:
    """A Pareto panel's title: the metric, what its axis shows and which way is better."""
    ms = [m for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == name]
    if not ms:
        return name
    better = direction(ms[0]["higher_is_better"])
    if nr:
        return f"{name}: treatment − control\n({better}: better {'above' if ms[0]['higher_is_better'] else 'below'} 0)"
    return f"{name} vs control (value; {better})"

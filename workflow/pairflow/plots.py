"""Report figures, drawn with matplotlib's Agg backend (no display needed).

Each figure is made from the statistics JSON and the records it was computed from, and
carries the manifest roots of those records in its caption line.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> None:
    from .atomic import atomic_path

    with atomic_path(Path(out)) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    _plt().close(fig)


def forest_title(stats: dict[str, Any], name: str) -> str:
    """A forest panel's title: what is plotted and which way is better (a lower-is-better
    metric improves to the left of 0)."""
    from .report import direction

    ms = [m for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == name]
    better = direction(ms[0]["higher_is_better"])
    if any(m["kind"] == "NR" for m in ms):
        side = "right" if ms[0]["higher_is_better"] else "left"
        return f"{name}: treatment − control\n({better}: better to the {side} of 0)"
    return f"{name} vs control (value; {better})"


def forest(stats: dict[str, Any], out: Path) -> None:
    """Paired difference (NR metrics) or value (FR metrics) with its CI, per metric and arm."""
    plt = _plt()
    names = sorted({m["metric"] for c in stats["comparisons"] for m in c["metrics"]})
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 1.6 + 0.5 * len(stats["comparisons"])),
                             squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for i, c in enumerate(stats["comparisons"]):
            m = next((m for m in c["metrics"] if m["metric"] == name), None)
            if m is None:
                continue
            point = m["diff"] if m["diff"] is not None else m["treatment_mean"]
            err = None if m["ci"][0] is None else [[point - m["ci"][0]], [m["ci"][1] - point]]
            ax.errorbar([point], [i], xerr=err, fmt="o", capsize=4)
        ax.set_title(forest_title(stats, name), fontsize=9)
        if any(m["kind"] == "NR" for c in stats["comparisons"] for m in c["metrics"] if m["metric"] == name):
            ax.axvline(0, color="grey", lw=0.8, ls="--")
        ax.set_yticks(range(len(stats["comparisons"])), [c["treatment"] for c in stats["comparisons"]])
    fig.suptitle(f"Paired estimates, {stats['level']:.0%} t-interval over prompts", fontsize=10, y=1.04)
    fig.tight_layout()
    _save(fig, out)


def latency(gen_records: list[dict[str, Any]], out: Path) -> None:
    """Distribution of per-video latency per arm (the pass each came from is in the label)."""
    plt = _plt()
    by: dict[str, list[float]] = defaultdict(list)
    passes: dict[str, set[str]] = defaultdict(set)
    for r in gen_records:
        if r["timing"].get("latency_s") is None:  # a pair outside the timing/pairs sample
            continue
        by[r["arm"]["name"]].append(r["timing"]["latency_s"])
        passes[r["arm"]["name"]].add(r["timing"]["pass"])
    arms = sorted(by, key=lambda a: (a != "control", a))
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(arms), 3.2))
    ax.boxplot([by[a] for a in arms], showfliers=True)
    for i, a in enumerate(arms, start=1):
        ax.scatter(np.full(len(by[a]), i) + np.linspace(-0.12, 0.12, len(by[a])), by[a], s=8, alpha=0.6)
    ax.set_xticks(range(1, len(arms) + 1), [f"{a}\n({'/'.join(sorted(passes[a]))})" for a in arms])
    ax.set_ylabel("latency per video (s)")
    ax.set_title("Latency per arm", fontsize=10)
    _save(fig, out)


def scatter(score_records: list[dict[str, Any]], out: Path) -> None:
    """Control value against treatment value, per no-reference metric and pair."""
    plt = _plt()
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
            ax.scatter(*zip(*pts, strict=True), s=12, label=arm)
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
        ax.set_xlabel("control")
        ax.set_ylabel("treatment")
        ax.set_title(f"{name} ({'above' if better[name] else 'below'} the diagonal: treatment better)", fontsize=9)
        ax.legend(fontsize=7)
    _save(fig, out)


def per_prompt(score_records: list[dict[str, Any]], out: Path) -> None:
    """Per-prompt mean (over seeds) of each treatment's difference from control, NR metrics;
    per-prompt value for FR metrics."""
    plt = _plt()
    vals: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    control: dict[tuple[str, str, str, int], float] = {}
    kinds: dict[str, str] = {}
    better: dict[str, bool] = {}
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
        for name, s in r["scores"].items():
            base = 0.0 if kinds[name] == "FR" else control[(name, c["panel"], c["prompt_id"], int(c["seed"]))]
            vals[name][arm][f"{c['panel']}/{c['prompt_id']}"]["v"].append(s["value"] - base)
    names = sorted(vals)
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        arms = sorted(vals[name])
        prompts = sorted({p for a in arms for p in vals[name][a]})
        width = 0.8 / max(1, len(arms))
        for j, arm in enumerate(arms):
            ys = [float(np.mean(vals[name][arm][p]["v"])) for p in prompts]
            ax.bar(np.arange(len(prompts)) + j * width, ys, width, label=arm)
        ax.set_xticks(np.arange(len(prompts)) + 0.4 - width / 2, prompts, rotation=45, ha="right", fontsize=7)
        what = 'value' if kinds[name] == 'FR' else 'treatment − control'
        ax.set_title(f"{name}: {what} per prompt ({'higher' if better[name] else 'lower'} is better)", fontsize=9)
        ax.axhline(0, color="grey", lw=0.8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, out)

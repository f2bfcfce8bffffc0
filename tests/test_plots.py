"""plots: every figure draws from records shaped as the stages write them; tick labels
never overlap, legends never sit over the data, and the latency figure shows pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import pytest

from pairflow.report import plots

matplotlib.use("Agg")

PROMPTS = [f"prompt-{i:02d}-with-a-long-name" for i in range(24)]
ARMS = ("control", "fbcache", "pab")


def _score_records() -> list[dict[str, Any]]:
    out = []
    for i, p in enumerate(PROMPTS):
        for arm_i, arm in enumerate(ARMS):
            scores = {"temporal_flickering": {"value": 0.9 + 0.001 * i - 0.002 * arm_i,
                                              "spec": {"kind": "NR", "higher_is_better": True}}}
            if arm != "control":
                scores["ssim"] = {"value": 0.8 + 0.005 * arm_i, "spec": {"kind": "FR", "higher_is_better": True}}
            out.append({"candidate": {"panel": "smoke", "prompt_id": p, "seed": 0}, "arm": {"name": arm},
                        "scores": scores})
    return out


def _gen_records(identical: frozenset[tuple[str, str]] = frozenset()) -> list[dict[str, Any]]:
    """Generation records as far as the plots read them: each video's raw-frame digest;
    a treatment's equals control's for the (prompt, arm) pairs in ``identical``."""
    return [{"candidate": {"panel": "smoke", "prompt_id": p, "seed": 0}, "arm": {"name": arm},
             "video": {"raw_digest": f"xxh3_128:{p}-{'control' if (p, arm) in identical else arm}"}}
            for p in PROMPTS for arm in ARMS]


def _timing_records() -> list[dict[str, Any]]:
    return [{"candidate": {"panel": "smoke", "prompt_id": p, "seed": 0}, "arm": {"name": arm},
             "timing": {"pass": "timed", "latency_s": 1.0 / (1 + arm_i) + 0.01 * i}}
            for i, p in enumerate(PROMPTS) for arm_i, arm in enumerate(ARMS)]


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Figures handed to ``plots._save`` (which still writes them), drawn so that text
    extents are known."""
    figs: list[Any] = []
    real = plots._save

    def keep(fig: Any, out: Path, caption: str = "", caption_pt: float = 6) -> None:
        real(fig, out, caption, caption_pt)  # adds the caption and thins tick labels, then writes
        fig.canvas.draw()
        figs.append(fig)

    monkeypatch.setattr(plots, "_save", keep)
    plots._agg()
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "close", lambda fig: None)
    return figs


def _overlaps(boxes: list[Any]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
            if boxes[i].width and boxes[j].width and boxes[i].overlaps(boxes[j])]


def test_per_prompt_ticks_never_overlap_and_legend_hides_no_bar(drawn: list[Any], tmp_path: Path) -> None:
    plots.per_prompt(_score_records(), _gen_records(), tmp_path / "per_prompt.png")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    shown = [t.get_window_extent(renderer) for ax in fig.axes for t in ax.get_xticklabels()
             if t.get_text() and t.get_visible()]
    assert len(shown) == len(PROMPTS) and not _overlaps(shown)  # one shared prompt axis, labelled once
    for ax in fig.axes:
        ys = [t.get_window_extent(renderer) for t in ax.get_yticklabels() if t.get_text() and t.get_visible()]
        assert ys and not _overlaps(ys)
        assert not any(b.overlaps(ax.title.get_window_extent(renderer)) for b in shown)
        legend = ax.get_legend().get_window_extent(renderer)
        bars = [b.get_window_extent(renderer) for b in ax.patches]
        assert bars and not any(legend.overlaps(b) for b in bars)
    assert (tmp_path / "per_prompt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_joins_each_pair_of_control_and_treatment(drawn: list[Any], tmp_path: Path) -> None:
    plots.latency(_timing_records(), tmp_path / "latency.png")
    (fig,) = drawn
    axes = [ax for ax in fig.axes if ax.lines]
    assert [ax.get_xticklabels()[1].get_text() for ax in axes] == ["fbcache", "pab"]
    for ax in axes:
        pairs = [ln for ln in ax.lines if ln.get_label() != "median"]
        assert len(pairs) == len(PROMPTS)  # one line per (prompt, seed) pair
        assert all(list(ln.get_xdata()) == [0, 1] for ln in pairs)
        assert ax.get_yscale() == "log"
    assert "2.00x" in axes[0].get_title() or "speedup" in axes[0].get_title()


def test_scatter_legend_sits_outside_the_points(drawn: list[Any], tmp_path: Path) -> None:
    plots.scatter(_score_records(), tmp_path / "scatter.png")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend, frame = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.x0 >= frame.x1  # right of the axes


def _stats(n_arms: int) -> dict[str, Any]:
    """Study statistics shaped as stats.analyse writes them: arms whose compute ratios and
    speedups span two decades (0.05x to 8x), so a log axis gets many tick labels."""
    comparisons = []
    for i in range(n_arms):
        ratio = 0.05 * (8 / 0.05) ** (i / max(1, n_arms - 1))
        metrics = [{"metric": "temporal_flickering", "kind": "NR", "higher_is_better": True, "diff": -0.01 * i,
                    "ci": [-0.01 * i - 0.005, -0.01 * i + 0.005], "treatment_mean": 0.9, "margin": 0.02,
                    "verdict": "non-inferior"},
                   {"metric": "ssim", "kind": "FR", "higher_is_better": True, "diff": None,
                    "ci": [0.7, 0.8], "treatment_mean": 0.75, "floor": 0.9, "verdict": "misses floor"}]
        comparisons.append({"treatment": f"arm-{i:02d}", "metrics": metrics,
                            "compute": {"ratio": ratio, "ci": [ratio, ratio]},
                            "speedup": {"geomean": 1 / ratio, "ci": [0.9 / ratio, 1.1 / ratio]}})
    return {"level": 0.95, "comparisons": comparisons}


@pytest.mark.parametrize("figure", ["forest", "pareto", "latency", "scatter", "per_prompt"])
def test_no_figure_has_overlapping_tick_labels_and_each_names_its_source(
        figure: str, drawn: list[Any], tmp_path: Path) -> None:
    data = {"forest": (_stats(12),), "pareto": (_stats(12),), "latency": (_timing_records(),),
            "scatter": (_score_records(),), "per_prompt": (_score_records(), _gen_records())}[figure]
    getattr(plots, figure)(*data, tmp_path / f"{figure}.png", "demo: from scratch/study/stats.json (xxh3_128:00)")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [*axis.get_majorticklabels(), *axis.get_minorticklabels()]
            shown = [t.get_window_extent(renderer) for t in labels if t.get_text() and t.get_visible()]
            assert not _overlaps(shown), (figure, [t.get_text() for t in labels if t.get_visible()])
    assert any("stats.json (xxh3_128:00)" in t.get_text() for t in fig.texts)
    if figure == "forest":  # thinning drops numbers, never an arm's name
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_yticklabels() if t.get_visible()] == [f"arm-{i:02d}" for i in range(12)]


@pytest.mark.parametrize("figure", ["forest", "pareto", "latency"])
def test_log_axes_read_plain_numbers_and_every_axis_names_its_unit(figure: str, drawn: list[Any],
                                                                   tmp_path: Path) -> None:
    """Regression (issue 26): latency ticks read ``2x10^0``; PSNR axes lacked dB."""
    data = {"forest": _stats(3), "pareto": _stats(3), "latency": _timing_records()}[figure]
    getattr(plots, figure)(data, tmp_path / f"{figure}.png", "c")
    (fig,) = drawn
    labels = [t.get_text() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
              for t in [*axis.get_majorticklabels(), *axis.get_minorticklabels()] if t.get_visible()]
    assert labels and not any("10^" in t or "times" in t or "$" in t for t in labels), labels
    if figure != "latency":
        metric_axes = [ax.get_xlabel() if figure == "forest" else ax.get_ylabel() for ax in fig.axes[1:]]
        assert all(metric_axes), metric_axes


def test_each_arm_keeps_one_colour_in_every_figure(drawn: list[Any], tmp_path: Path) -> None:
    colours = plots.arm_colours(["control", *ARMS[1:]])
    assert len(set(colours.values())) == len(colours)
    assert plots.arm_colours(list(reversed(ARMS))) == colours  # order of the list does not matter
    plots.scatter(_score_records(), tmp_path / "s.png", "c", colours)
    plots.per_prompt(_score_records(), _gen_records(), tmp_path / "p.png", "c", colours)
    import matplotlib.colors as mc

    scatter, per_prompt = drawn
    seen = {c.get_label(): mc.to_hex(c.get_facecolor()[0]) for c in scatter.axes[0].collections if c.get_label()}
    assert seen == {a: colours[a].lower() for a in ARMS[1:]}
    bars = {c.get_label(): mc.to_hex(c.patches[0].get_facecolor()) for c in per_prompt.axes[0].containers}
    assert bars == {a: colours[a].lower() for a in ARMS[1:]}


def test_per_prompt_leaves_identical_pairs_out_of_fidelity_bars_marks_and_counts_them(drawn: list[Any],
                                                                                      tmp_path: Path) -> None:
    """Regression (issue 41): the per-prompt plot drew an identical pair's capped fidelity
    (80 dB, SSIM 1) as a bar, unmarked, where the table left it out."""
    same = frozenset({(PROMPTS[0], "fbcache"), (PROMPTS[3], "pab")})
    records = _score_records()
    for r in records:
        if (r["candidate"]["prompt_id"], r["arm"]["name"]) in same:
            r["scores"]["ssim"]["value"] = 1.0  # what an identical pair scores
    plots.per_prompt(records, _gen_records(same), tmp_path / "p.png")
    (fig,) = drawn
    ssim = next(ax for ax in fig.axes if ax.get_title().startswith("ssim"))
    flicker = next(ax for ax in fig.axes if ax.get_title().startswith("temporal_flickering"))
    assert "2 pair(s) identical to control left out of the mean" in ssim.get_title()
    assert "identical" not in flicker.get_title()  # a per-video difference keeps every pair (its Δ is 0)
    heights = {c.get_label(): [b.get_height() for b in c.patches] for c in ssim.containers}
    assert heights["fbcache"][0] != heights["fbcache"][0]  # NaN: no bar where every pair is identical
    assert heights["pab"][3] != heights["pab"][3]
    assert heights["fbcache"][1] == pytest.approx(0.805) and 1.0 not in heights["fbcache"] + heights["pab"]
    marks = [c for c in ssim.collections if c.get_offsets().shape[0]]
    assert sorted(float(x) for c in marks for x, _y in c.get_offsets()) == pytest.approx([0.0, 3 + 0.4])
    assert any(t.get_text() == "every pair identical to control" for t in ssim.get_legend().get_texts())


@pytest.mark.parametrize("arms", [1, 3, 12])
def test_the_forest_plot_is_report_wide_and_its_smallest_text_reads_at_10_px(arms: int, drawn: list[Any],
                                                                                tmp_path: Path) -> None:
    """Regression (issue 41): the forest plot put every metric's panel side by side (14-40
    inches wide), so the report drew its 6-9 pt text at about 6 px. Panels are stacked now,
    the figure ``FOREST_WIDTH_IN`` wide, no text under ``FOREST_MIN_FONT_PT``; drawn at the
    report's width (tests/test_workflow.py measures it in chromium) that is >= 10 px."""
    from PIL import Image

    stats = _stats(arms)
    stats["comparisons"][0]["metrics"][0].update(verdict_code="non_inferior", p_verdict=0.01,
                                                  p_verdict_test="non-inferiority (loss = margin 0.02)",
                                                  p_verdict_family="outside the family, scaled to this cell's Holm "
                                                                   "level")
    out = tmp_path / "forest.png"
    plots.forest(stats, out, "demo: from scratch/study/stats.json (xxh3_128:00), whose provenance lists the "
                 "manifest roots of every record behind this figure")
    (fig,) = drawn
    width_px = Image.open(out).size[0]
    assert width_px <= 1.15 * plots.FOREST_WIDTH_IN * plots.DPI, width_px  # the labels' margin only
    texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text"))
             if t.get_text().strip() and t.get_visible()]
    assert len(texts) > 10 and min(t.get_fontsize() for t in texts) >= plots.FOREST_MIN_FONT_PT
    assert plots.FOREST_MIN_FONT_PT * plots.DPI / 72 * 0.73 >= 10  # at 73% of its width, the smallest text is 10 px
    verdict = next(t for t in texts if t.get_text().startswith("non-inferior (p 0.01"))
    assert verdict.get_color() == plots.COLOURS["non_inferior"]
    renderer = fig.canvas.get_renderer()
    box, frame = verdict.get_window_extent(renderer), verdict.axes.get_window_extent(renderer)
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1  # the verdict's words stay inside its panel

"""table: the answer comes first (one line per arm from the statistics' own fields), notes
are said once, and no second table repeats the study table's columns."""

from __future__ import annotations

import copy
import re

from test_stats import S, records, with_compute

from pairflow.analysis.stats import analyse
from pairflow.analysis.verdicts import verdict_text
from pairflow.report.table import _notes, answer, html, markdown, timed_cell


def _stats() -> dict:
    gen, scores, timings = records(effect=-0.2, ratio=1.5)
    for i, t in enumerate(timings):  # latency noise, so the speedup has spread and an interval
        if t["arm"]["name"] == "treat":
            t["timing"]["latency_s"] *= 1 + 0.01 * ((i % 5) - 2)
    return analyse(with_compute(gen, 0.5, ["cache"], skipped=4), scores, timings, ["treat"], S)


def test_answer_line_gives_speedup_compute_and_each_metrics_verdict_from_the_stats() -> None:
    res = _stats()
    (line,) = answer(res)
    c = res["comparisons"][0]
    sp, lo, hi = c["speedup"]["geomean"], *c["speedup"]["ci"]
    assert line.startswith(f"treat: {sp:.2f}× faster [{lo:.2f}, {hi:.2f}], compute {c['compute']['ratio']:.2f}× "
                           "control; ")
    for m in c["metrics"]:  # every metric, worded as every report words it (verdict_text), with its estimate
        assert f"{m['metric']} {verdict_text(m)}, " in line
    q = next(m for m in c["metrics"] if m["metric"] == "q")
    assert "q inferior (p " in line and ": difference from 0, Holm over the table's 1 test), Δ" in line
    q = next(m for m in c["metrics"] if m["metric"] == "q")
    assert re.search(r"q \S.*, Δ -0\.\d+ \[-\d\.\d+, -?\d\.\d+\]", line), line
    psnr = next(m for m in c["metrics"] if m["metric"] == "psnr")
    assert f"{psnr['treatment_mean']:.1f}"[:2] in line and " dB [" in line
    assert q["diff"] < 0
    # a slower arm reads as slower, with the speedup beside it
    slow = copy.deepcopy(res)
    slow["comparisons"][0]["speedup"] = {"geomean": 0.5, "ci": [0.4, 0.6]}
    assert answer(slow)[0].startswith("treat: 2.00× slower (speedup 0.50× [0.40, 0.60])")


def test_markdown_and_html_open_with_the_answer_and_link_the_gallery() -> None:
    res = _stats()
    md = markdown(res, "t", {})
    lines = md.splitlines()
    assert lines[0] == "# t" and lines[2] == f"**{answer(res)[0]}**  "
    assert "Videos: [gallery.html](gallery.html)" in md
    page = html(res, "t", {})
    assert page.index("class='answer'") < page.index("Estimand") and "href='gallery.html'" in page


def test_identical_notes_of_several_arms_are_said_once() -> None:
    """Regression (issue 26): three arms' identical timing-noise warnings gave three lines."""
    res = _stats()
    second = copy.deepcopy(res["comparisons"][0])
    second["treatment"] = "treat2"
    res["comparisons"].append(second)
    warn = "latency: 14 of 14 timed pair(s) vary between repeats more than timing/max_cv (0.05)"
    for c in res["comparisons"]:
        c["notes"] = [warn]
    notes = _notes(res)
    assert [n for n in notes if warn in n] == [f"treat, treat2: {warn}"]


def test_quality_against_cost_repeats_no_column_of_the_study_table() -> None:
    md = markdown(_stats(), "t", {})
    section = md.split("## Quality against cost", 1)[1].split("\n## ", 1)[0]
    assert "|" not in section  # no second table
    assert "- treat (cache): on the front for" in section


def test_the_timed_cell_says_pairs_repeats_design_and_the_free_repeatability_check() -> None:
    seq = {"n_pairs": 12, "sampled_pairs": 13, "repeats": [1],
           "design": {"design": "stein-two-stage", "pilot_prompts": 5, "stopped": ["precision"]}}
    assert timed_cell(seq) == ("12 × 1 (sequential, 5-prompt pilot, stopped: precision; "
                               "bulk frames reproduced 12/13)")
    every = {"n_pairs": 4, "sampled_pairs": 4, "repeats": [3], "design": {"design": "fixed", "pairs": ["all"]}}
    assert timed_cell(every) == "4 × 3 (every pair; bulk frames reproduced 4/4)"
    sample = {"n_pairs": 2, "sampled_pairs": 2, "repeats": [1, 2], "design": {"design": "fixed", "pairs": ["2"]}}
    assert timed_cell(sample) == "2 × 1/2 (sample: timing/pairs 2; bulk frames reproduced 2/2)"


def test_tails_section_states_the_share_links_the_worst_pairs_and_says_what_would_bound_it() -> None:
    """Issue 39: a metric with a margin gets its tail statement in both renderings, its
    worst prompts linked to their gallery anchors; a metric without one gets none."""
    from test_stats import metric, with_metric

    from pairflow.analysis.tail import sentence
    from pairflow.plan.config import StatsSpec
    from pairflow.report.table import tails

    d = [0.01, -0.02, 0.0, 0.015, -0.01, -2.0, 0.005, -0.015, 0.02, -0.005]  # p05 loses 2 (higher is better)
    res = analyse(*with_metric("q", {"treat": d}), ["treat"], StatsSpec(2000, 0.95, 0, margins={"q": 0.5}))
    head, (row,) = tails(res)
    assert row[:3] == ["treat", "q", sentence(metric(res, "q")["tail"])]
    assert row[3].startswith("[p/p05 s0](gallery.html#p-treat-p05-s0) +2")
    assert row[4].startswith("yes ⚠") and "would bound the breaking share below 10%" in row[5]
    md = markdown(res, "t", {})
    assert "## Tails: what the prompts rule out" in md and "1 of 10 prompts lost more than 0.5; up to 45% could" in md
    page = html(res, "t", {})
    assert "<a href='gallery.html#p-treat-p05-s0'>p/p05 s0</a>" in page and "Tails: what the prompts rule out" in page
    assert "⚠" in markdown(res, "t", {}).split("## Verdicts")[0]  # the study table's cell carries the flag
    assert tails(analyse(*with_metric("q", {"treat": d}), ["treat"], StatsSpec(2000, 0.95, 0)))[1] == []

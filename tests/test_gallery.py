"""gallery: control beside each treatment from real encoded videos, worst pair first, with
each pair's numbers equal to its score records; the page loads in headless Chromium. What
the page inlines under its caps: ``test_media_budget``."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pytest
from conftest import ROOT, generation_record, metric_spec, score_record, small_config, timing_record, write_config

from pairflow.layout import Layout
from pairflow.media.video import encode
from pairflow.plan.config import EncoderSpec, StudySpec, study_from_raw
from pairflow.report import gallery

# temporal_flickering (NR, higher is better) per (prompt, arm); psnr (FR) per prompt.
FLICKER = {("a1", "control"): 0.91, ("a1", "pab"): 0.85, ("a2", "control"): 0.90, ("a2", "pab"): 0.92}
PSNR = {"a1": 21.5, "a2": 34.25}


def _frames(shift: int) -> np.ndarray:
    """5 frames of 32x32 gradients moving by ``shift`` pixels a frame (uint8 RGB)."""
    x = np.arange(32, dtype=np.int32)
    frames = [np.stack([(x[None, :] * 8 + t * shift) % 256 + 0 * x[:, None],
                        (x[:, None] * 8) % 256 + 0 * x[None, :],
                        np.full((32, 32), 40 * t % 256)], axis=-1) for t in range(5)]
    return np.asarray(frames, dtype=np.uint8)


def gallery_tree(tmp_path: Path, tiny_model: Path,
                 encoder_spec: EncoderSpec) -> tuple[StudySpec, list[Any], list[Any], list[Any]]:
    """A scored and timed panel (2 prompts x 1 seed, control + pab) whose videos are real
    H.264 files and whose records are shaped as the stages write them (also
    ``test_media_budget``'s)."""
    cfg = small_config(tmp_path, tiny_model)
    write_config(tmp_path, cfg)
    study = study_from_raw(cfg, tmp_path)
    panel = Layout(study.scratch).panel("t")
    gen, scores, timings = [], [], []
    for pid in ("a1", "a2"):
        recs = {}
        for arm, shift in (("control", 3), ("pab", 5)):
            rec = generation_record("t", pid, 0, arm, 1, f"{pid}{arm}")
            rec["candidate"]["prompt"] = {"a1": "a red fox in snow", "a2": "waves on a beach"}[pid]
            info = encode(_frames(shift), panel / rec["video"]["path"], encoder_spec, 8)
            rec["video"]["frames"], rec["video"]["digest"] = info.frames, info.digest
            recs[arm] = rec
            gen.append(rec)
        for arm, rec in recs.items():
            metrics = {"temporal_flickering": (FLICKER[(pid, arm)], metric_spec("temporal_flickering"))}
            if arm != "control":
                metrics["psnr"] = (PSNR[pid], metric_spec("psnr", "FR"))
            scores.append({**score_record(rec, recs["control"], metrics), "record_digest": f"xxh3_128:{pid}{arm}"})
            timings.append(timing_record(rec, 2.0 if arm == "control" else {"a1": 1.0, "a2": 0.5}[pid]))
    return study, gen, scores, timings


@pytest.fixture
def tree(tmp_path: Path, tiny_model: Path, encoder_spec: EncoderSpec) -> tuple[StudySpec, list[Any], list[Any],
                                                                                 list[Any]]:
    return gallery_tree(tmp_path, tiny_model, encoder_spec)


def test_pairs_are_worst_first_and_carry_the_records_numbers(tree: tuple[Any, ...]) -> None:
    study, gen, scores, timings = tree
    views = gallery.pairs(study, gen, scores, timings)
    assert list(views) == [("t", "pab")]
    first, second = views[("t", "pab")]
    # a1 is worse on both metrics (flicker falls 0.06, PSNR 21.5 dB), a2 better on both
    assert (first.prompt_id, second.prompt_id) == ("a1", "a2")
    flick = next(m for m in first.metrics if m.name == "temporal_flickering")
    assert (flick.control, flick.treatment, flick.diff, flick.worse) == (0.91, 0.85, 0.85 - 0.91, True)
    psnr = next(m for m in first.metrics if m.name == "psnr")
    assert (psnr.control, psnr.treatment, psnr.diff) == (None, 21.5, None)
    assert (first.speedup, second.speedup) == (2.0, 4.0)
    assert first.score_digest == "xxh3_128:a1pab"


def test_a_pair_identical_to_control_is_marked_and_its_fidelity_left_out(tree: tuple[Any, ...],
                                                                          tmp_path: Path) -> None:
    """Regression (issue 41): the gallery showed an identical pair's capped PSNR unmarked,
    where the table leaves it out of the mean. One definition: ``records.identical_to_control``."""
    study, gen, scores, timings = tree
    ctrl = next(r for r in gen if r["candidate"]["prompt_id"] == "a2" and r["arm"]["name"] == "control")
    treat = next(r for r in gen if r["candidate"]["prompt_id"] == "a2" and r["arm"]["name"] == "pab")
    treat["video"]["raw_digest"] = ctrl["video"]["raw_digest"]  # the same frames, bit for bit
    views = gallery.pairs(study, gen, scores, timings)[("t", "pab")]
    assert {v.prompt_id: v.identical for v in views} == {"a1": False, "a2": True}
    gallery.write_gallery(study, gen, scores, timings, tmp_path / "g.html")
    page = (tmp_path / "g.html").read_text()
    assert "1 of 2 pairs identical to control: marked, and left out of every fidelity mean" in page
    assert page.count("data-identical='true'") == 1 and page.count("data-identical='false'") == 1
    a2 = page[page.index("id='t-pab-a2-s0'"):]
    assert a2.index("(identical to control)") < a2.index("(vs control; left out of the mean: identical)")


def _browser() -> None:
    if not (shutil.which("chromium") and importlib.util.find_spec("playwright")):
        if os.environ.get("PAIRFLOW_REQUIRE_BROWSER"):
            raise AssertionError("PAIRFLOW_REQUIRE_BROWSER is set but chromium or playwright is missing")
        pytest.skip("needs Debian's chromium and playwright (see docs/results-and-reports.md, Reports)")


def test_gallery_in_chromium_plays_both_arms_and_shows_the_records_numbers(tree: tuple[Any, ...],
                                                                          tmp_path: Path) -> None:
    """The page as a reader sees it: every pair plays control's and the treatment's video
    side by side (both loaded, decoded by Debian's chromium, which plays H.264 through the
    system FFmpeg, and running together), shows both filmstrips (decoded and drawn),
    labelled, links both mp4s (files that exist), and every number equals its record."""
    _browser()
    study, gen, scores, timings = tree
    out = tmp_path / "gallery.html"
    gallery.write_gallery(study, gen, scores, timings, out)
    sys.path.insert(0, str(ROOT / "workflow" / "checks"))
    from playwright.sync_api import sync_playwright
    from report_screenshot import CHROMIUM, FLAGS, gallery_pairs

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(out.as_uri())
        shown = gallery_pairs(page, play_s=15)
        page.screenshot(path=str(tmp_path / "gallery.png"))
        browser.close()
    assert [(s["arm"], s["prompt"], s["seed"]) for s in shown] == [("pab", "a1", 0), ("pab", "a2", 0)]
    by_key = {(r["candidate"]["prompt_id"], r["arm"]["name"]): r for r in scores}
    videos = {(r["candidate"]["prompt_id"], r["arm"]["name"]): Layout(study.scratch).panel("t") / r["video"]["path"]
              for r in gen}
    for s in shown:
        assert s["shows"] == "plays" and [v["label"] for v in s["videos"]] == ["control", "pab"]
        for v in s["videos"]:  # loaded (readyState >= HAVE_CURRENT_DATA), decoded, drawn, and playing
            assert v["error"] is None and v["ready"] >= 2 and (v["w"], v["h"]) == (32, 32), v
            assert v["shown"] >= gallery.PLAYER_MIN_PX and v["time"] > 0 and not v["paused"], v
        control, treatment = s["videos"]  # started together and restarted together: within a few frames
        assert abs(control["time"] - treatment["time"]) < 0.3, s["videos"]
        assert [Path(unquote(urlparse(u).path)) for u in s["links"]] == [
            videos[(s["prompt"], "control")].resolve(), videos[(s["prompt"], "pab")].resolve()]
        assert all(Path(unquote(urlparse(u).path)).is_file() for u in s["links"])
        assert s["labels"] == ["control", "pab"]
        assert len(s["images"]) == 2 and all(i["w"] == 5 * 96 and i["h"] == 96 and i["shown"] > 100
                                             for i in s["images"])
        rec, ctrl = by_key[(s["prompt"], "pab")], by_key[(s["prompt"], "control")]
        assert s["digest"] == rec["record_digest"]
        for m in s["metrics"]:
            value = rec["scores"][m["metric"]]["value"]
            assert float(m["treatment"]) == value and m["cells"][2] == f"{value:.4g}"
            if m["metric"] in ctrl["scores"]:
                diff = value - ctrl["scores"][m["metric"]]["value"]
                assert float(m["control"]) == ctrl["scores"][m["metric"]]["value"] and float(m["diff"]) == diff
                assert m["cells"][3] == f"{diff:.4g}"
    assert (tmp_path / "gallery.png").stat().st_size > 10_000


def test_each_arm_carries_its_study_verdicts_worded_as_every_report_words_them() -> None:
    """Issue 39: the gallery words a verdict as the table does (``verdicts.verdict_text``)."""
    from pairflow.analysis.verdicts import verdict_text
    from pairflow.report.gallery import arm_verdicts

    m = {"metric": "q", "verdict_code": "inferior", "verdict": "inferior", "p_verdict": 0.01,
         "p_verdict_test": "non-inferiority (loss = margin 0.1)", "p_verdict_family": "Holm over the table's 3 tests"}
    free = {"metric": "psnr", "verdict_code": None, "verdict": None}
    out = arm_verdicts({"comparisons": [{"treatment": "a", "metrics": [m, free]}]})
    assert out == {"a": f"q: {verdict_text(m)}"} and "inferior (p 0.01: non-inferiority" in out["a"]
    assert arm_verdicts(None) == {}


SPAN = re.compile(r"<span class='verdict' data-verdict='(\w+)' style='color:(#\w+);font-weight:bold'>")


def test_verdict_words_are_coloured_alike_in_the_table_the_answer_line_and_the_gallery(
        tree: tuple[Any, ...], tmp_path: Path) -> None:
    """Issue 41: verdict words were not coloured. The study table's cells, its answer line
    and the gallery's verdict line colour each verdict code with ``verdicts.COLOURS``."""
    import json

    from test_stats import S, records

    from pairflow.analysis.stats import analyse
    from pairflow.analysis.verdicts import COLOURS, PHRASES
    from pairflow.report.table import html as table_html

    page = table_html(analyse(*records(effect=-0.2, ratio=1.5), ["treat"], S), "t", {})
    answer_html = page[page.index("<ul class='answer'>"):page.index("</ul>")]
    cells = page[page.index("</ul>"):]
    study, gen, scores, timings = tree
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"comparisons": [{"treatment": "pab", "metrics": [
        {"metric": f"m{i}", "verdict_code": code, "verdict": PHRASES[code], "p_verdict": 0.01,
         "p_verdict_test": "difference from 0", "p_verdict_family": "Holm"} for i, code in enumerate(PHRASES)]}]}))
    gallery.write_gallery(study, gen, scores, timings, tmp_path / "g.html", stats)
    shown = (tmp_path / "g.html").read_text()
    line = shown[shown.index("<p class='verdicts'>"):]
    line = line[:line.index("</p>")]
    for where, part, least in (("answer line", answer_html, 1), ("table", cells, 1), ("gallery", line, 6)):
        spans = SPAN.findall(part)
        assert len({c for c, _ in spans}) >= least, (where, spans)
        assert all(colour == COLOURS[code] for code, colour in spans), (where, spans)
    assert [c for c, _ in SPAN.findall(line)] == list(PHRASES)  # every code, in the arm's metric order

"""media_budget: what the gallery page inlines under its caps, from real encoded videos
(``test_gallery.gallery_tree``): the worst pairs play first, then filmstrips of real
decoded frames, each clip checked against its record's digest and stored once; past a
cap a pair keeps its numbers and says why; past the page cap the best pairs without media
are left out and counted; FFmpeg making a filmstrip is killed at its bound."""

from __future__ import annotations

import dataclasses
import html
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_gallery import gallery_tree

from pairflow.errors import IntegrityError, ToolTimeoutError, VideoReadError
from pairflow.layout import Layout
from pairflow.media.recipe import ffmpeg_binary
from pairflow.plan.config import EncoderSpec, StudySpec
from pairflow.report import gallery, media_budget


@pytest.fixture
def tree(tmp_path: Path, tiny_model: Path, encoder_spec: EncoderSpec) -> tuple[StudySpec, list[Any], list[Any],
                                                                                 list[Any]]:
    return gallery_tree(tmp_path, tiny_model, encoder_spec)


def test_frame_indices_span_the_video() -> None:
    assert media_budget.frame_indices(81) == [0, 16, 32, 48, 64, 80]
    assert media_budget.frame_indices(9) == [0, 2, 3, 5, 6, 8]
    assert media_budget.frame_indices(4) == [0, 1, 2, 3]


def test_filmstrip_tiles_real_decoded_frames(tree: tuple[Any, ...], tmp_path: Path) -> None:
    from PIL import Image

    study, gen, _, _ = tree
    video = Layout(study.scratch).panel("t") / gen[0]["video"]["path"]
    out = tmp_path / "strip.jpg"
    media_budget.filmstrip(video, 5, out, ffmpeg_binary(study.encoder))
    img = np.asarray(Image.open(out).convert("RGB"), dtype=np.float64)
    assert img.shape == (media_budget.STRIP_HEIGHT, 5 * media_budget.STRIP_HEIGHT, 3)  # 32x32 frames scaled to 96 px
    # the blue channel is 40 * t: each tile is its frame, in order
    blues = [img[:, i * 96:(i + 1) * 96, 2].mean() for i in range(5)]
    assert blues == sorted(blues) and blues[-1] - blues[0] > 100
    with pytest.raises(VideoReadError, match="could not make the gallery's filmstrip"):
        media_budget.filmstrip(tmp_path / "missing.mp4", 5, tmp_path / "x.jpg", ffmpeg_binary(study.encoder))


def test_size_caps_leave_pairs_listed_without_media_and_the_page_says_so(tree: tuple[Any, ...], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    study, gen, scores, timings = tree
    out = tmp_path / "g.html"
    used = gallery.write_gallery(study, gen, scores, timings, out)
    clips = sum((Layout(study.scratch).panel("t") / r["video"]["path"]).stat().st_size for r in gen)
    assert (used["pairs"], used["playing"], used["shown"], used["video_bytes"]) == (2, 2, 2, clips)
    assert "2 pairs: 2 play, 0 filmstrips only, 0 numbers only." in out.read_text()
    monkeypatch.setattr(media_budget, "MAX_PAIRS", 1)
    used = gallery.write_gallery(study, gen, scores, timings, out)
    assert (used["pairs"], used["playing"], used["shown"]) == (2, 1, 1) and 0 < used["bytes"] <= media_budget.MAX_BYTES
    page = out.read_text()
    assert "2 pairs: 1 play, 0 filmstrips only, 1 numbers only." in page
    assert "numbers only: only the worst 1 pairs per arm get players and filmstrips" in page
    monkeypatch.setattr(media_budget, "MAX_PAIRS", 6)
    monkeypatch.setattr(media_budget, "MAX_BYTES", 1)  # no pair's media fit: each pair keeps its numbers and links
    monkeypatch.setattr(media_budget, "VIDEO_BYTES", 1)
    used = gallery.write_gallery(study, gen, scores, timings, out)
    page = html.unescape(out.read_text())
    assert (used["playing"], used["shown"], used["bytes"]) == (0, 0, 0) and "reached their 0 KiB cap" in page
    assert page.count("is larger than the page's whole video budget (0 KiB); open the mp4s below") == 2
    assert page.count("class='mp4'") == 4 and "2 pairs: 0 play, 0 filmstrips only, 2 numbers only." in page


def test_the_video_budget_plays_the_worst_pairs_and_stores_a_control_clip_once(
        tree: tuple[Any, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study, gen, scores, timings = tree
    panel = Layout(study.scratch).panel("t")
    a1 = sum((panel / r["video"]["path"]).stat().st_size for r in gen if r["candidate"]["prompt_id"] == "a1")
    monkeypatch.setattr(media_budget, "VIDEO_BYTES", a1)  # room for the worst pair's two clips only
    out = tmp_path / "g.html"
    used = gallery.write_gallery(study, gen, scores, timings, out)
    page = html.unescape(out.read_text())
    assert (used["playing"], used["video_bytes"], used["shown"]) == (1, a1, 2)
    shows = {s: page[page.index(f"id='t-pab-{s}-s0'"):].split("data-shows='")[1][:5] for s in ("a1", "a2")}
    assert shows == {"a1": "plays", "a2": "films"}
    assert f"no player: the page's videos reached their {a1 / 1024:.0f} KiB budget" in page
    assert page.count("data:video/mp4;base64,") == 2 and page.count("<video ") == 2


def test_a_video_that_is_not_the_recorded_one_is_refused(tree: tuple[Any, ...], tmp_path: Path) -> None:
    study, gen, scores, timings = tree
    gen[1]["video"]["digest"] = "xxh3_128:" + "0" * 32
    with pytest.raises(IntegrityError, match="but its generation record says xxh3_128:0+: the video changed"):
        gallery.write_gallery(study, gen, scores, timings, tmp_path / "g.html")


def test_past_the_page_cap_the_best_pairs_without_media_are_left_out_and_counted(
        tree: tuple[Any, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study, gen, scores, timings = tree
    monkeypatch.setattr(media_budget, "MAX_PAIRS", 1)
    monkeypatch.setattr(media_budget, "PAGE_BYTES", 1)  # every pair without media must go
    used = gallery.write_gallery(study, gen, scores, timings, tmp_path / "g.html")
    page = (tmp_path / "g.html").read_text()
    assert (used["pairs"], used["listed"], used["playing"]) == (2, 1, 1)
    assert "id='t-pab-a1-s0'" in page and "id='t-pab-a2-s0'" not in page  # the worst stays, with its media
    assert "2 pairs: 1 play, 0 filmstrips only, 0 numbers only, 1 left out of this page (its 0 KiB cap" in page


def test_a_hung_ffmpeg_making_a_filmstrip_is_killed_at_its_bound(tree: tuple[Any, ...], tmp_path: Path) -> None:
    """Issue 40: the gallery's ffmpeg had no bound at all. It runs through the one tool
    seam now, killed at min(the work's tool timeout, fleet.stall_timeout_s)."""
    study, gen, _, _ = tree
    video = Layout(study.scratch).panel("t") / gen[0]["video"]["path"]
    hung = tmp_path / "hung-ffmpeg"
    hung.write_text("#!/bin/sh\nexec sleep 600\n")
    hung.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError, match=r"hung-ffmpeg ran past its 2 s timeout \(a test's bound\) and was "
                       r"killed; command: "):
        media_budget.filmstrip(video, 5, tmp_path / "x.jpg", str(hung), 2.0, "a test's bound")
    assert time.monotonic() - started < 30 and not (tmp_path / "x.jpg").exists()
    assert media_budget.strip_timeout(study)[1] == ""  # tiny videos: the work's 120 s bound, under the stall rule's 600 s
    short = dataclasses.replace(study, fleet=dataclasses.replace(study.fleet, stall_timeout_s=30.0))
    assert media_budget.strip_timeout(short) == (30.0, "fleet/stall_timeout_s: one filmstrip is one step of the gallery")


@dataclass
class _Pair:
    """The least a pair is to the budget (``media_budget.Pair``), named for the test."""

    name: str
    control_video: Path = Path("c.mp4")
    treatment_video: Path = Path("t.mp4")
    frames: int = 5
    digests: tuple[str, str] = ("", "")
    videos: tuple[str, str] | None = None
    images: tuple[str, str] | None = None
    notes: list[str] = field(default_factory=list)


def test_trim_leaves_out_the_best_pairs_without_media_from_the_bottom_across_the_arms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank by rank from the last, the later arm first, until the page fits; a pair with
    media is never left out, however far past the cap the page stays."""
    def views() -> dict[tuple[str, str], list[_Pair]]:
        return {(p, a): [_Pair(f"{a}{i}", videos=("v0", "v1") if i == 0 else None) for i in range(3)]
                for p, a in (("t", "a"), ("t", "b"))}

    monkeypatch.setattr(media_budget, "PAGE_BYTES", 350)
    vs = views()
    htmls = {id(v): "x" * 100 for pairs in vs.values() for v in pairs}  # 600 bytes: three must go
    assert media_budget.trim(vs, htmls, 0) == 3
    assert {k: [v.name for v in pairs] for k, pairs in vs.items()} == {("t", "a"): ["a0", "a1"], ("t", "b"): ["b0"]}
    assert len(htmls) == 3
    monkeypatch.setattr(media_budget, "PAGE_BYTES", 0)
    vs = views()
    htmls = {id(v): "x" * 100 for pairs in vs.values() for v in pairs}
    assert media_budget.trim(vs, htmls, 0) == 4
    assert {k: [v.name for v in pairs] for k, pairs in vs.items()} == {("t", "a"): ["a0"], ("t", "b"): ["b0"]}

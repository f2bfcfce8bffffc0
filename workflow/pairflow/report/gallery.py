"""The video gallery: control beside each treatment for the same prompt and seed.

Per panel and treatment arm, each (prompt, seed) pair is shown as two filmstrips of real
decoded frames (``FRAMES`` frames evenly spaced over the video, each ``STRIP_HEIGHT``
pixels high, JPEG), control's above the treatment's, with that pair's per-metric values
and differences read from its score records (and its latency ratio from the timed pass)
beside it. Pairs are sorted worst first: on each metric the pairs are ranked from worst
to best in the metric's direction (NR metrics by treatment − control, FR metrics by the
value against control), and a pair's place is its mean rank over the metrics.

Size: at most ``MAX_PAIRS`` pairs per panel and arm get images (the worst ones, handed out
rank by rank across the arms so that no arm is starved), and the images of the whole
gallery stop at ``MAX_BYTES``; pairs past either cap are listed with
their numbers and no image, and the page says how many. The videos stay on scratch; only
the filmstrips are kept, inlined into one self-contained HTML page (JPEG data URIs; a
control strip once per pair, shared by every arm), so the Snakemake report embeds the
page like any other result. Frames are decoded and tiled by FFmpeg (the same binary as the encoder,
``video.ffmpeg_binary``). Imports without torch.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.verdicts import verdict_text
from ..atomic import write_text
from ..errors import VideoReadError
from ..identity import digest_file
from ..layout import Layout
from ..media.recipe import ffmpeg_binary
from ..media.tools import TOOL_TIMEOUT_FLOOR_S, run_tool, tool_timeout
from ..plan.config import StudySpec
from ..records.store import IDENTICAL, identical_to_control
from ..records.types import GenerationRecord, ScoreRecord, TimingRecord
from .plots import arm_colours

FRAMES = 6
"""Frames per filmstrip, evenly spaced from the first to the last."""
STRIP_HEIGHT = 96
"""Pixels per frame row (width follows the video's aspect ratio)."""
MAX_PAIRS = 6
"""Pairs with images per panel and treatment arm (the worst ones)."""
MAX_BYTES = 960 * 2**10
"""All the gallery's images together (960 KiB of JPEG). The Snakemake report embeds a
result page as a base64 ``data:`` URL, and Chromium opens no such URL over 2 MiB: 960 KiB,
base64-encoded twice (inlined here, then by the report), stays under it. Past the cap,
pairs are listed with their numbers and no image."""
QUALITY = 5
"""FFmpeg's JPEG quality scale (2 best, 31 worst)."""


@dataclass
class MetricView:
    """One metric of one pair: control's and the treatment's values, their difference (NR
    metrics; FR metrics compare against control, so they have one value), which way is
    better, and whether the treatment is worse than control on it."""

    name: str
    kind: str
    higher_is_better: bool
    control: float | None
    treatment: float
    diff: float | None

    @property
    def badness(self) -> float:
        """Larger is worse: the difference (FR: the value) against the metric's direction."""
        x = self.diff if self.diff is not None else self.treatment
        return -x if self.higher_is_better else x

    @property
    def worse(self) -> bool | None:
        return None if self.diff is None else self.badness > 0


@dataclass
class PairView:
    """One (prompt, seed) of one treatment arm against control."""

    panel: str
    arm: str
    prompt_id: str
    seed: int
    prompt: str
    control_video: Path
    treatment_video: Path
    frames: int
    metrics: list[MetricView]
    score_digest: str
    control_score_digest: str
    speedup: float | None
    rank: float = 0.0
    identical: bool = False  # records.identical_to_control: marked, fidelity values left out of every mean
    images: tuple[str, str] | None = None  # (control, treatment) image keys
    notes: list[str] = field(default_factory=list)

    @property
    def stem(self) -> str:
        return f"{self.prompt_id}-s{self.seed}"


Key = tuple[str, str, int, str]  # (panel, prompt id, seed, arm)


def _index(records: Sequence[Mapping[str, Any]]) -> dict[Key, Any]:
    return {(r["candidate"]["panel"], r["candidate"]["prompt_id"], r["candidate"]["seed"], r["candidate"]["arm"]): r
            for r in records}


def pairs(study: StudySpec, gen: list[GenerationRecord], scores: list[ScoreRecord],
          timings: list[TimingRecord]) -> dict[tuple[str, str], list[PairView]]:
    """Every (panel, treatment) -> its pairs, worst first (``rank``: mean rank over the
    metrics, 0 = worst on every metric)."""
    g, s, t = _index(gen), _index(scores), _index(timings)
    layout = Layout(study.scratch)
    out: dict[tuple[str, str], list[PairView]] = {}
    for panel in study.panels:
        for arm in (a for a in study.arms if not a.is_control):
            views = []
            for p in panel.prompts:
                for seed in panel.seeds:
                    kc, kt = (panel.name, p.prompt_id, seed, "control"), (panel.name, p.prompt_id, seed, arm.name)
                    if kt not in s or kc not in s or kt not in g or kc not in g:
                        continue
                    sc, st = s[kc]["scores"], s[kt]["scores"]
                    metrics = [MetricView(name, e["spec"]["kind"], e["spec"]["higher_is_better"],
                                          None if e["spec"]["kind"] == "FR" else sc[name]["value"], e["value"],
                                          None if e["spec"]["kind"] == "FR" else e["value"] - sc[name]["value"])
                               for name, e in sorted(st.items()) if e["spec"]["kind"] == "FR" or name in sc]
                    lc, lt = (t.get(k, {}).get("timing", {}).get("latency_s") for k in (kc, kt))
                    views.append(PairView(
                        panel.name, arm.name, p.prompt_id, seed, p.text,
                        layout.panel(panel.name) / g[kc]["video"]["path"],
                        layout.panel(panel.name) / g[kt]["video"]["path"], int(g[kt]["video"]["frames"]), metrics,
                        str(s[kt].get("record_digest")), str(s[kc].get("record_digest")),
                        lc / lt if lc and lt else None, identical=identical_to_control(g[kc], g[kt])))
            _rank(views)
            out[(panel.name, arm.name)] = sorted(views, key=lambda v: (v.rank, v.prompt_id, v.seed))
    return out


def _rank(views: list[PairView]) -> None:
    """Set each view's ``rank``: its mean over metrics of its rank from worst (0) to best."""
    names = sorted({m.name for v in views for m in v.metrics})
    for v in views:
        v.rank = 0.0
    for name in names:
        have = [v for v in views if any(m.name == name for m in v.metrics)]
        ordered = sorted(have, key=lambda v: -next(m.badness for m in v.metrics if m.name == name))
        for i, v in enumerate(ordered):
            v.rank += i / max(len(names), 1)


def frame_indices(frames: int, n: int = FRAMES) -> list[int]:
    """``n`` frame indices evenly spaced from the first frame to the last (fewer when the
    video has fewer frames)."""
    if frames <= n:
        return list(range(frames))
    return sorted({round(i * (frames - 1) / (n - 1)) for i in range(n)})


def filmstrip(video: Path, frames: int, out: Path, binary: str, timeout_s: float = TOOL_TIMEOUT_FLOOR_S,
              bound: str = "") -> None:
    """Decode ``video`` with FFmpeg and tile ``frame_indices(frames)`` in one row,
    ``STRIP_HEIGHT`` pixels high, into the JPEG ``out``, through the one seam to external
    tools (``media.tools.run_tool``: killed after ``timeout_s``, ``bound`` saying where
    that limit came from). Raises VideoReadError with FFmpeg's stderr when decoding
    fails, ToolTimeoutError when it hangs."""
    idx = frame_indices(frames)
    select = "+".join(f"eq(n\\,{i})" for i in idx)
    vf = f"select='{select}',scale=-2:{STRIP_HEIGHT}:flags=area,tile={len(idx)}x1"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [binary, "-nostdin", "-v", "error", "-y", "-i", str(video), "-vf", vf, "-frames:v", "1",
            "-q:v", str(QUALITY), "-update", "1", str(out)]
    code, err, _ = run_tool(argv, video, timeout_s, bound=bound)
    if code or not out.is_file():
        raise VideoReadError(f"{video}: FFmpeg could not make the gallery's filmstrip "
                             f"({err.decode(errors='replace').strip()[-500:]}); run `pairflow verify` on the "
                             "results tree: the video may be damaged")


def strip_timeout(study: StudySpec) -> tuple[float, str]:
    """How long one filmstrip may take, and why: the work's ffmpeg timeout
    (``tool_timeout`` over one video), never more than the stall rule
    (``fleet.stall_timeout_s``: a filmstrip is one step that reports no progress)."""
    g = study.generation
    work = tool_timeout(g.frames, g.height, g.width)
    if work <= study.fleet.stall_timeout_s:
        return work, ""
    return study.fleet.stall_timeout_s, "fleet/stall_timeout_s: one filmstrip is one step of the gallery"


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def _fr_note(identical: bool) -> str:
    """The Δ cell of a fidelity metric, which has no difference: what its value is."""
    return "(vs control; left out of the mean: identical)" if identical else "(vs control)"


def _pair_html(v: PairView, colours: dict[str, str]) -> str:
    e = html.escape
    rows = "".join(
        f"<tr data-metric='{e(m.name)}' data-treatment='{m.treatment!r}' data-control='{m.control!r}' "
        f"data-diff='{m.diff!r}'><td>{e(m.name)}{' (dB)' if m.name == 'psnr' else ''}"
        f"<br><small>{'higher' if m.higher_is_better else 'lower'} is better</small></td>"
        f"<td>{_fmt(m.control)}</td><td>{_fmt(m.treatment)}</td>"
        f"<td class='{'worse' if m.worse else 'better' if m.worse is False else ''}'>"
        f"{_fmt(m.diff) if m.diff is not None else _fr_note(v.identical)}</td></tr>" for m in v.metrics)
    speed = "" if v.speedup is None else f"<p>speedup of this pair: <b>{v.speedup:.3f}×</b></p>"
    if v.images:
        strips = (f"<div class='strip'><span class='lab' style='border-color:{colours['control']}'>control</span>"
                  f"<img alt='control {e(v.stem)}' data-img='{e(v.images[0])}'></div>"
                  f"<div class='strip'><span class='lab' style='border-color:{colours.get(v.arm, '#000')}'>"
                  f"{e(v.arm)}</span><img alt='{e(v.arm)} {e(v.stem)}' data-img='{e(v.images[1])}'></div>")
    else:
        strips = f"<p class='noimg'>{e('; '.join(v.notes) or 'no image')}</p>"
    prompt = v.prompt if len(v.prompt) <= 240 else v.prompt[:237] + "..."
    same = (f"<p class='identical'><b>{IDENTICAL}</b> (the same frames, bit for bit): its fidelity values are the "
            "metrics' cap, not a measurement, and are left out of every fidelity mean</p>" if v.identical else "")
    return (f"<div class='pair{' identical' if v.identical else ''}' id='{e(v.panel)}-{e(v.arm)}-{e(v.stem)}' "
            f"data-arm='{e(v.arm)}' data-prompt='{e(v.prompt_id)}' data-seed='{v.seed}' "
            f"data-identical='{str(v.identical).lower()}' data-score-digest='{e(v.score_digest)}'>"
            f"<h4>{e(v.prompt_id)}, seed {v.seed}{f' ({IDENTICAL})' if v.identical else ''}</h4>"
            f"<p class='prompt'>{e(prompt)}</p>{same}"
            f"<div class='media'>{strips}</div><table><tr><th>metric</th><th>control</th><th>{e(v.arm)}</th>"
            f"<th>Δ</th></tr>{rows}</table>{speed}</div>")


_STYLE = ("body{font-family:sans-serif;margin:1em;max-width:1400px} "
          ".pair{border:1px solid #ccc;padding:6px;margin:8px 0;display:grid;"
          "grid-template-columns:minmax(0,1fr) auto;gap:4px 16px} "
          ".pair h4,.pair .prompt{grid-column:1/3;margin:2px 0} .prompt{color:#444;font-size:90%} "
          ".strip{display:flex;align-items:center;gap:6px;margin:2px 0;min-width:0} "
          ".strip img{max-width:calc(100% - 7em);height:auto} "
          ".lab{width:6em;border-left:6px solid;padding-left:4px;font-weight:bold} "
          "td,th{border:1px solid #ddd;padding:2px 6px;text-align:right} table{border-collapse:collapse;font-size:90%} "
          ".worse{background:#fdd} .better{background:#dfd} nav a{margin-right:1em} "
          ".identical{background:#f4f4f4} p.identical{color:#555;margin:2px 0;grid-column:1/3}")


def arm_verdicts(stats: Mapping[str, Any] | None) -> dict[str, str]:
    """Per treatment arm of the study statistics, each metric's verdict as every report
    words it (``verdicts.verdict_text``: the phrase, the deciding test's p and its family),
    e.g. ``temporal_flickering: inferior (p 0.003: ...)``; metrics without a question are
    left out."""
    out = {}
    for c in (stats or {}).get("comparisons", []):
        words = [f"{m['metric']}: {verdict_text(m)}" for m in sorted(c["metrics"], key=lambda m: m["metric"])
                 if m.get("verdict_code")]
        if words:
            out[c["treatment"]] = "; ".join(words)
    return out


def write_gallery(study: StudySpec, gen: list[GenerationRecord], scores: list[ScoreRecord],
                  timings: list[TimingRecord], out: Path, stats_json: Path | None = None) -> dict[str, int]:
    """Write the gallery page ``out`` (one HTML file, filmstrips inlined) atomically.
    Returns counts: pairs, pairs with images, image bytes. Raises VideoReadError when
    FFmpeg cannot decode a video."""
    binary = ffmpeg_binary(study.encoder)
    limit = strip_timeout(study)
    views = pairs(study, gen, scores, timings)
    colours = arm_colours([a.name for a in study.arms])
    used = {"pairs": 0, "shown": 0, "bytes": 0}
    verdicts = arm_verdicts(json.loads(stats_json.read_text()) if stats_json and stats_json.is_file() else None)
    made: dict[Path, str] = {}  # video -> image key: a control strip is stored once, shown beside every arm
    uris: dict[str, str] = {}
    body = []
    with tempfile.TemporaryDirectory(prefix="pairflow-gallery-") as tmp:

        def strip(video: Path, frames: int) -> str | None:
            """``video``'s filmstrip as a data URI (made once), or None past the size cap."""
            if video in made:
                return made[video]
            if used["bytes"] >= MAX_BYTES:
                return None
            jpeg = Path(tmp) / f"{len(made)}.jpg"
            filmstrip(video, frames, jpeg, binary, *limit)
            data = jpeg.read_bytes()
            used["bytes"] += len(data)
            made[video] = f"i{len(made)}"
            uris[made[video]] = "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
            return made[video]

        for i in range(MAX_PAIRS):  # rank by rank across the arms: the cap never starves a later arm
            for vs in views.values():
                if i < len(vs):
                    v = vs[i]
                    c, t = strip(v.control_video, v.frames), strip(v.treatment_video, v.frames)
                    if c is not None and t is not None:
                        v.images = (c, t)
                    else:
                        v.notes.append(f"no image: the gallery's images reached their {MAX_BYTES // 2**10} KiB "
                                       "cap")
        for (panel, arm), vs in views.items():
            used["pairs"] += len(vs)
            for v in vs[MAX_PAIRS:]:
                v.notes.append(f"no image: only the worst {MAX_PAIRS} pairs per arm get images")
            shown = sum(1 for v in vs if v.images)
            same = sum(1 for v in vs if v.identical)
            used["shown"] += shown
            body.append(f"<h2 id='{html.escape(panel)}-{html.escape(arm)}'>panel {html.escape(panel)}: "
                        f"<span style='color:{colours.get(arm, '#000')}'>{html.escape(arm)}</span> against control"
                        f"</h2><p>{len(vs)} pairs, worst first; {shown} with filmstrips."
                        + (f" {same} of {len(vs)} pairs {IDENTICAL}: marked, and left out of every fidelity "
                           "mean, as in the study table." if same else "") + "</p>"
                        + (f"<p class='verdicts'>Study verdicts: {html.escape(verdicts[arm])}</p>"
                           if arm in verdicts else ""))
            body += [_pair_html(v, colours) for v in vs]
    nav = "".join(f"<a href='#{html.escape(p)}-{html.escape(a)}'>{html.escape(p)}: {html.escape(a)}</a>"
                  for p, a in views)
    source = f" Statistics: {stats_json.name} {digest_file(stats_json)}." if stats_json else ""
    head = (f"<html><head><meta charset='utf-8'><title>{html.escape(study.study)}: gallery</title>"
            f"<style>{_STYLE}</style></head><body><h1>Study {html.escape(study.study)}: control beside each "
            f"treatment</h1><p>Each pair: {FRAMES} frames evenly spaced from first to last, decoded from the "
            "videos on scratch, control above, the treatment below (same prompt, same seed, same initial "
            "noise). Numbers are each pair's values from its score records (Δ: treatment − control; red: "
            "worse than control in the metric's direction, green: better); FR metrics (PSNR, SSIM) are the "
            "treatment's value against its control; a pair identical to control is marked, and its fidelity "
            "values (the metrics' cap) are left out of every fidelity mean, as in the study table. Pairs are "
            "sorted worst first: mean rank over the metrics, "
            f"each ranked from worst to best. Images: the worst {MAX_PAIRS} pairs per panel and arm, "
            f"{MAX_BYTES // 2**10} KiB in all at most, so the Snakemake report can embed this page "
            f"({used['shown']} of {used['pairs']} pairs shown, {used['bytes'] / 2**10:.0f} KiB). The videos "
            f"stay on scratch, under panels/&lt;panel&gt;/videos/.{html.escape(source)}</p><nav>{nav}</nav>")
    # Each image is stored once (in a script) and set on every <img> that names it.
    script = ("<script>const IMAGES = " + json.dumps(uris) + ";\nfor (const i of document.querySelectorAll("
              "'img[data-img]')) i.src = IMAGES[i.dataset.img];</script>")
    write_text(Path(out), head + "".join(body) + script + "</body></html>\n")
    return used

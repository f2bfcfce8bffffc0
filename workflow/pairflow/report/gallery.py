"""The video gallery: control beside each treatment for the same prompt and seed.

Per panel and treatment arm, each (prompt, seed) pair is one row: control's video beside
the treatment's as HTML5 players (muted, looping, started together and kept in step by a
small script, one play/pause button driving both), the two filmstrips of real decoded
frames below them (for print, where a ``@media print`` rule hides the players, and for
pairs that do not play), a link to each mp4 on scratch (its ``file://`` URI and its path),
and that pair's per-metric values and differences read from its score records (and its
latency ratio from the timed pass). Pairs are sorted worst first: on each metric the
pairs are ranked from worst to best in the metric's direction (NR metrics by treatment −
control, FR metrics by the value against control), and a pair's place is its mean rank
over the metrics. Each arm's study verdicts head its section, coloured as every HTML
report colours them (``verdicts.colour_verdicts``).

Size: the page is inlined whole, so the Snakemake report can embed it, under the caps of
``media_budget``, which decides which pairs play, which show filmstrips, which keep only
their numbers and which the page leaves out, and makes the filmstrips. The page says how
many pairs play, how many are filmstrips only and how many numbers only, and how many it
left out. Every pair links its mp4s whatever it shows. Imports without torch.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.verdicts import colour_verdicts, verdict_text
from ..atomic import write_text
from ..identity import digest_file
from ..layout import Layout
from ..plan.config import StudySpec
from ..records.store import IDENTICAL, identical_to_control
from ..records.types import GenerationRecord, ScoreRecord, TimingRecord
from . import media_budget
from .plots import arm_colours

PLAYER_MIN_PX = 192
"""The narrowest a player is drawn (CSS pixels): a smaller video is scaled up by a whole
factor, pixels kept square and sharp (the default study's 64x64 clips play at 192 px)."""


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
    digests: tuple[str, str] = ("", "")  # (control, treatment) video digests from the generation records
    images: tuple[str, str] | None = None  # (control, treatment) filmstrip media keys
    videos: tuple[str, str] | None = None  # (control, treatment) video media keys: the pair plays
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
                        lc / lt if lc and lt else None, identical=identical_to_control(g[kc], g[kt]),
                        digests=(str(g[kc]["video"]["digest"]), str(g[kt]["video"]["digest"]))))
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

def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def _fr_note(identical: bool) -> str:
    """The Δ cell of a fidelity metric, which has no difference: what its value is."""
    return "(vs control; left out of the mean: identical)" if identical else "(vs control)"


def _player(v: PairView, colours: dict[str, str], size: tuple[int, int]) -> str:
    """Control's clip beside the treatment's, and one button for both (the page's script
    starts them together and keeps them in step). ``size``: the video's width and height."""
    if v.videos is None:
        return ""
    e = html.escape
    w, h = size
    k = 1 if w >= PLAYER_MIN_PX else math.ceil(PLAYER_MIN_PX / max(w, 1))
    figs = "".join(
        f"<figure><figcaption class='vlab' style='border-color:{colours.get(arm, '#000')}'>{e(arm)}</figcaption>"
        f"<video muted loop playsinline autoplay preload='auto' width='{k * w}' height='{k * h}'"
        f"{' class=px' if k > 1 else ''} data-src='{e(key)}' title='{e(arm)} {e(v.stem)}'></video></figure>"
        for arm, key in (("control", v.videos[0]), (v.arm, v.videos[1])))
    return f"<div class='player'>{figs}<button type='button'>pause both</button></div>"


def _strips(v: PairView, colours: dict[str, str]) -> str:
    if v.images is None:
        return ""
    e = html.escape
    return "<div class='strips'>" + "".join(
        f"<div class='strip'><span class='lab' style='border-color:{colours.get(arm, '#000')}'>{e(arm)}</span>"
        f"<img alt='{e(arm)} {e(v.stem)}' data-src='{e(key)}'></div>"
        for arm, key in (("control", v.images[0]), (v.arm, v.images[1]))) + "</div>"


def _links(v: PairView) -> str:
    """Each mp4 on scratch: its ``file://`` URI (opens where the reader's browser sees
    that file system) and its path, to copy where a click cannot open it (inside the
    Snakemake report, a page loaded from a ``data:`` URL may not open ``file:`` links)."""
    e = html.escape
    parts = [f"<a class='mp4' href='{e(p.resolve().as_uri())}'>{e(arm)} mp4</a> <code>{e(str(p.resolve()))}</code>"
             for arm, p in (("control", v.control_video), (v.arm, v.treatment_video))]
    return "<p class='files'>" + "<br>".join(parts) + "</p>"


def _pair_html(v: PairView, colours: dict[str, str], size: tuple[int, int]) -> str:
    e = html.escape
    rows = "".join(
        f"<tr data-metric='{e(m.name)}' data-treatment='{m.treatment!r}' data-control='{m.control!r}' "
        f"data-diff='{m.diff!r}'><td>{e(m.name)}{' (dB)' if m.name == 'psnr' else ''}"
        f"<br><small>{'higher' if m.higher_is_better else 'lower'} is better</small></td>"
        f"<td>{_fmt(m.control)}</td><td>{_fmt(m.treatment)}</td>"
        f"<td class='{'worse' if m.worse else 'better' if m.worse is False else ''}'>"
        f"{_fmt(m.diff) if m.diff is not None else _fr_note(v.identical)}</td></tr>" for m in v.metrics)
    speed = "" if v.speedup is None else f"<p>speedup of this pair: <b>{v.speedup:.3f}×</b></p>"
    notes = f"<p class='noimg'>{e('; '.join(v.notes))}</p>" if v.notes else ""
    prompt = v.prompt if len(v.prompt) <= 240 else v.prompt[:237] + "..."
    same = (f"<p class='identical'><b>{IDENTICAL}</b> (the same frames, bit for bit): its fidelity values are the "
            "metrics' cap, not a measurement, and are left out of every fidelity mean</p>" if v.identical else "")
    shows = "plays" if v.videos else "filmstrips" if v.images else "numbers"
    return (f"<div class='pair{' identical' if v.identical else ''}' id='{e(v.panel)}-{e(v.arm)}-{e(v.stem)}' "
            f"data-arm='{e(v.arm)}' data-prompt='{e(v.prompt_id)}' data-seed='{v.seed}' data-shows='{shows}' "
            f"data-strips='{str(v.images is not None).lower()}' "
            f"data-identical='{str(v.identical).lower()}' data-score-digest='{e(v.score_digest)}'>"
            f"<h4>{e(v.prompt_id)}, seed {v.seed}{f' ({IDENTICAL})' if v.identical else ''}</h4>"
            f"<p class='prompt'>{e(prompt)}</p>{same}"
            f"<div class='media'>{_player(v, colours, size)}{_strips(v, colours)}{notes}{_links(v)}</div>"
            f"<table><tr><th>metric</th><th>control</th><th>{e(v.arm)}</th>"
            f"<th>Δ</th></tr>{rows}</table>{speed}</div>")


_STYLE = ("body{font-family:sans-serif;margin:1em;max-width:1400px} "
          ".pair{border:1px solid #ccc;padding:6px;margin:8px 0;display:grid;"
          "grid-template-columns:minmax(0,1fr) auto;gap:4px 16px} "
          ".pair h4,.pair .prompt{grid-column:1/3;margin:2px 0} .prompt{color:#444;font-size:90%} "
          ".player{display:flex;flex-wrap:wrap;align-items:flex-end;gap:8px;margin:2px 0} "
          ".player figure{margin:0;max-width:calc(50% - 60px)} .player video{max-width:100%;height:auto;"
          "display:block;background:#000} video.px{image-rendering:pixelated} "
          ".vlab{border-left:6px solid;padding-left:4px;font-weight:bold} "
          ".strip{display:flex;align-items:center;gap:6px;margin:2px 0;min-width:0} "
          ".strip img{max-width:calc(100% - 7em);height:auto} "
          ".lab{width:6em;border-left:6px solid;padding-left:4px;font-weight:bold} "
          ".files{font-size:80%;color:#444;margin:2px 0;overflow-wrap:anywhere} .noimg{color:#555;margin:2px 0} "
          "td,th{border:1px solid #ddd;padding:2px 6px;text-align:right} table{border-collapse:collapse;font-size:90%} "
          ".worse{background:#fdd} .better{background:#dfd} nav a{margin-right:1em} "
          ".identical{background:#f4f4f4} p.identical{color:#555;margin:2px 0;grid-column:1/3} "
          # Paper does not play: print a pair's filmstrips where it has them (a player would
          # print one frame); a pair that plays without strips prints its players' frame.
          "@media print{.pair[data-strips=true] .player{display:none} .player button{display:none} "
          ".pair{break-inside:avoid}}")

# Both clips of a pair start together and stay in step: the script takes their loop over
# (loop and autoplay off, so neither starts alone), starts both once both can play, and
# when both have ended restarts both from frame 0, so the two never drift apart however
# each decodes. Without scripts the tags' attributes still autoplay and loop each clip.
# The listeners are set before any source, so no 'canplay' is missed.
_SCRIPT = """
for (const p of document.querySelectorAll('.player')) {
  const vs = [...p.querySelectorAll('video')], button = p.querySelector('button');
  let ready = 0, on = true;
  const play = () => { if (on) for (const v of vs) v.play().catch(() => {}); };
  const restart = () => { for (const v of vs) v.currentTime = 0; play(); };
  for (const v of vs) {
    v.loop = false; v.autoplay = false; v.muted = true;
    v.addEventListener('canplay', () => { if (++ready === vs.length) restart(); }, {once: true});
    v.addEventListener('ended', () => { if (vs.every(x => x.ended)) restart(); });
  }
  button.addEventListener('click', () => {
    on = !on;
    if (on) play(); else for (const v of vs) v.pause();
    button.textContent = on ? 'pause both' : 'play both';
  });
}
for (const e of document.querySelectorAll('[data-src]')) e.src = MEDIA[e.dataset.src];
"""


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
    """Write the gallery page ``out`` (one HTML file, clips and filmstrips inlined)
    atomically. Returns counts: ``pairs`` (all), ``listed`` (on the page), ``playing``,
    ``shown`` (with filmstrips), ``bytes`` (all media), ``video_bytes``. Raises
    VideoReadError when a video is missing or FFmpeg cannot decode it, IntegrityError when a
    video is not the one its record names."""
    views = pairs(study, gen, scores, timings)
    colours = arm_colours([a.name for a in study.arms])
    verdicts = arm_verdicts(json.loads(stats_json.read_text()) if stats_json and stats_json.is_file() else None)
    size = (study.generation.width, study.generation.height)
    media = media_budget.inline(study, views)
    script = "<script>const MEDIA = " + json.dumps(media.uris) + ";" + _SCRIPT + "</script>"
    htmls = {id(v): _pair_html(v, colours, size) for vs in views.values() for v in vs}
    every = sum(len(vs) for vs in views.values())
    fixed = len(script.encode()) + 16 * 2**10  # 16 KiB: the head, nav and arm headings
    left_out = media_budget.trim(views, htmls, fixed)
    listed = [v for vs in views.values() for v in vs]
    used = {"pairs": every, "listed": len(listed), "playing": sum(1 for v in listed if v.videos),
            "shown": sum(1 for v in listed if v.images), "bytes": media.video_bytes + media.strip_bytes,
            "video_bytes": media.video_bytes}
    body = []
    for (panel, arm), vs in views.items():
        e = html.escape
        same = sum(1 for v in vs if v.identical)
        body.append(f"<h2 id='{e(panel)}-{e(arm)}'>panel {e(panel)}: "
                    f"<span style='color:{colours.get(arm, '#000')}'>{e(arm)}</span> against control</h2>"
                    f"<p>{len(vs)} pairs, worst first; {sum(1 for v in vs if v.videos)} play, "
                    f"{sum(1 for v in vs if v.images)} with filmstrips."
                    + (f" {same} of {len(vs)} pairs {IDENTICAL}: marked, and left out of every fidelity "
                       "mean, as in the study table." if same else "") + "</p>"
                    + (f"<p class='verdicts'>Study verdicts: {colour_verdicts(e(verdicts[arm]))}</p>"
                       if arm in verdicts else ""))
        body += [htmls[id(v)] for v in vs]
    write_text(Path(out), _head(study, views, used, left_out, stats_json) + "".join(body) + script
               + "</body></html>\n")
    return used


def _head(study: StudySpec, views: dict[tuple[str, str], list[PairView]], used: dict[str, int], left_out: int,
          stats_json: Path | None) -> str:
    """The page's title, what it shows and how many pairs get what under which cap
    (``media_budget``'s, read as they stand when the page is written)."""
    e, mb, kib = html.escape, media_budget, media_budget.kib
    nav = "".join(f"<a href='#{e(p)}-{e(a)}'>{e(p)}: {e(a)}</a>" for p, a in views)
    source = f" Statistics: {stats_json.name} {digest_file(stats_json)}." if stats_json else ""
    strips_only = sum(1 for vs in views.values() for v in vs if v.images and not v.videos)
    numbers = used["listed"] - used["playing"] - strips_only
    gone = (f", {left_out} left out of this page (its {kib(mb.PAGE_BYTES)} cap: the best pairs without media go "
            "first; `pairflow export` lists every pair's numbers)" if left_out else "")
    return (f"<html><head><meta charset='utf-8'><title>{e(study.study)}: gallery</title>"
            f"<style>{_STYLE}</style></head><body><h1>Study {e(study.study)}: control beside each treatment</h1>"
            f"<p class='summary'><b>{used['pairs']} pairs: {used['playing']} play, {strips_only} filmstrips only, "
            f"{numbers} numbers only{gone}.</b> Media: the worst {mb.MAX_PAIRS} pairs per panel and arm, "
            f"{kib(mb.VIDEO_BYTES)} of videos and {kib(mb.MAX_BYTES)} of media in all at most, inlined in this one "
            f"page so the Snakemake report can embed it (a page over 2 MiB as the report embeds it does not "
            f"open); this page holds {kib(used['video_bytes'])} of videos and {kib(used['bytes'])} of media. "
            "Every pair links its two mp4s on scratch (under panels/&lt;panel&gt;/videos/).</p>"
            "<p>Each pair: control's video beside the treatment's (same prompt, same seed, same initial noise), "
            "muted, started together and looping in step (one button pauses both); below them, "
            f"{mb.FRAMES} frames of each evenly spaced from first to last, decoded from the same videos (control "
            "above; what prints). Numbers are each pair's values from its score records (Δ: treatment − control; "
            "red: worse than control in the metric's direction, green: better); FR metrics (PSNR, SSIM) are the "
            "treatment's value against its control; a pair identical to control is marked, and its fidelity "
            "values (the metrics' cap) are left out of every fidelity mean, as in the study table. Pairs are "
            "sorted worst first: mean rank over the metrics, each ranked from worst to best. Verdict words are "
            f"coloured as in the study table.{e(source)}</p><nav>{nav}</nav>")

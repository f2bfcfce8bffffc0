"""The gallery's media under its caps: which pairs play, which show filmstrips, which keep
only their numbers, and which the page leaves out; and the media themselves.

The gallery page (``report/gallery``) is inlined whole (videos and filmstrips as ``data:``
URIs; a control clip and strip once per pair, shared by every arm) so the Snakemake report
can embed it like any other result; the report embeds a result page as a base64 ``data:``
URL and Chromium opens none over 2 MiB. So only the worst ``MAX_PAIRS`` pairs per panel
and arm get media, handed out rank by rank across the arms so that no arm is starved:
first their videos (``VIDEO_BYTES`` at most), then filmstrips for the pairs that do not
play, then for those that do, while all media stay under ``MAX_BYTES``; a pair past a cap
keeps what fits (filmstrips, or only its numbers and links) and notes why. If even the
pairs' numbers would take the page past ``PAGE_BYTES``, the best pairs without media are
left out (``trim``). Videos are read from scratch and checked against their records'
digests; filmstrips (``FRAMES`` frames evenly spaced over the video, ``STRIP_HEIGHT``
pixels high, JPEG) are decoded and tiled by FFmpeg (the same binary as the encoder,
``media.recipe.ffmpeg_binary``), each run bounded by ``strip_timeout``. Imports without torch.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from ..errors import IntegrityError, VideoReadError
from ..identity import digest_bytes
from ..media.recipe import ffmpeg_binary
from ..media.tools import TOOL_TIMEOUT_FLOOR_S, run_tool, tool_timeout
from ..plan.config import StudySpec

FRAMES = 6
"""Frames per filmstrip, evenly spaced from the first to the last."""
STRIP_HEIGHT = 96
"""Pixels per frame row (width follows the video's aspect ratio)."""
MAX_PAIRS = 6
"""Pairs with media (players, filmstrips) per panel and treatment arm: the worst ones."""
MAX_BYTES = 960 * 2**10
"""All the gallery's media together, videos and filmstrips (960 KiB as files). The
Snakemake report embeds a result page as a base64 ``data:`` URL, and Chromium opens no
such URL over 2 MiB: 960 KiB, base64-encoded twice (inlined here, then by the report), is
1.67 MiB, leaving room for the page's text (``PAGE_BYTES``). Past the cap, pairs keep
their numbers and links and no media."""
VIDEO_BYTES = 640 * 2**10
"""The part of ``MAX_BYTES`` videos may take (640 KiB): videos come first, as they are
what a reader plays, but the last third stays for filmstrips, so the pairs that do not
play still show their frames. The default study's 64x64 clips are ~28 KiB each: about
twenty fit. A real-size clip (Wan at 832x480: megabytes) never fits: it is linked only,
and the page says so."""
PAGE_BYTES = 1440 * 2**10
"""The whole page at most (1440 KiB): base64-encoded by the report it is 1.875 MiB, under
Chromium's 2 MiB for a ``data:`` URL with room for the report's prefix. Media take at
most ``MAX_BYTES`` × 4/3 (1280 KiB) of it; where the pairs' numbers would take the page
past it, the best pairs without media are left out."""
QUALITY = 5
"""FFmpeg's JPEG quality scale (2 best, 31 worst)."""


class Pair(Protocol):
    """What the budget reads of a gallery pair (``gallery.PairView``) and what it hands
    it: its two clips (control, treatment), their digests from the generation records (""
    when unrecorded), its frame count, the media keys it gets (``videos``: it plays;
    ``images``: its filmstrips) and notes saying what it lacks and why."""

    control_video: Path
    treatment_video: Path
    frames: int
    digests: tuple[str, str]
    videos: tuple[str, str] | None
    images: tuple[str, str] | None
    notes: list[str]


P = TypeVar("P", bound=Pair)


def kib(n: int) -> str:
    """``n`` bytes as the page words a size: KiB below 1 MiB, MiB from there."""
    return f"{n / 2**10:.0f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


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


class Media:
    """The page's inlined media under the caps, each file once (a control's clip and strip
    serve every arm), keyed for the page's script (``uris``: key -> ``data:`` URI). A pair
    gets both of its clips (or both strips) or neither: half a pair compares nothing."""

    def __init__(self, tmp: Path, binary: str, limit: tuple[float, str]) -> None:
        self.tmp, self.binary, self.limit = tmp, binary, limit
        self.keys: dict[tuple[str, Path], str] = {}
        self.uris: dict[str, str] = {}
        self.video_bytes = 0
        self.strip_bytes = 0
        self._jpegs: dict[Path, bytes] = {}

    def _store(self, kind: str, path: Path, mime: str, data: bytes) -> str:
        key = f"{kind[0]}{len(self.uris)}"
        self.keys[(kind, path)] = key
        self.uris[key] = f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
        return key

    def play(self, v: Pair) -> str | None:
        """Inline both clips of ``v`` (each checked against its generation record's digest)
        when they fit in ``VIDEO_BYTES``; otherwise say why not. Raises VideoReadError when
        a clip is missing, IntegrityError when it is not the recorded one."""
        paths = (v.control_video, v.treatment_video)
        sizes = {}
        for p in paths:
            try:
                sizes[p] = p.stat().st_size
            except OSError as e:
                raise VideoReadError(f"{p}: the gallery cannot read this video ({e.strerror}); run `pairflow "
                                     "verify` on the results tree, which names what is missing and how to "
                                     "remake it") from e
        if max(sizes.values()) > VIDEO_BYTES:
            return (f"linked only: its clip ({kib(max(sizes.values()))}) is larger than the page's whole video "
                    f"budget ({kib(VIDEO_BYTES)}); open the mp4s below")
        need = sum(n for p, n in sizes.items() if ("video", p) not in self.keys)
        if self.video_bytes + need > VIDEO_BYTES:
            return f"no player: the page's videos reached their {kib(VIDEO_BYTES)} budget; open the mp4s below"
        for p, want in zip(paths, v.digests, strict=True):
            if ("video", p) in self.keys:
                continue
            data = p.read_bytes()
            if want and digest_bytes(data) != want:
                raise IntegrityError(f"{p}: digest {digest_bytes(data)}, but its generation record says {want}: "
                                     "the video changed after it was made; run `pairflow verify` on the results "
                                     "tree and remake what it names")
            self.video_bytes += len(data)
            self._store("video", p, "video/mp4", data)
        v.videos = (self.keys[("video", paths[0])], self.keys[("video", paths[1])])
        return None

    def strips(self, v: Pair) -> str | None:
        """Inline both filmstrips of ``v`` when all media stay under ``MAX_BYTES``;
        otherwise say why not. Raises VideoReadError when FFmpeg cannot decode a video."""
        paths = (v.control_video, v.treatment_video)
        for p in paths:
            if ("strip", p) not in self.keys and p not in self._jpegs:
                jpeg = self.tmp / f"{len(self._jpegs)}.jpg"
                filmstrip(p, v.frames, jpeg, self.binary, *self.limit)
                self._jpegs[p] = jpeg.read_bytes()
        need = sum(len(self._jpegs[p]) for p in set(paths) if ("strip", p) not in self.keys)
        if self.video_bytes + self.strip_bytes + need > MAX_BYTES:
            return f"no filmstrip: the page's media reached their {kib(MAX_BYTES)} cap"
        for p in paths:
            if ("strip", p) not in self.keys:
                self.strip_bytes += len(self._jpegs[p])
                self._store("strip", p, "image/jpeg", self._jpegs[p])
        v.images = (self.keys[("strip", paths[0])], self.keys[("strip", paths[1])])
        return None


def _allot(views: Mapping[tuple[str, str], Sequence[Pair]], media: Media) -> None:
    """Hand out media to the worst ``MAX_PAIRS`` pairs of each arm, rank by rank across
    the arms (a cap never starves a later arm): videos first, then filmstrips for the
    pairs that do not play, then for those that do (print); each pair notes what it lacks."""
    order = [vs[i] for i in range(MAX_PAIRS) for vs in views.values() if i < len(vs)]
    for v in order:
        note = media.play(v)
        if note:
            v.notes.append(note)
    for v in [*(v for v in order if not v.videos), *(v for v in order if v.videos)]:
        note = media.strips(v)
        if note:
            v.notes.append(note)
    for vs in views.values():
        for v in vs[MAX_PAIRS:]:
            v.notes.append(f"numbers only: only the worst {MAX_PAIRS} pairs per arm get players and filmstrips; "
                           "open the mp4s below")


def inline(study: StudySpec, views: Mapping[tuple[str, str], Sequence[Pair]]) -> Media:
    """Hand out the page's media to ``views`` (panel, arm -> pairs, worst first), setting
    each pair's ``videos``, ``images`` and ``notes``; filmstrips are made in a temporary
    folder by the encoder's FFmpeg (``study.encoder``), each bounded by
    ``strip_timeout(study)``. Returns the media inlined. Raises VideoReadError when a
    video is missing or FFmpeg cannot decode it, IntegrityError when a video is not the
    one its record names, ToolTimeoutError when FFmpeg hangs."""
    with tempfile.TemporaryDirectory(prefix="pairflow-gallery-") as tmp:
        media = Media(Path(tmp), ffmpeg_binary(study.encoder), strip_timeout(study))
        _allot(views, media)
    return media


def trim(views: dict[tuple[str, str], list[P]], htmls: dict[int, str], fixed: int) -> int:
    """Leave out the best pairs without media, rank by rank from the bottom across the
    arms, until the page (``fixed`` bytes plus each listed pair's HTML, keyed by the
    pair's ``id``) fits in ``PAGE_BYTES``. Returns how many were left out (removed from
    ``views`` and ``htmls``)."""
    total = fixed + sum(len(h.encode()) for h in htmls.values())
    longest = max((len(vs) for vs in views.values()), default=0)
    order = [vs[i] for i in reversed(range(longest)) for vs in reversed(list(views.values())) if i < len(vs)]
    out = 0
    for v in order:
        if total <= PAGE_BYTES:
            break
        if v.videos or v.images:
            continue
        total -= len(htmls.pop(id(v)).encode())
        out += 1
    for key, vs in views.items():
        views[key] = [v for v in vs if id(v) in htmls]
    return out

"""What a video declares, read with PyAV, and the one rule for reading it: every property
that changes its pixels has the value the recipe writes, or it is refused by name."""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    BitDepthError,
    ColourTagError,
    CorruptVideoError,
    DisplayTransformError,
    FrameRateError,
    GamutError,
    GeometryError,
    HDRVideoError,
    MissingVideoError,
    PixelFormatError,
    StreamPropertyError,
    TruncatedVideoError,
    VideoReadError,
)
from .h264 import UNSET, SpsDeclaration, chroma_locations, declarations
from .mp4 import UNPARSABLE, ColourBox, colour_boxes

_HDR_TRC = {"smpte2084": "PQ (SMPTE ST 2084)", "arib-std-b67": "HLG (ARIB STD-B67)"}
_BT2020 = ("bt2020", "bt2020nc", "bt2020c")


# ---------------------------------------------------------------------------- read guards
#
# The general rule: a video is read only if every property it declares that changes its
# decoded pixels has the value the fixed recipe writes (``recipe_declaration``). Anything
# else is refused by name, with its own error and the fix; nothing is guessed, rotated,
# stretched, deinterlaced or concealed. A colour tag is read from each place it can be
# stated, the H.264 stream and the MP4 container, and both must say the recipe's value or
# nothing (``_check_sources``), so no decoder can read the file two ways.

# ITU-T H.273 code points, as PyAV reports them (ints), to ffmpeg's names.
_TRC = {1: "bt709", 2: "unknown", 4: "gamma22", 5: "gamma28", 6: "smpte170m", 7: "smpte240m", 8: "linear",
        13: "iec61966-2-1", 14: "bt2020-10", 15: "bt2020-12", 16: "smpte2084", 18: "arib-std-b67"}
_PRIMARIES = {1: "bt709", 2: "unknown", 4: "bt470m", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 8: "film",
              9: "bt2020", 11: "smpte431", 12: "smpte432"}
_MATRIX = {0: "gbr", 1: "bt709", 2: "unknown", 4: "fcc", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 8: "ycgco",
           9: "bt2020nc", 10: "bt2020c", 14: "ictcp"}
_RANGE = {0: "unknown", 1: "tv", 2: "pc"}
_FULL_RANGE_FLAG = {0: "tv", 1: "pc"}  # H.264's video_full_range_flag and the nclx box's full_range_flag
_FIELD_ORDER = {0: "unknown", 1: "progressive", 2: "tt", 3: "bb", 4: "tb", 5: "bt"}
_UNSPECIFIED = {"unknown"}


def _code_name(table: dict[int, str], value: Any) -> str:
    return table.get(int(value), f"code-{int(value)}")


COLOUR_TAGS = ("colorspace", "color_range", "color_primaries", "color_trc")
"""The ``ProbeInfo`` colour tags that a stream and its container each declare."""
STREAM_SOURCE, CONTAINER_SOURCE = "the H.264 stream (its SPS VUI)", "the MP4 container (its colr box)"
_TABLES = {"colorspace": _MATRIX, "color_primaries": _PRIMARIES, "color_trc": _TRC}


def _source_tags(declared: list[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """Each colour tag as one source's declarations (SPSs or boxes) state it: ``unknown``
    when none states it, the stated names joined by ``|`` when they differ."""
    out = []
    for name in COLOUR_TAGS:
        stated = {d[name] for d in declared if d.get(name, "unknown") not in _UNSPECIFIED}
        out.append((name, _joined(stated) or "unknown"))
    return tuple(out)


def _named(tags: SpsDeclaration | ColourBox) -> dict[str, str]:
    """The colour tags an SPS or a colr box states (H.273 code points), by ffmpeg's names."""
    codes = {"colorspace": tags.matrix, "color_primaries": tags.primaries, "color_trc": tags.transfer}
    out = {name: _code_name(_TABLES[name], code) for name, code in codes.items() if code is not None}
    if tags.full_range is not None:
        out["color_range"] = _FULL_RANGE_FLAG[tags.full_range]
    return out


def _sps_tags(sps: SpsDeclaration | None) -> dict[str, str]:
    return dict.fromkeys(COLOUR_TAGS, UNPARSABLE) if sps is None else _named(sps)


def _box_tags(box: ColourBox) -> dict[str, str]:
    if box.kind in ("prof", "rICC"):  # an ICC profile states primaries and transfer its own way
        return {"color_primaries": f"ICC profile ({box.kind})", "color_trc": f"ICC profile ({box.kind})"}
    if box.kind not in ("nclx", "nclc"):  # unparsable, or a colour type the reader does not know
        return dict.fromkeys(COLOUR_TAGS, box.kind if box.kind == UNPARSABLE else f"colr type {box.kind!r}")
    return _named(box)


@dataclass(frozen=True)
class ProbeInfo:
    """Every property of a file that changes its decoded pixels, as PyAV reports it: the
    container's streams, the video stream's codec parameters, every packet's timing and
    every decoded frame's tags and side data. A ``color_*`` tag is read as decoded, from the
    codec context and every frame; values that disagree are joined with ``|`` (and so match
    no allowed value).

    ``mid_stream``: empty when every frame has the first frame's size and pixel format,
    else what changes where; ``side_data``: the frame side-data types seen (``av.sidedata.Type`` names);
    ``chroma_location``: what the H.264 sequence parameter sets declare (``h264``);
    ``stream_colour`` and ``container_colour``: the four colour tags (``COLOUR_TAGS``) as
    each source alone declares them, the H.264 SPSs' VUI (``h264``) and the MP4 ``colr``
    boxes (``mp4``), ``unknown`` where it states none (the ``color_*`` fields merge
    them: the decoder takes the stream's tag where it states one, else the container's);
    ``timing``: empty when the frames are shown at 0, 1/fps, 2/fps, ... with nothing
    discarded, else what differs; ``corrupt``: empty when every packet decoded cleanly
    with error detection on, else where it failed."""

    container: str
    codec: str
    pix_fmt: str
    bits: int
    width: int
    height: int
    frames: int
    fps: str
    vfr: bool
    mid_stream: str
    color_trc: str
    color_primaries: str
    colorspace: str
    color_range: str
    sar: str
    field_order: str
    chroma_location: str
    stream_colour: tuple[tuple[str, str], ...]
    container_colour: tuple[tuple[str, str], ...]
    streams: tuple[str, ...]
    side_data: tuple[str, ...]
    rotation: float
    timing: str
    corrupt: str


def recipe_declaration(pix_fmt: str) -> dict[str, tuple[str, ...]]:
    """What the fixed recipe writes for a video of decoded pixel format ``pix_fmt``
    (``expected_pix_fmt``), property by property of ``ProbeInfo``: the allowed values.
    ``side_data`` lists the side-data types allowed on a frame (x264's version string);
    ``sar`` allows an unset ratio (the recipe's) and 1:1, both square pixels;
    ``chroma_location`` an unset one (the recipe's) and ``left``, H.264's default."""
    lossless = pix_fmt == "gbrp"
    return {
        "container": ("mov,mp4,m4a,3gp,3g2,mj2",),
        "codec": ("h264",),
        "streams": ("video",),
        "colorspace": ("gbr",) if lossless else ("bt709",),
        "color_range": ("pc",) if lossless else ("tv",),
        "color_primaries": ("unknown",) if lossless else ("bt709",),
        "color_trc": ("unknown",) if lossless else ("bt709",),
        "sar": ("unset", "1:1"),
        "field_order": ("progressive",),
        "chroma_location": (UNSET, "left"),
        "side_data": ("SEI_UNREGISTERED",),
        "timing": ("",),
    }


_DISPLAY_SIDE_DATA = {"DISPLAYMATRIX", "STEREO3D", "SPHERICAL", "PANSCAN", "AFD"}
_COLOUR_SIDE_DATA = {"ICC_PROFILE", "MASTERING_DISPLAY_METADATA", "CONTENT_LIGHT_LEVEL", "DYNAMIC_HDR_PLUS",
                     "DYNAMIC_HDR_VIVID", "DOVI_RPU_BUFFER", "DOVI_METADATA", "AMBIENT_VIEWING_ENVIRONMENT"}
_REENCODE = "Re-encode it with the project's recipe (or regenerate it: rerun the panel)"
_TAG_FIX = ("PairFlow decodes only what the recipe declares and never guesses an untagged matrix (ffmpeg's "
            "own default 8-bit output is untagged and BT.601). If the video is known to be BT.709 limited range, "
            "tag it without re-encoding: ffmpeg -i IN -c copy -bsf:v h264_metadata=colour_primaries=1:"
            "transfer_characteristics=1:matrix_coefficients=1:video_full_range_flag=0 OUT; otherwise "
            + _REENCODE.lower())
_COLOUR_FIX = "PairFlow never converts colours silently. " + _REENCODE
_PROPERTY_RULES: dict[str, tuple[type[VideoReadError], str, str]] = {
    "container": (StreamPropertyError, "container format", _REENCODE),
    "codec": (StreamPropertyError, "codec", _REENCODE),
    "streams": (StreamPropertyError, "streams", "The recipe writes exactly one video stream and nothing else. "
                + _REENCODE),
    "colorspace": (ColourTagError, "YUV->RGB colour matrix", _COLOUR_FIX),
    "color_range": (ColourTagError, "colour range", _COLOUR_FIX),
    "color_primaries": (ColourTagError, "colour primaries", _COLOUR_FIX),
    "color_trc": (ColourTagError, "transfer characteristics", _COLOUR_FIX),
    "sar": (DisplayTransformError, "sample aspect ratio (non-square pixels: a player stretches the frames)",
            "PairFlow never resamples silently. " + _REENCODE + " with square pixels (setsar=1)"),
    "field_order": (StreamPropertyError, "field order (interlaced video)",
                    "PairFlow never deinterlaces silently. " + _REENCODE + " as progressive frames"),
    "chroma_location": (StreamPropertyError, "chroma sample location (where the 4:2:0 chroma samples sit)",
                        "PairFlow decodes with chroma where the recipe puts it (left, H.264's default). "
                        + _REENCODE),
    "timing": (StreamPropertyError, "timing", "An edit list or start offset changes which frames are shown "
               "and when. " + _REENCODE),
}


def _open(path: Path, data: bytes | None = None) -> Any:
    """The file opened with PyAV, or ``data`` (its bytes, already read) when given.
    Raises MissingVideoError (absent, zero bytes) or TruncatedVideoError (not a container
    PyAV can open, or one whose metadata is not UTF-8: PyAV's own UnicodeDecodeError)."""
    import av

    if data is None and not path.is_file():
        raise MissingVideoError(f"{path}: no such file; regenerate it (rerun the panel)")
    if (len(data) if data is not None else path.stat().st_size) == 0:
        raise MissingVideoError(f"{path}: zero bytes; the write was interrupted, regenerate it")
    try:
        return av.open(io.BytesIO(data) if data is not None else str(path))
    except (av.error.FFmpegError, UnicodeDecodeError) as e:  # a damaged metadata string: UnicodeDecodeError
        raise TruncatedVideoError(f"{path}: cannot be opened as a video ({e}); the file is "
                                  "truncated or corrupt, delete it and regenerate") from e


def _joined(values: set[str]) -> str:
    return "|".join(sorted(values))


def _tag(table: dict[int, str], container_value: Any, frame_values: set[int]) -> str:
    """A tag as decoded: every frame's, with the codec context's when it states one. Both merge
    the two sources (the container's tag, overwritten by the stream's where the stream states
    one); ``stream_colour`` and ``container_colour`` keep them apart."""
    names = {_code_name(table, v) for v in frame_values}
    declared = _code_name(table, container_value)
    if declared not in _UNSPECIFIED or not names:
        names.add(declared)
    return _joined(names)


def _container_colour(container: Any, path: Path, data: bytes | None) -> tuple[tuple[str, str], ...]:
    """The colour tags the MP4 container's ``colr`` boxes state (``mp4``), read from ``data``
    (the file's bytes) when given, else from ``path``; none for another container format
    (refused by name anyway)."""
    if "mp4" not in container.format.name.split(","):
        return _source_tags([])
    with io.BytesIO(data) if data is not None else open(path, "rb") as fh:
        return _source_tags([_box_tags(b) for b in colour_boxes(fh)])


def _scan(container: Any, path: Path, rgb: dict[str, Any] | None,
          data: bytes | None = None) -> tuple[ProbeInfo, list[np.ndarray]]:
    """Demux and decode every packet of the first video stream with the decoder's error
    detection on (ffmpeg's ``-err_detect explode``: a damaged packet is an error, never
    concealed) and report every declared property. With ``rgb`` (``VideoFrame.reformat``
    arguments) each frame is also converted to uint8 RGB; conversion stops at the first
    damaged packet. ``data``: the file's bytes when ``container`` was opened from them
    (the container's colour boxes are read from them, else from ``path``)."""
    import av

    streams = tuple(s.type for s in container.streams)
    if not container.streams.video:
        raise MissingVideoError(f"{path}: has no video stream (streams: {list(streams)}); this is not a video")
    stream = container.streams.video[0]
    cc = stream.codec_context
    # ffmpeg's -err_detect explode: a damaged packet is an error, never concealed. One
    # decoder thread: with frame or slice threads the h264 decoder loses the corrupt-frame
    # flag on some damaged streams, and with frame threads their output varies between reads.
    # Film grain is exported as side data (and so refused), never synthesised into the pixels.
    cc.options = {"err_detect": "explode", "export_side_data": "film_grain"}
    cc.thread_type, cc.thread_count = "SLICE", 1
    fmt = cc.format
    bits = max((c.bits for c in fmt.components), default=8) if fmt is not None else 8
    tags: dict[str, set[int]] = {"trc": set(), "primaries": set(), "matrix": set(), "range": set()}
    side_data: set[str] = set()
    rotation, interlaced, frames, corrupt = 0.0, 0, 0, ""
    layouts: dict[tuple[int, int, str], int] = {}  # (width, height, pixel format): first frame index
    out: list[np.ndarray] = []
    packets: list[Any] = []
    try:
        packets = [p for p in container.demux(stream) if p.size]
        for frame in (f for packet in [*packets, None] for f in cc.decode(packet)):  # None: flush
            for key, value in (("trc", frame.color_trc), ("primaries", frame.color_primaries),
                               ("matrix", frame.colorspace), ("range", frame.color_range)):
                tags[key].add(int(value))
            side_data.update(sd.type.name for sd in frame.side_data)
            if (frame.width, frame.height, frame.format.name) not in layouts:
                layouts[(frame.width, frame.height, frame.format.name)] = frames
                bits = max(bits, *(c.bits for c in frame.format.components))
            rotation = rotation or float(frame.rotation)
            interlaced += bool(frame.interlaced_frame)
            if frame.is_corrupt:
                corrupt = f"frame {frames} of {len(packets)} decoded with errors (concealed)"
                break
            if rgb is not None:
                out.append(frame.to_ndarray(format="rgb24", **rgb))
            frames += 1
    except av.error.FFmpegError as e:
        corrupt = f"decoding failed after {frames} frames of {len(packets)} packets ({e})"
    pts = sorted(p.pts for p in packets if p.pts is not None)
    deltas = {b - a for a, b in zip(pts, pts[1:], strict=False)}
    field_order = {_code_name(_FIELD_ORDER, cc.field_order)} | ({"interlaced-frames"} if interlaced else set())
    sars = {s for s in (cc.sample_aspect_ratio, stream.sample_aspect_ratio) if s}
    rate = stream.average_rate or stream.guessed_rate
    first = next(iter(layouts), (cc.width, cc.height, fmt.name if fmt is not None else "unknown"))
    sps = declarations(cc.extradata, (bytes(p) for p in packets)) if cc.name == "h264" else []
    info = ProbeInfo(
        container=container.format.name, codec=cc.name, pix_fmt=first[2], bits=bits,
        width=first[0], height=first[1], frames=frames,
        fps=f"{Fraction(rate).numerator}/{Fraction(rate).denominator}" if rate else "0/1",
        vfr=len(deltas) > 1,
        mid_stream="" if len(layouts) < 2 else "frames change size or pixel format mid-stream: " + ", ".join(
            f"{w}x{h} {f} from frame {i}" for (w, h, f), i in layouts.items()),
        color_trc=_tag(_TRC, cc.color_trc, tags["trc"]),
        color_primaries=_tag(_PRIMARIES, cc.color_primaries, tags["primaries"]),
        colorspace=_tag(_MATRIX, cc.colorspace, tags["matrix"]),
        color_range=_tag(_RANGE, cc.color_range, tags["range"]),
        sar=_joined({f"{s.numerator}:{s.denominator}" for s in sars}) or "unset",
        field_order=_joined(field_order),
        chroma_location=chroma_locations(sps) if cc.name == "h264" else f"not declared by {cc.name}",
        stream_colour=_source_tags([_sps_tags(d) for d in sps]),
        container_colour=_container_colour(container, path, data),
        streams=streams, side_data=tuple(sorted(side_data)),
        rotation=rotation, timing=_timing(container, stream, pts, sum(bool(p.is_discard) for p in packets)),
        corrupt=corrupt)
    return info, out


def _timing(container: Any, stream: Any, pts: list[int], discarded: int) -> str:
    """Empty when frames are shown from 0 with nothing discarded (constant spacing is
    ``vfr``'s check), else each irregularity: an edit list (discarded packets, a first
    frame before or after 0) or a stream or container start offset."""
    tb = stream.time_base or Fraction(0)
    return "; ".join(problem for problem, hit in (
        (f"{discarded} packets marked discard (an edit list trims the stream)", discarded),
        (f"the first frame is shown at {float((pts[0] if pts else 0) * tb):.6g} s, not 0", pts and pts[0] != 0),
        (f"the stream starts at {float((stream.start_time or 0) * tb):.6g} s, not 0", stream.start_time or 0),
        (f"the container starts at {(container.start_time or 0) / 1e6:.6g} s, not 0", container.start_time or 0),
    ) if hit)


def probe(path: Path) -> ProbeInfo:
    """Open ``path`` with PyAV and report every property of its first video stream that
    changes the decoded pixels (decoding every frame with error detection on, converting
    none).

    Raises MissingVideoError (absent, zero bytes, no video stream) or
    TruncatedVideoError (cannot be opened)."""
    path = Path(path)
    with _open(path) as container:
        return _scan(container, path, None)[0]


def check_probe(info: ProbeInfo, path: Path, *, frames: int, height: int, width: int, fps: int,
                pix_fmt: str) -> None:
    """Refuse anything a scorer must not see silently, each problem with its own error
    naming the value and the fix: a damaged stream (CorruptVideoError), HDR, BT.2020, more
    than 8 bits, a size, pixel format, rate or frame count other than recorded, then every
    property of ``recipe_declaration(pix_fmt)`` (StreamPropertyError and its subclasses)."""
    if info.corrupt:
        raise CorruptVideoError(f"{path}: the stream is damaged: {info.corrupt}; the decoder's error detection "
                                "(err_detect=explode) refuses it, so its frames would not be reproducible. "
                                "Delete it and regenerate (rerun the panel)")
    trc = _declared(info, "color_trc")
    if trc & set(_HDR_TRC):
        names = ", ".join(_HDR_TRC[t] for t in sorted(trc & set(_HDR_TRC)))
        raise HDRVideoError(f"{path}: HDR transfer {names}{_sources(info, 'color_trc')}; PairFlow scores SDR "
                            "BT.709 only and never tone-maps silently. Re-render SDR, or tone-map "
                            "explicitly before scoring and record how")
    if (_declared(info, "color_primaries") | _declared(info, "colorspace")) & set(_BT2020):
        raise GamutError(f"{path}: BT.2020 primaries/matrix ({info.color_primaries}/{info.colorspace}"
                         f"{_sources(info, 'color_primaries')}{_sources(info, 'colorspace')}); "
                         "convert to BT.709 explicitly (e.g. zscale) before scoring")
    if info.bits > 8:
        raise BitDepthError(f"{path}: {info.bits}-bit samples ({info.pix_fmt}); PairFlow does not "
                            "flatten to 8 bits silently. Re-encode to 8-bit with the project's recipe")
    if info.mid_stream:
        raise GeometryError(f"{path}: {info.mid_stream}; PairFlow never resizes or converts silently. "
                            "Re-encode it with the project's recipe (or regenerate it: rerun the panel)")
    if pix_fmt == "yuv420p" and (info.width % 2 or info.height % 2):
        raise GeometryError(f"{path}: odd size {info.width}x{info.height} and the recipe is 4:2:0; PairFlow never "
                            "resizes silently. Re-encode at an even size with the project's recipe")
    if (info.width, info.height) != (width, height):
        raise GeometryError(f"{path}: size {info.width}x{info.height}, expected {width}x{height}")
    if info.pix_fmt != pix_fmt and not info.pix_fmt.startswith("yuvj"):  # yuvj*: full range, said below
        raise PixelFormatError(f"{path}: pixel format {info.pix_fmt}, the recipe writes {pix_fmt}; "
                               "re-encode with the project's encoder")
    if info.vfr:
        raise FrameRateError(f"{path}: variable frame rate; re-encode at a constant {fps}/1")
    if Fraction(info.fps) != Fraction(fps):
        raise FrameRateError(f"{path}: frame rate {info.fps}, expected {fps}/1")
    _check_declaration(info, path, recipe_declaration(pix_fmt))
    if info.pix_fmt != pix_fmt:
        raise PixelFormatError(f"{path}: pixel format {info.pix_fmt}, the recipe writes {pix_fmt}; "
                               "re-encode with the project's encoder")
    if info.frames != frames:
        err = TruncatedVideoError if info.frames < frames else GeometryError
        raise err(f"{path}: {info.frames} frames decoded, {frames} expected; regenerate it")


def _declared(info: ProbeInfo, name: str) -> set[str]:
    """Every value colour tag ``name`` has: as decoded, and as the stream and the container
    each declare it."""
    values = {getattr(info, name), dict(info.stream_colour)[name], dict(info.container_colour)[name]}
    return {v for value in values for v in value.split("|")}


def _sources(info: ProbeInfo, name: str) -> str:
    """What each source declares for colour tag ``name``, for a message; empty when neither
    states it."""
    said = [(source, dict(tags)[name]) for source, tags in ((STREAM_SOURCE, info.stream_colour),
                                                           (CONTAINER_SOURCE, info.container_colour))]
    if all(v in _UNSPECIFIED for _, v in said):
        return ""
    return " (" + ", ".join(f"{source}: {'none' if v in _UNSPECIFIED else repr(v)}" for source, v in said) + ")"


def _check_sources(info: ProbeInfo, path: Path, name: str, allowed: tuple[str, ...], meaning: str) -> None:
    """One reading of colour tag ``name``: the stream and the container each state an
    allowed value or nothing, and never two different ones (a player decodes by either
    source, ffmpeg by the stream's where it states one). Raises ColourTagError naming both
    sources and what each declares."""
    said = {source: dict(tags)[name] for source, tags in ((STREAM_SOURCE, info.stream_colour),
                                                          (CONTAINER_SOURCE, info.container_colour))}
    values = list(dict.fromkeys(v for v in said.values() if v not in _UNSPECIFIED))
    if len(values) < 2 and all(v in allowed for v in values):
        return
    wanted = " or ".join(repr(v) for v in allowed if v not in _UNSPECIFIED) or "none"
    declared = " and ".join(f"{source} {'declares none' if v in _UNSPECIFIED else f'declares {v!r}'}"
                            for source, v in said.items())
    why = (" The two disagree, so the frames depend on which one a decoder reads (ffmpeg's takes the stream's "
           "where it states one, a player may take the container's), and PairFlow never picks one."
           if len(values) > 1 else "")
    raise ColourTagError(f"{path}: {meaning} is {' and '.join(repr(v) for v in values)}: {declared}; the recipe "
                         f"writes {wanted} in both.{why} {_COLOUR_FIX}")


def _check_declaration(info: ProbeInfo, path: Path, allowed: dict[str, tuple[str, ...]]) -> None:
    """The general rule: every property in ``allowed`` has an allowed value, else the
    property's error, naming the property, the value, what the recipe writes and the fix.
    The colour tags are checked first as each source declares them (``_check_sources``),
    then as decoded."""
    extra = sorted(set(info.side_data) - set(allowed["side_data"]))
    if extra:
        err: type[VideoReadError] = (DisplayTransformError if set(extra) & _DISPLAY_SIDE_DATA else
                                     ColourTagError if set(extra) & _COLOUR_SIDE_DATA else StreamPropertyError)
        turn = (f" (a display rotation or flip; read as rotation {info.rotation:g} degrees)"
                if "DISPLAYMATRIX" in extra else "")
        raise err(f"{path}: frame side data {', '.join(extra)}{turn}, which the recipe never writes and which "
                  "changes how the frames are shown; PairFlow neither applies nor ignores it silently. "
                  + _REENCODE)
    sources_checked = False
    for name, (err, meaning, fix) in _PROPERTY_RULES.items():
        if name in COLOUR_TAGS and not sources_checked:  # every tag by source before any merged one: a tag
            for tag in COLOUR_TAGS:  # one source states is named with that source, not as another's absence
                _check_sources(info, path, tag, allowed[tag], _PROPERTY_RULES[tag][1])
            sources_checked = True
        value = getattr(info, name)
        if name == "streams":
            ok = tuple(value) == allowed[name]
            shown = ", ".join(value)
        else:
            ok = value in allowed[name]
            shown = value
        if not ok:
            untagged = value in _UNSPECIFIED and name != "timing"
            what = "none declared (untagged)" if untagged else repr(shown)
            wanted = " or ".join(repr(v) if v else "none (frames at i/fps from 0)" for v in allowed[name])
            raise err(f"{path}: {meaning} is {what}; the recipe writes {wanted}. {_TAG_FIX if untagged else fix}")

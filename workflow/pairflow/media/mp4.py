"""What an MP4 container declares about colour: its ``colr`` boxes, read from the box tree.

An MP4 states colour in two places: the H.264 stream's VUI (``h264``) and the ``colr`` box
of the video track's sample entry (``moov/trak/mdia/minf/stbl/stsd/avc1/colr``, ISO/IEC
14496-12 12.1.5). The reader refuses a disagreement between them, so it needs each one
alone. PyAV cannot give the container's: libavformat copies the box into the stream's
codec parameters, and the decoder (and ``avformat_find_stream_info`` before it) then
overwrites each tag with the stream's wherever the stream states one, so a BT.709 stream
in a box that says BT.601 or full range reads as plain BT.709; and an absent box reads as
an "unspecified" one. ffprobe has the same merge. So the boxes are read here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

_CONTAINERS = {b"trak", b"mdia", b"minf", b"stbl"}
_SAMPLE_ENTRY_HEADER = 78
"""SampleEntry (8 bytes) plus VisualSampleEntry's fixed fields (70): where child boxes start."""
_STSD_HEADER = 8
"""Full box version and flags (4 bytes), entry_count (4)."""
UNPARSABLE = "unparsable"


@dataclass(frozen=True)
class ColourBox:
    """One ``colr`` box. ``kind``: its colour type, ``nclx`` (ISO/IEC 14496-12: H.273 code
    points and a full-range flag), ``nclc`` (QuickTime: code points, no range), ``prof`` or
    ``rICC`` (an ICC profile), another four-character code, or ``UNPARSABLE`` (cut short).
    The code points are None where the kind carries none."""

    kind: str
    primaries: int | None = None
    transfer: int | None = None
    matrix: int | None = None
    full_range: int | None = None


def _boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[bytes, bytes]]:
    """(type, payload) of each box in ``data[start:end]``; a box that claims more bytes than
    are left is cut at the end (a truncated file), a header that does not fit ends the walk."""
    end = len(data) if end is None else end
    pos = start
    while pos + 8 <= end:
        size, kind, header = int.from_bytes(data[pos:pos + 4], "big"), data[pos + 4:pos + 8], 8
        if size == 1:
            if pos + 16 > end:
                return
            size, header = int.from_bytes(data[pos + 8:pos + 16], "big"), 16
        elif size == 0:  # to the end of the enclosing box
            size = end - pos
        if size < header:
            return
        yield kind, data[pos + header:min(pos + size, end)]
        pos += size


def _top_level(fh: BinaryIO) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload offset, payload size) of each top-level box, by seeking: the media data
    is never read."""
    fh.seek(0, 2)
    end = fh.tell()
    pos = 0
    while pos + 8 <= end:
        fh.seek(pos)
        head = fh.read(16)
        size, kind, header = int.from_bytes(head[:4], "big"), head[4:8], 8
        if size == 1 and len(head) == 16:
            size, header = int.from_bytes(head[8:16], "big"), 16
        elif size == 0:
            size = end - pos
        if size < header:
            return
        yield kind, pos + header, min(size, end - pos) - header
        pos += size


def _colour(payload: bytes) -> ColourBox:
    kind = payload[:4].decode("latin-1")
    if kind in ("nclx", "nclc"):
        if len(payload) < (11 if kind == "nclx" else 10):
            return ColourBox(UNPARSABLE)
        primaries, transfer, matrix = (int.from_bytes(payload[i:i + 2], "big") for i in (4, 6, 8))
        return ColourBox(kind, primaries, transfer, matrix, payload[10] >> 7 if kind == "nclx" else None)
    return ColourBox(kind if len(payload) >= 4 else UNPARSABLE)


def _video_track(trak: bytes) -> bool:
    """Whether a ``trak`` payload is a video track (its ``hdlr`` handler type is ``vide``)."""
    for kind, mdia in _boxes(trak):
        if kind == b"mdia":
            return any(k == b"hdlr" and p[8:12] == b"vide" for k, p in _boxes(mdia))
    return False


def _sample_entry_colours(box: bytes, path: tuple[bytes, ...] = ()) -> Iterator[ColourBox]:
    for kind, payload in _boxes(box):
        if kind in _CONTAINERS:
            yield from _sample_entry_colours(payload, (*path, kind))
        elif kind == b"stsd" and path[-1:] == (b"stbl",):
            for _entry, body in _boxes(payload, _STSD_HEADER):
                for child, data in _boxes(body, _SAMPLE_ENTRY_HEADER):
                    if child == b"colr":
                        yield _colour(data)


def colour_boxes(fh: BinaryIO) -> tuple[ColourBox, ...]:
    """Every ``colr`` box of every video track's sample entries, in file order (none: the
    container states no colour). ``fh`` is a seekable binary file; only the ``moov`` box is
    read into memory."""
    found: list[ColourBox] = []
    for kind, offset, size in _top_level(fh):
        if kind != b"moov":
            continue
        fh.seek(offset)
        moov = fh.read(size)
        for child, trak in _boxes(moov):
            if child == b"trak" and _video_track(trak):
                found.extend(_sample_entry_colours(trak, (b"trak",)))
    return tuple(found)

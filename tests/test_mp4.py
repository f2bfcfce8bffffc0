"""The MP4 colr box reader: against ffmpeg's own mov demuxer on files ffmpeg writes at test
time, and on box trees built by hand for the layouts ffmpeg does not write."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
from conftest import ffmpeg_colour_reading

from pairflow.media.mp4 import UNPARSABLE, ColourBox, colour_boxes
from pairflow.media.video import ffmpeg_binary


def boxes_of(path: Path) -> list[dict[str, int | str]]:
    with open(path, "rb") as fh:
        found = colour_boxes(fh)
    return [{k: v for k, v in vars(b).items() if v is not None} for b in found]


REMUX = {  # name: (ffmpeg options after -i recipe_video, output suffix); each a stream copy
    "recipe": ([], "mp4"),
    "quicktime_nclc": (["-f", "mov"], "mov"),
    "full_range": (["-color_range", "pc"], "mp4"),
    "bt601": (["-colorspace", "smpte170m", "-color_primaries", "smpte170m", "-color_trc", "smpte170m"], "mp4"),
    "unspecified_written_anyway": (["-color_primaries", "unknown", "-color_trc", "unknown", "-colorspace", "unknown",
                                    "-color_range", "unknown", "-movflags", "+write_colr"], "mp4"),
    "none": (["-color_primaries", "unknown", "-color_trc", "unknown", "-colorspace", "unknown"], "mp4"),
}


@pytest.mark.parametrize("name", sorted(REMUX))
def test_colr_boxes_are_read_as_ffmpegs_mov_demuxer_reads_them(encoder_spec, recipe_video: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               name: str) -> None:
    options, suffix = REMUX[name]
    out = tmp_path / f"{name}.{suffix}"
    ffmpeg = ffmpeg_binary(encoder_spec)
    subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "error", "-y", "-i", str(recipe_video), "-c", "copy",
                    *options, str(out)], check=True, capture_output=True)
    _, theirs = ffmpeg_colour_reading(ffmpeg, out)
    assert boxes_of(out) == theirs
    expected = {"recipe": [{"kind": "nclx", "primaries": 1, "transfer": 1, "matrix": 1, "full_range": 0}],
                "quicktime_nclc": [{"kind": "nclc", "primaries": 1, "transfer": 1, "matrix": 1}],
                "full_range": [{"kind": "nclx", "primaries": 1, "transfer": 1, "matrix": 1, "full_range": 1}],
                "bt601": [{"kind": "nclx", "primaries": 6, "transfer": 6, "matrix": 6, "full_range": 0}],
                "unspecified_written_anyway": [{"kind": "nclx", "primaries": 2, "transfer": 2, "matrix": 2,
                                                "full_range": 0}],
                "none": []}[name]
    assert theirs == expected  # the file carries what the case claims


# ------------------------------------------------------------------------ box trees built by hand

def box(kind: bytes, payload: bytes, *, large: bool = False, to_end: bool = False) -> bytes:
    if to_end:
        return (0).to_bytes(4, "big") + kind + payload
    if large:
        return (1).to_bytes(4, "big") + kind + (16 + len(payload)).to_bytes(8, "big") + payload
    return (8 + len(payload)).to_bytes(4, "big") + kind + payload


def nclx(primaries: int, transfer: int, matrix: int, full: int) -> bytes:
    return b"nclx" + b"".join(v.to_bytes(2, "big") for v in (primaries, transfer, matrix)) + bytes([full << 7])


def trak(handler: bytes, *colr: bytes) -> bytes:
    entry = box(b"avc1", bytes(78) + box(b"avcC", b"\x01") + b"".join(box(b"colr", c) for c in colr))
    stsd = box(b"stsd", bytes(4) + (1).to_bytes(4, "big") + entry)
    hdlr = box(b"hdlr", bytes(8) + handler + bytes(12))
    return box(b"trak", box(b"tkhd", bytes(84)) + box(b"mdia", hdlr + box(b"minf", box(b"stbl", stsd))))


def read(data: bytes) -> tuple[ColourBox, ...]:
    return colour_boxes(io.BytesIO(data))


FTYP = box(b"ftyp", b"isom\x00\x00\x02\x00isom")


def test_only_video_tracks_are_read_and_every_box_of_them() -> None:
    moov = box(b"moov", trak(b"soun", nclx(5, 6, 5, 1)) + trak(b"vide", nclx(1, 1, 1, 0), b"prof" + bytes(8)))
    assert read(FTYP + moov + box(b"mdat", bytes(64))) == (ColourBox("nclx", 1, 1, 1, 0), ColourBox("prof"))


def test_64_bit_and_to_the_end_box_sizes_are_walked() -> None:
    """A 64-bit ``moov`` size (size field 1) after a media box that runs to the end of the
    file would be unusual; here the ``mdat`` comes first with a 64-bit size and the ``moov``
    last, sized 0 (to the end of the file)."""
    data = FTYP + box(b"mdat", bytes(32), large=True) + box(b"moov", trak(b"vide", nclx(1, 13, 6, 1)), to_end=True)
    assert read(data) == (ColourBox("nclx", 1, 13, 6, 1),)


def test_a_colr_box_cut_short_is_unparsable_and_a_file_without_moov_has_none() -> None:
    assert read(FTYP + box(b"moov", trak(b"vide", b"nclx\x00\x01"))) == (ColourBox(UNPARSABLE),)
    assert read(FTYP + box(b"moov", trak(b"vide", b"nc"))) == (ColourBox(UNPARSABLE),)
    assert read(FTYP + box(b"mdat", bytes(16))) == ()
    assert read(b"\x00\x00") == ()  # not even a box header

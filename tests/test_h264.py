"""The H.264 SPS reader: chroma sample location and colour tags, on streams ffmpeg writes at
test time, checked against ffmpeg's own SPS parser (the trace_headers bitstream filter)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import av
import pytest
from conftest import ffmpeg_colour_reading

from pairflow.media.h264 import (
    CHROMA_LOCATIONS,
    UNSET,
    SpsDeclaration,
    chroma_location,
    declarations,
    sps_chroma_location,
)
from pairflow.media.video import ffmpeg_binary


def declared(path: Path) -> str:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return chroma_location(s.codec_context.extradata, [bytes(p) for p in c.demux(s) if p.size])


def test_the_recipe_declares_no_chroma_location(recipe_video: Path) -> None:
    assert declared(recipe_video) == UNSET


@pytest.mark.parametrize("loc", range(6))
@pytest.mark.parametrize("container", ["mp4", "mkv"])
def test_every_declared_chroma_location_is_read(encoder_spec, recipe_video: Path, tmp_path: Path, loc: int,  # type: ignore[no-untyped-def]
                                                container: str) -> None:
    """Set by ffmpeg's h264_metadata filter (which rewrites the SPS, here behind a
    sample aspect ratio and colour description so the VUI fields before it are walked)."""
    out = tmp_path / f"c{loc}.{container}"
    subprocess.run([ffmpeg_binary(encoder_spec), "-hide_banner", "-loglevel", "error", "-y", "-i", str(recipe_video),
                    "-c", "copy", "-bsf:v", f"h264_metadata=chroma_sample_loc_type={loc}:sample_aspect_ratio=4/3",
                    str(out)], check=True, capture_output=True)
    assert declared(out) == CHROMA_LOCATIONS[loc]


def test_high_profile_scaling_matrices_and_interlacing_are_walked(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """x264 with a custom quantisation matrix (the SPS scaling lists) and interlacing
    (frame_mbs_only_flag 0), then a chroma location: the parser reaches it."""
    out = tmp_path / "cqm.mp4"
    subprocess.run([ffmpeg_binary(encoder_spec), "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                    "testsrc2=size=64x48:rate=8", "-frames:v", "3", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                    "-x264-params", "cqm=jvt:interlaced=1:chromaloc=3", str(out)], check=True, capture_output=True)
    assert declared(out) == "top"


def test_a_broken_sps_is_unparsable_not_unset() -> None:
    assert chroma_location(b"", [b"\x00\x00\x01\x67\x64"]) == "unparsable"  # Annex B, an SPS cut short
    with pytest.raises((ValueError, IndexError)):
        sps_chroma_location(b"\x67\x64")


def colour_declared(path: Path) -> dict[str, set[int]]:
    """Every colour field the stream's SPSs state, as PairFlow's reader reads them."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        sps = declarations(s.codec_context.extradata, [bytes(p) for p in c.demux(s) if p.size])
    out: dict[str, set[int]] = {}
    for d in sps:
        assert d is not None
        for field in ("full_range", "primaries", "transfer", "matrix"):
            if getattr(d, field) is not None:
                out.setdefault(field, set()).add(getattr(d, field))
    return out


COLOUR = {  # h264_metadata options on the recipe's stream (copied: only the SPS changes) -> the fields read
    "recipe": ("", {"full_range": {0}, "primaries": {1}, "transfer": {1}, "matrix": {1}}),
    "full_range": ("video_full_range_flag=1", {"full_range": {1}, "primaries": {1}, "transfer": {1}, "matrix": {1}}),
    "bt601_behind_sar": ("matrix_coefficients=6:colour_primaries=6:transfer_characteristics=6:sample_aspect_ratio=4/3",
                         {"full_range": {0}, "primaries": {6}, "transfer": {6}, "matrix": {6}}),
    "pq": ("transfer_characteristics=16:chroma_sample_loc_type=2",
           {"full_range": {0}, "primaries": {1}, "transfer": {16}, "matrix": {1}}),
}


@pytest.mark.parametrize("name", sorted(COLOUR))
def test_colour_tags_are_read_as_ffmpegs_sps_parser_reads_them(encoder_spec, recipe_video: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                name: str) -> None:
    option, expected = COLOUR[name]
    out = tmp_path / f"{name}.mp4"
    ffmpeg = ffmpeg_binary(encoder_spec)
    subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "error", "-y", "-i", str(recipe_video), "-c", "copy",
                    *(["-bsf:v", f"h264_metadata={option}"] if option else []), str(out)],
                   check=True, capture_output=True)
    theirs, _ = ffmpeg_colour_reading(ffmpeg, out)
    assert theirs == expected  # the file carries what the case claims
    assert colour_declared(out) == theirs


def test_an_sps_without_colour_states_none_and_range_alone_is_read(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ffmpeg's default output states no colour (no VUI signal type); h264_metadata then
    adds the range flag alone (video_signal_type without colour_description)."""
    ffmpeg = ffmpeg_binary(encoder_spec)
    plain, ranged = tmp_path / "plain.mp4", tmp_path / "ranged.mp4"
    subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=64x48:rate=8",
                    "-frames:v", "3", "-c:v", "libx264", "-pix_fmt", "yuv420p", str(plain)], check=True, capture_output=True)
    subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "error", "-y", "-i", str(plain), "-c", "copy", "-bsf:v",
                    "h264_metadata=video_full_range_flag=1", str(ranged)], check=True, capture_output=True)
    assert ffmpeg_colour_reading(ffmpeg, plain)[0] == colour_declared(plain) == {}
    assert ffmpeg_colour_reading(ffmpeg, ranged)[0] == colour_declared(ranged) == {"full_range": {1}}
    with av.open(str(plain)) as c:
        assert set(declarations(c.streams.video[0].codec_context.extradata, [])) == {SpsDeclaration()}

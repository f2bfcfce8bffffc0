"""The one fixed, fingerprinted encoder recipe: the ffmpeg binary and its fingerprint, the
argv every video is written with, and the pixel format it declares."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

from ..errors import (
    EncodeError,
    ToolTimeoutError,
)
from ..identity import digest_file, digest_obj
from ..plan.config import EncoderSpec
from .tools import TOOL_TIMEOUT_FLOOR_S

# ---------------------------------------------------------------------------- encoder identity

def ffmpeg_binary(spec: EncoderSpec) -> str:
    """The configured ffmpeg, or the static build imageio-ffmpeg installs with the project."""
    if spec.ffmpeg:
        return spec.ffmpeg
    import imageio_ffmpeg

    return str(imageio_ffmpeg.get_ffmpeg_exe())


@functools.lru_cache(maxsize=8)
def _fingerprint(binary: str) -> tuple[str, str]:
    try:
        out = subprocess.run([binary, "-hide_banner", "-version"], check=True, capture_output=True,
                             text=True, timeout=TOOL_TIMEOUT_FLOOR_S).stdout
    except subprocess.TimeoutExpired as e:
        raise ToolTimeoutError(f"ffmpeg binary {binary!r} did not answer '-version' within {e.timeout:.0f} s "
                               "and was killed; set 'encoder/ffmpeg' to a working ffmpeg, or leave it empty to "
                               "use the one imageio-ffmpeg ships") from e
    except (OSError, subprocess.CalledProcessError) as e:
        raise EncodeError(f"ffmpeg binary {binary!r} cannot run ({e}); set 'encoder/ffmpeg' to a "
                          "working ffmpeg, or leave it empty to use the one imageio-ffmpeg ships") from e
    return out.splitlines()[0].strip(), digest_file(Path(binary))


def encoder_fingerprint(spec: EncoderSpec) -> dict[str, str]:
    """{'binary', 'version', 'digest'} of the ffmpeg that writes videos."""
    binary = ffmpeg_binary(spec)
    version, digest = _fingerprint(binary)
    return {"binary": binary, "version": version, "digest": digest}


OUTPUT_PLACEHOLDER = "{output}"
"""Stands for the video's (temporary) path in the recorded argv."""
SIZE_PLACEHOLDER = "{width}x{height}"
"""Stands for the frame size in the recorded argv (the size is part of the candidate id)."""


def recipe(spec: EncoderSpec, fps: int) -> dict[str, Any]:
    """The encoder recipe as it runs: the exact ffmpeg argument list ``encode`` passes
    (binary, output path and frame size normalised to placeholders) and its filter graph.
    The binary is fingerprinted apart (``encoder_fingerprint``)."""
    argv = _command(spec, fps, SIZE_PLACEHOLDER, OUTPUT_PLACEHOLDER).compile(cmd="ffmpeg")
    return {"argv": argv[1:], "filter_graph": _output_args(spec, fps).get("vf")}


def recipe_digest(spec: EncoderSpec, fps: int) -> str:
    """Digest of ``recipe``: any change to an argument or the filter graph changes it, so
    exactly the videos written with another recipe are regenerated."""
    return digest_obj(recipe(spec, fps))


# ---------------------------------------------------------------------------- encode

COLOUR_FILTER = ("scale=out_color_matrix=bt709:out_range=tv,"
                 "setparams=color_primaries=bt709:color_trc=bt709:colorspace=bt709:range=tv")
"""The lossy recipe's filter graph. setparams tags the frames themselves; ffmpeg 7+ lets
frame properties win over the -color_* options, which alone left primaries/transfer
"unknown"."""


def _command(spec: EncoderSpec, fps: int, size: str, out: str) -> Any:
    """The one ffmpeg command ``encode`` runs and ``recipe`` records (ffmpeg-python stream)."""
    import ffmpeg

    return (ffmpeg.input("pipe:", format="rawvideo", pix_fmt="rgb24", s=size, framerate=f"{fps}/1")
            .output(out, **_output_args(spec, fps))
            .global_args("-hide_banner", "-nostdin", "-loglevel", "error")
            .overwrite_output())


@functools.lru_cache(maxsize=64)
def _argv(spec: EncoderSpec, fps: int, size: str, binary: str) -> tuple[str, ...]:
    """``_command`` compiled once per recipe and size, the output path a placeholder:
    ffmpeg-python builds and hashes a graph on every call (0.4 ms of a 21 ms encode)."""
    return tuple(_command(spec, fps, size, OUTPUT_PLACEHOLDER).compile(cmd=binary))


def _output_args(spec: EncoderSpec, fps: int) -> dict[str, Any]:
    common = {"r": f"{fps}/1", "g": spec.gop, "threads": spec.threads, "preset": spec.preset,
              "fflags": "+bitexact", "flags:v": "+bitexact", "map_metadata": -1,
              "movflags": "+faststart", "f": "mp4"}
    if spec.lossless:
        # RGB stays RGB: libx264rgb at QP 0 round-trips uint8 frames bit-exactly.
        return {**common, "vcodec": "libx264rgb", "qp": 0, "pix_fmt": "rgb24"}
    return {**common, "vcodec": spec.codec, "crf": spec.crf, "pix_fmt": spec.pix_fmt,
            "vf": COLOUR_FILTER,
            "colorspace": "bt709", "color_primaries": "bt709", "color_trc": "bt709",
            "color_range": "tv"}


def expected_pix_fmt(spec: EncoderSpec) -> str:
    """The pixel format a decoder reports for videos written with ``spec``."""
    return "gbrp" if spec.lossless else spec.pix_fmt

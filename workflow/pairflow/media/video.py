"""Video I/O: the one fixed encoder recipe, write guards, read guards, one decode path.

Encoding is part of the evaluation protocol. Frames are checked (dtype, range, NaN,
layout, size) and refused rather than repaired; each video is encoded by one
fingerprinted ffmpeg binary with one recipe, written to a temporary name, probed and
verified, fsynced and renamed.

Reading is one rule: a video is decoded only if every property it declares that changes
its pixels has the value the recipe writes (``recipe_declaration``: mp4, H.264, one
video stream, BT.709 matrix/primaries/transfer, limited range (stated by the H.264
stream, the MP4 container or both, never two different values), square pixels,
progressive, H.264's default chroma location, no display matrix, film grain or other
side data, frames shown at i/fps from 0 with no edit list), and every frame's size,
pixel format, bit depth, rate and the frame count are the recorded ones. Anything
else is refused by name with its own error and the fix; untagged videos (ffmpeg's default
8-bit output) are refused, never guessed. Every frame is decoded in-process by PyAV with
the decoder's error detection on (``err_detect=explode``, one decoder thread), so a stream
damaged mid-file is refused the same way on every read, and converted to uint8 RGB with
the limited-range matrix stated explicitly.

ffmpeg is driven through ffmpeg-python (argv lists, no shell); probing and decoding use PyAV.
This module writes and reads; the concerns it composes are modules of their own: ``frames``
(frame checks), ``recipe`` (the encoder recipe), ``tools`` (the tool runner), ``probe``
(what a video declares and the read rule), ``h264`` and ``mp4`` (what the stream's SPSs
and the container's colr boxes declare). Their public names are re-exported here.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import FULL, atomic_path, no_space
from ..errors import (
    ConfigError,
    EncodeError,
    FrameError,
    PairFlowError,
)
from ..identity import digest_bytes, digest_file
from ..plan.config import EncoderSpec
from .frames import FLOAT_TOLERANCE, FrameStats, prepare_frames
from .probe import ProbeInfo, _open, _scan, check_probe, probe, recipe_declaration
from .recipe import (
    OUTPUT_PLACEHOLDER,
    _argv,
    encoder_fingerprint,
    expected_pix_fmt,
    ffmpeg_binary,
    recipe,
    recipe_digest,
)
from .tools import run_tool, tool_timeout

__all__ = [  # the media wing's surface: this module's writer and reader, and its parts' public names
    "FLOAT_TOLERANCE", "OUTPUT_PLACEHOLDER", "FrameStats", "ProbeInfo", "VideoInfo", "check_probe", "encode",
    "encoder_fingerprint", "expected_pix_fmt", "ffmpeg_binary", "prepare_frames", "probe", "read_video", "recipe",
    "recipe_declaration", "recipe_digest", "run_tool", "tool_timeout",
]

STDERR_LINES, STDERR_CHARS = 20, 4000
"""How much of ffmpeg's stderr (its tail) an EncodeError carries."""


@dataclass(frozen=True)
class VideoInfo:
    """An encoded video as written and verified."""

    path: str
    digest: str
    bytes: int
    frames: int
    height: int
    width: int
    fps: str
    pix_fmt: str
    raw_digest: str

    def asdict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Checked:
    """The written file's bytes as the decode-back check saw them."""

    digest: str
    size: int
    info: ProbeInfo


def _check_output(tmp: Path, *, frames: int, height: int, width: int, fps: int, pix_fmt: str) -> _Checked:
    """Read ``tmp`` once: digest those bytes, decode every frame of exactly those bytes with
    error detection on and check every declared property (``_scan``, ``check_probe``),
    then fsync the file: its one fsync before the rename."""
    with open(tmp, "rb") as fh:
        data = fh.read()
        digest = digest_bytes(data)
        with _open(tmp, data) as container:
            info = _scan(container, tmp, None, data)[0]
        check_probe(info, tmp, frames=frames, height=height, width=width, fps=fps, pix_fmt=pix_fmt)
        os.fsync(fh.fileno())
    return _Checked(digest, len(data), info)


def encode(frames: np.ndarray, final: Path, spec: EncoderSpec, fps: int, stall_s: float | None = None) -> VideoInfo:
    """Encode uint8 (F, H, W, 3) ``frames`` to ``final`` with the fixed recipe.

    ``stall_s``: where no watcher sees ffmpeg's progress (calibration in a preparing job),
    the stall rule's limit (``fleet.stall_timeout_s``), which then bounds ffmpeg when it is
    shorter than ``tool_timeout``.

    ffmpeg writes a temporary sibling. The file is read once: its digest is taken, every
    frame of those bytes is decoded with error detection on and every declared property
    checked (frame count, size, rate, pixel format, colour tags: ``check_probe``), and it
    is fsynced; then it is renamed and the directory fsynced. That work starts when
    ffmpeg reports its end (``progress=end``, written after it closed the file), while
    ffmpeg tears down; the file is accepted only after ffmpeg exits 0 and if its bytes are
    still the checked ones (else they are checked again). ``raw_digest`` is the digest of
    the uncompressed frames. ffmpeg reports each frame it encodes as progress and is
    killed after ``tool_timeout``. Raises EncodeError with ffmpeg's stderr,
    ToolTimeoutError when ffmpeg hangs, or a VideoReadError if the output does not verify;
    nothing is left under ``final`` on failure.
    """
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise FrameError(f"encode() takes uint8 (F, H, W, 3) from prepare_frames(); got "
                         f"{frames.dtype} {frames.shape}")
    f, h, w, _ = frames.shape
    # ndarray.data is the array's memoryview (numpy's stubs declare __buffer__ only for
    # Python >= 3.12, so memoryview(array) does not type-check on 3.10).
    raw = np.ascontiguousarray(frames).data.cast("B")  # no copy: fed to ffmpeg and hashed as is
    binary = ffmpeg_binary(spec)
    expected = {"frames": f, "height": h, "width": w, "fps": fps, "pix_fmt": expected_pix_fmt(spec)}
    # ffmpeg creates the temporary file itself (mode 0666 under the umask, as open does),
    # and _check_output fsyncs it.
    with atomic_path(Path(final), create=False, fsync=False) as tmp:
        argv = [str(tmp) if a == OUTPUT_PLACEHOLDER else a for a in _argv(spec, fps, f"{w}x{h}", binary)]
        # Progress lines on stdout (unused otherwise); they change no output byte, so the
        # recorded recipe does not carry them.
        argv[1:1] = ["-progress", "pipe:1", "-nostats"]
        early: list[_Checked | PairFlowError | OSError] = []

        def at_end() -> None:
            # ffmpeg has closed the file and is tearing down. What this finds is kept for
            # after its exit code: a failed encode is reported as such, not as a bad file.
            try:
                early.append(_check_output(tmp, **expected))
            except (PairFlowError, OSError) as e:
                early.append(e)

        try:
            limit, bound = tool_timeout(f, h, w), ""
            if stall_s is not None and stall_s < limit:
                limit, bound = stall_s, "fleet/stall_timeout_s: one encode is one step that reports no progress"
            code, err, _ = run_tool(argv, Path(final), limit, raw, chunk=h * w * 3, progress_lines=True,
                                    at_end=at_end, bound=bound)
        except OSError as e:
            if e.errno in FULL:
                raise no_space(Path(final), e) from e
            raise EncodeError(f"cannot run {binary} to write {final}: {e}; set 'encoder/ffmpeg' to a working "
                              "ffmpeg, or leave it empty to use the one imageio-ffmpeg ships") from e
        if code != 0:
            stderr = err.decode(errors="replace").strip()
            if "No space left on device" in stderr or "Disk quota exceeded" in stderr:
                cause = next(line for line in stderr.splitlines() if "No space" in line or "quota" in line)
                raise no_space(Path(final), cause)
            # The tail: ffmpeg's last lines say why; the whole log can be megabytes.
            tail = "\n".join(stderr.splitlines()[-STDERR_LINES:])[-STDERR_CHARS:]
            raise EncodeError(f"ffmpeg ({binary}) failed writing {final} (exit {code}); its "
                              f"stderr ends:\n{tail}")
        checked = early[0] if early else None
        if isinstance(checked, BaseException):
            raise checked
        # ffmpeg writes nothing after its end report; a tool that did (a wrapper set as
        # encoder/ffmpeg that touches its output) would have changed bytes already checked,
        # so those are checked again.
        if checked is None or digest_file(tmp) != checked.digest:
            checked = _check_output(tmp, **expected)
    return VideoInfo(str(final), checked.digest, checked.size, f, h, w, f"{fps}/1", checked.info.pix_fmt,
                     digest_bytes(raw))


DECODE_MATRICES = ("bt709", "bt601")
"""YUV->RGB matrices ``read_video`` applies to the recipe's BT.709 limited-range videos:
``bt709`` is the declared one (decord, and so VBench's decord-read dimensions, decode
these videos identically); ``bt601`` is what OpenCV 4.x's ``VideoCapture`` applies whatever
the tags say, so VBench's OpenCV-read dimensions see BT.601-decoded frames."""


def read_video(path: Path, spec: EncoderSpec, *, frames: int, height: int, width: int,
               fps: int, matrix: str = "bt709") -> np.ndarray:
    """Open once with PyAV, decode every frame with error detection on, check every declared
    property against the recipe (``check_probe``), and return uint8 RGB (F, H, W, 3)
    converted in-process with the limited-range ``matrix`` stated explicitly (one of
    ``DECODE_MATRICES``; ``bt709``, the declared one, by default; lossless RGB videos
    are not matrixed). Raises the read-guard errors of ``check_probe``, and ConfigError
    for an unknown matrix."""
    from av.video.reformatter import ColorRange, Colorspace

    if matrix not in DECODE_MATRICES:
        raise ConfigError(f"decode matrix {matrix!r} is not one of {DECODE_MATRICES}; set scoring/decode to a "
                          "known one")
    path = Path(path)
    pix_fmt = expected_pix_fmt(spec)
    convert = ({} if pix_fmt == "gbrp" else
               {"src_colorspace": Colorspace.ITU709 if matrix == "bt709" else Colorspace.ITU601,
                "src_color_range": ColorRange.MPEG})
    with _open(path) as container:
        info, out = _scan(container, path, convert)
    check_probe(info, path, frames=frames, height=height, width=width, fps=fps, pix_fmt=pix_fmt)
    return np.stack(out)

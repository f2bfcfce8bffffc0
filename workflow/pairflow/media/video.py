"""Video I/O: the one fixed encoder recipe, write guards, read guards, one decode path.

Encoding is part of the evaluation protocol. Frames are checked (dtype, range, NaN,
layout, size) and refused rather than repaired; each video is encoded by one
fingerprinted ffmpeg binary with one recipe, written to a temporary name, probed and
verified, fsynced and renamed.

Reading is one rule: a video is decoded only if every property it declares that changes
its pixels has the value the recipe writes (``recipe_declaration``: mp4, H.264, one
video stream, BT.709 matrix/primaries/transfer, limited range, square pixels,
progressive, H.264's default chroma location, no display matrix, film grain or other
side data, frames shown at i/fps from 0 with no edit list), and every frame's size,
pixel format, bit depth, rate and the frame count are the recorded ones. Anything
else is refused by name with its own error and the fix; untagged videos (ffmpeg's default
8-bit output) are refused, never guessed. Every frame is decoded in-process by PyAV with
the decoder's error detection on (``err_detect=explode``, one decoder thread), so a stream
damaged mid-file is refused the same way on every read, and converted to uint8 RGB with
the limited-range matrix stated explicitly.

ffmpeg is driven through ffmpeg-python (argv lists, no shell); probing and decoding use PyAV.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from .. import progress
from ..atomic import FULL, atomic_path, no_space
from ..errors import (
    BitDepthError,
    ColourTagError,
    ConfigError,
    CorruptVideoError,
    DisplayTransformError,
    EncodeError,
    FrameError,
    FrameRateError,
    GamutError,
    GeometryError,
    HDRVideoError,
    MissingVideoError,
    PairFlowError,
    PixelFormatError,
    StreamPropertyError,
    ToolTimeoutError,
    TruncatedVideoError,
    VideoReadError,
)
from ..identity import digest_bytes, digest_file, digest_obj
from ..plan.config import EncoderSpec
from .h264 import UNSET, chroma_location

log = logging.getLogger(__name__)

FLOAT_TOLERANCE = 1e-3
"""Float frames may overshoot [0, 1] by this much (resampling ringing); larger is an error."""
FLAT_STD = 1.0
"""A video whose pixel standard deviation is below this (uint8 levels) is flagged near-constant."""
DARK_MEAN = 16.0
"""A video whose mean is below this (uint8 levels) is flagged near-black."""
_FLOAT_DTYPES = ("float16", "bfloat16", "float32")
STDERR_LINES, STDERR_CHARS = 20, 4000
"""How much of ffmpeg's stderr (its tail) an EncodeError carries."""
_HDR_TRC = {"smpte2084": "PQ (SMPTE ST 2084)", "arib-std-b67": "HLG (ARIB STD-B67)"}
_BT2020 = ("bt2020", "bt2020nc", "bt2020c")


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


# ---------------------------------------------------------------------------- write guards

@dataclass(frozen=True)
class FrameStats:
    """What the write guard observed of a video's frames (uint8 levels)."""

    frames: int
    height: int
    width: int
    mean: float
    std: float
    flags: tuple[str, ...]


def _tensor_to_numpy(frames: Any) -> tuple[np.ndarray, str] | None:
    """``frames`` on the CPU as numpy with the tensor's dtype name, or None when it is not a
    torch tensor (or torch is not installed: the guard works on numpy alone)."""
    try:
        import torch
    except ImportError:
        return None
    if not isinstance(frames, torch.Tensor):
        return None
    dtype = str(frames.dtype).removeprefix("torch.")
    t = frames.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()  # numpy has no bfloat16; float32 holds every bfloat16 exactly
    return t.numpy(), dtype


def _to_numpy(frames: Any) -> tuple[np.ndarray, str]:
    from_tensor = _tensor_to_numpy(frames)
    if from_tensor is not None:
        return from_tensor
    if isinstance(frames, (list, tuple)):
        # A list of frames (PIL images, arrays, tensors): say what is wrong with the list
        # itself, not numpy's "inhomogeneous shape" or "shape (0,)".
        if not frames:
            raise FrameError("empty video: the frame list is empty; the generator returned no frames")
        parts = [_to_numpy(f)[0] for f in frames]
        shapes = sorted({p.shape for p in parts}, key=str)
        if len(shapes) > 1:
            first = {shape: next(i for i, p in enumerate(parts) if p.shape == shape) for shape in shapes}
            raise FrameError(f"ragged frame list: {len(parts)} frames of {len(shapes)} different shapes "
                             f"({', '.join(f'{s} first at frame {i}' for s, i in first.items())}); every frame "
                             "must have the same size and channels")
        dtypes = {str(p.dtype) for p in parts}
        if len(dtypes) > 1:
            raise FrameError(f"frame list mixes dtypes {sorted(dtypes)}; give every frame the same dtype")
        arr = np.stack(parts)
        return arr, str(arr.dtype)
    arr = np.asarray(frames)
    return arr, str(arr.dtype)


def _layout(shape: tuple[int, ...]) -> str:
    if len(shape) != 4:
        raise FrameError(f"frames have shape {shape}; expected 4 dimensions, (F, H, W, C) or "
                         "(F, C, H, W) with C = 3 (pass one video, not a batch)")
    last, second = shape[3] == 3, shape[1] == 3
    if last and second:
        raise FrameError(f"frames have shape {shape}: both (F, H, W, C) and (F, C, H, W) fit; "
                         "transpose to (F, H, W, 3) yourself so the layout is not guessed")
    if last:
        return "FHWC"
    if second:
        return "FCHW"
    raise FrameError(f"frames have shape {shape}; no axis 1 or 3 of size 3 (RGB); "
                     "expected (F, H, W, 3) or (F, 3, H, W)")


CONVERT_CHUNK_ELEMENTS = 1 << 22
"""Float frames are checked and converted this many values (about) at a time, so the
conversion's temporaries are a few tens of MiB whatever the video's size: peak memory
is the input plus its uint8 output (a quarter of a float32 input) plus one chunk."""


def _chunks(arr: np.ndarray) -> Any:
    """(frame, row slice) blocks of (F, H, W, C) ``arr``, each about ``CONVERT_CHUNK_ELEMENTS`` values."""
    f, h, w, c = arr.shape
    rows = max(1, CONVERT_CHUNK_ELEMENTS // max(1, w * c))
    for i in range(f):
        for r in range(0, h, rows):
            yield i, slice(r, min(h, r + rows))


def _float_to_uint8(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Check float (F, H, W, C) frames (NaN/inf, [0, 1] ± tolerance) and convert them to
    uint8 by rint(x * 255) in float64, clipped, chunk by chunk (bounded temporaries)."""
    nan = inf = 0
    lo, hi = np.inf, -np.inf
    for i, rows in _chunks(arr):
        block = arr[i, rows]
        nan += int(np.isnan(block).sum())
        inf += int(np.isinf(block).sum())
        if not nan and not inf:
            lo, hi = min(lo, float(block.min())), max(hi, float(block.max()))
    if nan or inf:
        raise FrameError(f"frames contain {nan} NaN and {inf} inf values of {arr.size}; the "
                         "model diverged (try float32, or check the scheduler and guidance)")
    if lo < -FLOAT_TOLERANCE or hi > 1 + FLOAT_TOLERANCE:
        cause = ("looks like [-1, 1] model output: map with (x + 1) / 2 first"
                 if lo < -0.05 and hi <= 1 + FLOAT_TOLERANCE
                 else "looks like [0, 255] floats: divide by 255 or cast to uint8 first" if hi > 1.5
                 else "values just outside [0, 1]: clamp in the model's post-processing")
        raise FrameError(f"{dtype} frames span [{lo:.6g}, {hi:.6g}], outside [0, 1] "
                         f"(tolerance {FLOAT_TOLERANCE}); {cause}")
    out = np.empty(arr.shape, dtype=np.uint8)
    for i, rows in _chunks(arr):
        block = np.multiply(arr[i, rows], 255.0, dtype=np.float64)
        np.rint(block, out=block)
        np.clip(block, 0, 255, out=block)
        out[i, rows] = block
    return out


def prepare_frames(frames: Any, spec: EncoderSpec) -> tuple[np.ndarray, FrameStats]:
    """Check frames and convert them to contiguous uint8 (F, H, W, 3).

    Accepts a numpy array or torch tensor. float16/bfloat16/float32 must lie in
    [0, 1] (± ``FLOAT_TOLERANCE``) and are scaled by 255, rounded and clipped; uint8
    passes unchanged. Float frames are converted in chunks (``CONVERT_CHUNK_ELEMENTS``):
    peak memory is the input plus its uint8 copy plus tens of MiB. Raises FrameError for
    any other dtype, NaN/inf (with counts), out-of-range floats (with min, max and the
    likely cause), an ambiguous layout, an empty video, or odd sizes under 4:2:0.
    Near-constant and near-black videos are flagged, and refused when ``spec.fail_on_flat``.
    """
    arr, dtype = _to_numpy(frames)
    layout = _layout(tuple(arr.shape))
    if layout == "FCHW":
        arr = arr.transpose(0, 2, 3, 1)
    f, h, w, _ = arr.shape
    if f == 0 or h == 0 or w == 0:
        raise FrameError(f"empty video: shape {tuple(arr.shape)}; the generator returned no frames")
    if dtype in _FLOAT_DTYPES:
        out = _float_to_uint8(arr, dtype)
    elif dtype == "uint8":
        out = arr
    else:
        raise FrameError(f"frames have dtype {dtype}; accepted: uint8, or float16/bfloat16/float32 "
                         "in [0, 1] (convert other integer types to uint8 yourself)")
    if spec.pix_fmt == "yuv420p" and not spec.lossless and (h % 2 or w % 2):
        raise FrameError(f"frames are {w}x{h}; 4:2:0 needs even width and height. Generate at an "
                         "even size (no silent resize is done), or use encoder pix_fmt yuv444p")
    out = np.ascontiguousarray(out)
    # The mean is exact: integer sums per row (a row of under 2**24 values cannot overflow
    # uint32), so equal to numpy's mean (its float64 sums of integers under 2**53 are exact)
    # at a third of its cost (5 of 14 ms at 832x480x33). The standard deviation (a flatness
    # heuristic) is estimated on every fourth row and column.
    total = int(out.reshape(-1, w * 3).sum(axis=1, dtype=np.uint32).sum(dtype=np.uint64))
    mean, std = total / out.size, float(out[:, ::4, ::4].std(dtype=np.float32))
    flags = tuple(name for name, hit in (("near-constant", std < FLAT_STD), ("near-black", mean < DARK_MEAN)) if hit)
    if flags and spec.fail_on_flat:
        raise FrameError(f"video is {' and '.join(flags)} (mean {mean:.2f}, std {std:.3f} in uint8 "
                         "levels) and 'encoder/fail_on_flat' is true; check the model output")
    return out, FrameStats(f, h, w, mean, std, flags)


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


TOOL_TIMEOUT_FLOOR_S = 120.0
"""Every ffmpeg run may take at least this long, however little its work (start-up on a
loaded node, a slow file system)."""
TOOL_TIMEOUT_S_PER_PIXEL = 1e-6
"""...plus this much per pixel it reads or writes: 1 M pixels/s, about 30x slower than
the project's recipe encodes 832x480 on two cores (BENCHMARKS.md), so only a hung or
pathologically slow tool reaches it."""


def tool_timeout(frames: int, height: int, width: int) -> float:
    """Seconds an ffmpeg run over ``frames`` frames of ``width`` x ``height`` may take
    (``TOOL_TIMEOUT_FLOOR_S`` + ``TOOL_TIMEOUT_S_PER_PIXEL`` per pixel)."""
    return TOOL_TIMEOUT_FLOOR_S + frames * height * width * TOOL_TIMEOUT_S_PER_PIXEL


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` if it still runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _timed_out(argv: list[str], path: Path, timeout_s: float) -> ToolTimeoutError:
    name = Path(argv[0]).name
    return ToolTimeoutError(
        f"{path}: {name} ran past its {timeout_s:.0f} s timeout (derived from the work: "
        f"{TOOL_TIMEOUT_FLOOR_S:.0f} s + {TOOL_TIMEOUT_S_PER_PIXEL:g} s per pixel) and was killed; command: "
        f"{subprocess.list2cmdline(argv)[:2000]}. The tool hung or the node is overloaded: run that command "
        "by hand to see which (set 'encoder/ffmpeg' to a working ffmpeg, or leave it empty for the bundled "
        "one), then rerun")


def _pidfd(pid: int) -> int:
    """A pidfd of ``pid`` (readable once it exits), or -1 where the OS gives none."""
    try:
        return os.pidfd_open(pid) if hasattr(os, "pidfd_open") else -1
    except OSError:  # ENOSYS before Linux 5.3, EPERM under some seccomp profiles
        return -1


WRITE_BYTES = 1 << 20
"""The most ``run_tool`` writes to a tool's stdin per wake-up (a pipe takes 64 KiB)."""


def run_tool(argv: list[str], path: Path, timeout_s: float, feed: memoryview | None = None,
             chunk: int = 1 << 20, progress_lines: bool = False,
             at_end: Callable[[], object] | None = None) -> tuple[int, bytes, bytes]:
    """Run an external tool (argv, no shell) about ``path``, feeding it ``feed`` on stdin;
    return (exit code, stderr, stdout).

    Every ``chunk`` bytes the tool consumes are reported as progress (``progress.report``),
    and with ``progress_lines`` so is each ``frame=N`` line on its stdout (ffmpeg's
    ``-progress pipe:1``), so the job's stall check sees the work advance. With
    ``progress_lines``, ``at_end`` is called once when the tool writes ``progress=end``
    (ffmpeg writes it after closing its outputs, then tears down and exits: work on the
    output overlaps that); it must not raise what it means the caller to see before the
    exit code. After ``timeout_s`` the tool is killed and ToolTimeoutError names the
    file, the command and the fix.

    One loop over a selector, as ``Popen.communicate`` does, but reporting progress while
    it runs (``communicate`` says nothing until the tool ends). Not threads: starting the
    three a tool needs cost about 10 ms beside a starting tool, and ``wait(timeout=)``
    polls with sleeps of up to 50 ms (measured at 64x64: 37 ms per write against bare
    ffmpeg's 22 ms with both; 26 ms without)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    name = Path(argv[0]).name
    deadline = time.monotonic() + timeout_s
    out_fd, err_fd = cast(IO[bytes], proc.stdout).fileno(), cast(IO[bytes], proc.stderr).fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    line = bytearray()  # the part of stdout's last line not yet ended
    view = feed if feed is not None else memoryview(b"")
    sent = reported = 0
    # The tool's exit as an event of the same loop (Linux's pidfd): ``wait(timeout=)``
    # after its pipes close would poll with sleeps from 0.5 ms up. Where there is no pidfd
    # (another OS, a kernel before 5.3, a seccomp filter) the pipes' end is the signal.
    pid_fd = _pidfd(proc.pid)
    try:
        with selectors.DefaultSelector() as sel:
            for fd in chunks:
                sel.register(fd, selectors.EVENT_READ)
            if pid_fd >= 0:
                sel.register(pid_fd, selectors.EVENT_READ)
            stdin = proc.stdin
            in_fd = stdin.fileno() if stdin is not None else -1
            if stdin is not None:
                os.set_blocking(in_fd, False)
                sel.register(in_fd, selectors.EVENT_WRITE)
            while sel.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timed_out(argv, path, timeout_s)
                for key, _ in sel.select(remaining):
                    fd = int(key.fd)
                    if fd == in_fd:
                        try:
                            # As much as the pipe takes: writing a chunk (a frame) per
                            # wake-up cost 0.5 ms of a 21 ms encode at 64x64.
                            sent += os.write(fd, view[sent:sent + WRITE_BYTES])
                        except BlockingIOError:
                            continue
                        except OSError:  # the tool exited early (a broken pipe): its exit code and stderr say why
                            sent = reported = len(view)
                            progress.report(f"{name}: consumed {sent} of {len(view)} bytes for {path.name}")
                        while sent - reported >= chunk or (sent == len(view) and reported < sent):
                            reported = min(reported + chunk, sent)  # one report per chunk, as before
                            progress.report(f"{name}: consumed {reported} of {len(view)} bytes for {path.name}")
                        if sent == len(view):
                            sel.unregister(fd)
                            cast(IO[bytes], stdin).close()
                        continue
                    if fd == pid_fd:
                        sel.unregister(fd)
                        continue
                    data = os.read(fd, 1 << 16)
                    if not data:
                        sel.unregister(fd)
                        continue
                    chunks[fd].append(data)
                    if progress_lines and fd == out_fd:
                        line += data
                        *done, rest = bytes(line).split(b"\n")
                        line[:] = rest
                        for text in done:
                            if text.startswith(b"frame="):
                                progress.report(f"{name}: {text.decode(errors='replace').strip()} of {path.name}")
                            elif text.strip() == b"progress=end" and at_end is not None:
                                at_end()
                                at_end = None
        try:
            code = proc.wait(max(deadline - time.monotonic(), 1.0))  # it closed its output: it is ending
        except subprocess.TimeoutExpired:
            raise _timed_out(argv, path, timeout_s) from None
    finally:
        # Whatever ends the loop (a timeout, SIGTERM's exception, an interrupt), the tool
        # does not outlive it and no descriptor leaks.
        if pid_fd >= 0:
            os.close(pid_fd)
        _kill(proc)
    return code, b"".join(chunks[err_fd]), b"".join(chunks[out_fd])


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
            info = _scan(container, tmp, None)[0]
        check_probe(info, tmp, frames=frames, height=height, width=width, fps=fps, pix_fmt=pix_fmt)
        os.fsync(fh.fileno())
    return _Checked(digest, len(data), info)


def encode(frames: np.ndarray, final: Path, spec: EncoderSpec, fps: int) -> VideoInfo:
    """Encode uint8 (F, H, W, 3) ``frames`` to ``final`` with the fixed recipe.

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
            code, err, _ = run_tool(argv, Path(final), tool_timeout(f, h, w), raw, chunk=h * w * 3,
                                    progress_lines=True, at_end=at_end)
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


# ---------------------------------------------------------------------------- read guards
#
# The general rule: a video is read only if every property it declares that changes its
# decoded pixels has the value the fixed recipe writes (``recipe_declaration``). Anything
# else is refused by name, with its own error and the fix; nothing is guessed, rotated,
# stretched, deinterlaced or concealed.

# ITU-T H.273 code points, as PyAV reports them (ints), to ffmpeg's names.
_TRC = {1: "bt709", 2: "unknown", 4: "gamma22", 5: "gamma28", 6: "smpte170m", 7: "smpte240m", 8: "linear",
        13: "iec61966-2-1", 14: "bt2020-10", 15: "bt2020-12", 16: "smpte2084", 18: "arib-std-b67"}
_PRIMARIES = {1: "bt709", 2: "unknown", 4: "bt470m", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 8: "film",
              9: "bt2020", 11: "smpte431", 12: "smpte432"}
_MATRIX = {0: "gbr", 1: "bt709", 2: "unknown", 4: "fcc", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 8: "ycgco",
           9: "bt2020nc", 10: "bt2020c", 14: "ictcp"}
_RANGE = {0: "unknown", 1: "tv", 2: "pc"}
_FIELD_ORDER = {0: "unknown", 1: "progressive", 2: "tt", 3: "bb", 4: "tb", 5: "bt"}
_UNSPECIFIED = {"unknown"}


def _code_name(table: dict[int, str], value: Any) -> str:
    return table.get(int(value), f"code-{int(value)}")


@dataclass(frozen=True)
class ProbeInfo:
    """Every property of a file that changes its decoded pixels, as PyAV reports it: the
    container's streams, the video stream's codec parameters, every packet's timing and
    every decoded frame's tags and side data. A tag is read from the container and from
    every frame; values that disagree are joined with ``|`` (and so match no allowed value).

    ``mid_stream``: empty when every frame has the first frame's size and pixel format,
    else what changes where; ``side_data``: the frame side-data types seen (``av.sidedata.Type`` names);
    ``chroma_location``: what the H.264 sequence parameter sets declare (``h264``);
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
    PyAV can open)."""
    import av

    if data is None and not path.is_file():
        raise MissingVideoError(f"{path}: no such file; regenerate it (rerun the panel)")
    if (len(data) if data is not None else path.stat().st_size) == 0:
        raise MissingVideoError(f"{path}: zero bytes; the write was interrupted, regenerate it")
    try:
        return av.open(io.BytesIO(data) if data is not None else str(path))
    except av.error.FFmpegError as e:
        raise TruncatedVideoError(f"{path}: cannot be opened as a video ({e}); the file is "
                                  "truncated or corrupt, delete it and regenerate") from e


def _joined(values: set[str]) -> str:
    return "|".join(sorted(values))


def _tag(table: dict[int, str], container_value: Any, frame_values: set[int]) -> str:
    """A tag as the frames declare it, with the container's value when it states one."""
    names = {_code_name(table, v) for v in frame_values}
    declared = _code_name(table, container_value)
    if declared not in _UNSPECIFIED or not names:
        names.add(declared)
    return _joined(names)


def _scan(container: Any, path: Path, rgb: dict[str, Any] | None) -> tuple[ProbeInfo, list[np.ndarray]]:
    """Demux and decode every packet of the first video stream with the decoder's error
    detection on (ffmpeg's ``-err_detect explode``: a damaged packet is an error, never
    concealed) and report every declared property. With ``rgb`` (``VideoFrame.reformat``
    arguments) each frame is also converted to uint8 RGB; conversion stops at the first
    damaged packet."""
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
        chroma_location=(chroma_location(cc.extradata, (bytes(p) for p in packets)) if cc.name == "h264"
                         else f"not declared by {cc.name}"),
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
    if any(t in _HDR_TRC for t in info.color_trc.split("|")):
        names = ", ".join(_HDR_TRC[t] for t in info.color_trc.split("|") if t in _HDR_TRC)
        raise HDRVideoError(f"{path}: HDR transfer {names}; PairFlow scores SDR "
                            "BT.709 only and never tone-maps silently. Re-render SDR, or tone-map "
                            "explicitly before scoring and record how")
    if {*info.color_primaries.split("|"), *info.colorspace.split("|")} & set(_BT2020):
        raise GamutError(f"{path}: BT.2020 primaries/matrix ({info.color_primaries}/{info.colorspace}); "
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


def _check_declaration(info: ProbeInfo, path: Path, allowed: dict[str, tuple[str, ...]]) -> None:
    """The general rule: every property in ``allowed`` has an allowed value, else the
    property's error, naming the property, the value, what the recipe writes and the fix."""
    extra = sorted(set(info.side_data) - set(allowed["side_data"]))
    if extra:
        err: type[VideoReadError] = (DisplayTransformError if set(extra) & _DISPLAY_SIDE_DATA else
                                     ColourTagError if set(extra) & _COLOUR_SIDE_DATA else StreamPropertyError)
        turn = (f" (a display rotation or flip; read as rotation {info.rotation:g} degrees)"
                if "DISPLAYMATRIX" in extra else "")
        raise err(f"{path}: frame side data {', '.join(extra)}{turn}, which the recipe never writes and which "
                  "changes how the frames are shown; PairFlow neither applies nor ignores it silently. "
                  + _REENCODE)
    for name, (err, meaning, fix) in _PROPERTY_RULES.items():
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

"""Video I/O: the one fixed encoder recipe, write guards, read guards, one decode path.

Encoding is part of the evaluation protocol. Frames are checked (dtype, range, NaN,
layout, size) and refused rather than repaired; each video is encoded by one
fingerprinted ffmpeg binary with one recipe, written to a temporary name, probed and
verified, fsynced and renamed. Before a scorer sees a video it is probed again and
anything HDR, deeper than 8 bits, of another pixel format, variable-rate, truncated or
of the wrong geometry is refused with its own error. Decoding to uint8 RGB goes through
one ffmpeg call with an explicit BT.709 limited-range matrix.

ffmpeg is driven through ffmpeg-python (argv lists, no shell); probing uses PyAV.
"""

from __future__ import annotations

import functools
import logging
import subprocess
import threading
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from . import progress
from .atomic import FULL, atomic_path, no_space
from .config import EncoderSpec
from .errors import (
    BitDepthError,
    ConfigError,
    EncodeError,
    FrameError,
    FrameRateError,
    GamutError,
    GeometryError,
    HDRVideoError,
    MissingVideoError,
    PixelFormatError,
    ToolTimeoutError,
    TruncatedVideoError,
)
from .identity import digest_bytes, digest_file, digest_obj

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
    # The mean is exact; the standard deviation (a flatness heuristic) is estimated on
    # every fourth row and column, so the guard costs a few ms next to the encode.
    mean, std = float(out.mean()), float(out[:, ::4, ::4].std(dtype=np.float32))
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


def run_tool(argv: list[str], path: Path, timeout_s: float, feed: memoryview | None = None,
             chunk: int = 1 << 20, progress_lines: bool = False) -> tuple[int, bytes, bytes]:
    """Run an external tool (argv, no shell) about ``path``, feeding it ``feed`` on stdin in
    ``chunk``-byte writes; return (exit code, stderr, stdout).

    Every chunk the tool consumes is reported as progress (``progress.report``), and with
    ``progress_lines`` so is each ``frame=N`` line on its stdout (ffmpeg's ``-progress
    pipe:1``), so the job's stall check sees the work advance. After ``timeout_s`` the
    tool is killed and ToolTimeoutError names the file, the command and the fix."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdin, stdout, stderr = cast(IO[bytes], proc.stdin), cast(IO[bytes], proc.stdout), cast(IO[bytes], proc.stderr)
    name = Path(argv[0]).name
    err: list[bytes] = []
    out: list[bytes] = []

    def read_err() -> None:
        err.append(stderr.read())

    def read_out() -> None:
        if not progress_lines:
            out.append(stdout.read())
            return
        for line in stdout:
            out.append(line)
            if line.startswith(b"frame="):
                progress.report(f"{name}: {line.decode(errors='replace').strip()} of {path.name}")

    def write_in() -> None:
        view = cast(memoryview, feed)
        try:
            for i in range(0, len(view), chunk):
                stdin.write(view[i:i + chunk])
                progress.report(f"{name}: consumed {min(len(view), i + chunk)} of {len(view)} bytes for {path.name}")
            stdin.close()
        except OSError:
            pass  # the tool exited early (a broken pipe): its exit code and stderr say why

    threads = [threading.Thread(target=t, daemon=True, name=f"pairflow-{name}-{t.__name__}")
               for t in ((read_err, read_out, write_in) if feed is not None else (read_err, read_out))]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for t in threads:
            t.join(timeout=5)
        raise ToolTimeoutError(
            f"{path}: {name} ran past its {timeout_s:.0f} s timeout (derived from the work: "
            f"{TOOL_TIMEOUT_FLOOR_S:.0f} s + {TOOL_TIMEOUT_S_PER_PIXEL:g} s per pixel) and was killed; command: "
            f"{subprocess.list2cmdline(argv)[:2000]}. The tool hung or the node is overloaded: run that command "
            "by hand to see which (set 'encoder/ffmpeg' to a working ffmpeg, or leave it empty for the bundled "
            "one), then rerun") from None
    for t in threads:
        t.join()
    return code, b"".join(err), b"".join(out)


def encode(frames: np.ndarray, final: Path, spec: EncoderSpec, fps: int) -> VideoInfo:
    """Encode uint8 (F, H, W, 3) ``frames`` to ``final`` with the fixed recipe.

    Writes to a temporary sibling, probes it (frame count, size, rate, pixel format),
    fsyncs and renames. ``raw_digest`` is the digest of the uncompressed frames. ffmpeg
    reports each frame it encodes as progress and is killed after ``tool_timeout``.
    Raises EncodeError with ffmpeg's stderr, ToolTimeoutError when ffmpeg hangs, or a
    VideoReadError if the output does not verify; nothing is left under ``final`` on
    failure.
    """
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise FrameError(f"encode() takes uint8 (F, H, W, 3) from prepare_frames(); got "
                         f"{frames.dtype} {frames.shape}")
    f, h, w, _ = frames.shape
    # ndarray.data is the array's memoryview (numpy's stubs declare __buffer__ only for
    # Python >= 3.12, so memoryview(array) does not type-check on 3.10).
    raw = np.ascontiguousarray(frames).data.cast("B")  # no copy: fed to ffmpeg and hashed as is
    binary = ffmpeg_binary(spec)
    with atomic_path(Path(final)) as tmp:
        argv = _command(spec, fps, f"{w}x{h}", str(tmp)).compile(cmd=binary)
        # Progress lines on stdout (unused otherwise); they change no output byte, so the
        # recorded recipe does not carry them.
        argv[1:1] = ["-progress", "pipe:1", "-nostats"]
        try:
            code, err, _ = run_tool(argv, Path(final), tool_timeout(f, h, w), raw, chunk=h * w * 3,
                                    progress_lines=True)
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
        info = probe(tmp)
        check_probe(info, tmp, frames=f, height=h, width=w, fps=fps, pix_fmt=expected_pix_fmt(spec))
        digest = digest_file(tmp)
        size = tmp.stat().st_size
    return VideoInfo(str(final), digest, size, f, h, w, f"{fps}/1", info.pix_fmt,
                     digest_bytes(raw))


# ---------------------------------------------------------------------------- read guards

@dataclass(frozen=True)
class ProbeInfo:
    """What PyAV reports of a file's first video stream, plus a decoded frame count."""

    codec: str
    pix_fmt: str
    bits: int
    width: int
    height: int
    frames: int
    fps: str
    vfr: bool
    color_trc: str
    color_primaries: str
    colorspace: str


# ITU-T H.273 code points, as PyAV reports them (ints), to ffmpeg's names.
_TRC = {1: "bt709", 2: "unknown", 6: "smpte170m", 13: "iec61966-2-1", 14: "bt2020-10",
        15: "bt2020-12", 16: "smpte2084", 18: "arib-std-b67"}
_PRIMARIES = {1: "bt709", 2: "unknown", 5: "bt470bg", 6: "smpte170m", 9: "bt2020", 12: "smpte432"}
_MATRIX = {0: "gbr", 1: "bt709", 2: "unknown", 5: "bt470bg", 6: "smpte170m", 9: "bt2020nc", 10: "bt2020c"}


def _code_name(table: dict[int, str], value: Any) -> str:
    return table.get(int(value), f"code-{int(value)}")


def probe(path: Path) -> ProbeInfo:
    """Open ``path`` with PyAV and report on its first video stream (tags from the first
    decoded frame; frame count and timestamps from every packet).

    Raises MissingVideoError (absent, zero bytes, no video stream) or
    TruncatedVideoError (cannot be opened or fails mid-decode).
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise MissingVideoError(f"{path}: no such file; regenerate it (rerun the panel)")
    if path.stat().st_size == 0:
        raise MissingVideoError(f"{path}: zero bytes; the write was interrupted, regenerate it")
    try:
        container = av.open(str(path))
    except av.error.FFmpegError as e:
        raise TruncatedVideoError(f"{path}: cannot be opened as a video ({e}); the file is "
                                  "truncated or corrupt, delete it and regenerate") from e
    with container:
        if not container.streams.video:
            raise MissingVideoError(f"{path}: has no video stream (streams: "
                                    f"{[s.type for s in container.streams]}); this is not a video")
        stream = container.streams.video[0]
        cc = stream.codec_context
        fmt = cc.format
        bits = max((c.bits for c in fmt.components), default=8) if fmt is not None else 8
        # Tags come from the first decoded frame (the container may omit them); the frame
        # count and timestamps come from demuxing every packet, which reads the whole file
        # without decoding it (a full decode happens once, in read_video).
        tags = (cc.color_trc, cc.color_primaries, cc.colorspace)
        pts: list[int] = []
        frames = 0
        try:
            for frame in container.decode(stream):
                tags = (frame.color_trc, frame.color_primaries, frame.colorspace)
                break
            container.seek(0)
            for packet in container.demux(stream):
                if packet.size and packet.pts is not None:
                    frames += 1
                    pts.append(packet.pts)
        except av.error.FFmpegError as e:
            raise TruncatedVideoError(f"{path}: reading failed after {frames} frames ({e}); "
                                      "the file is truncated or corrupt, delete it and regenerate") from e
        pts.sort()
        deltas = {b - a for a, b in zip(pts, pts[1:], strict=False)}
        rate = stream.average_rate or stream.guessed_rate
        return ProbeInfo(
            codec=cc.name, pix_fmt=fmt.name if fmt is not None else "unknown", bits=bits,
            width=cc.width, height=cc.height, frames=frames,
            fps=f"{Fraction(rate).numerator}/{Fraction(rate).denominator}" if rate else "0/1",
            vfr=len(deltas) > 1, color_trc=_code_name(_TRC, tags[0]),
            color_primaries=_code_name(_PRIMARIES, tags[1]), colorspace=_code_name(_MATRIX, tags[2]))


def check_probe(info: ProbeInfo, path: Path, *, frames: int, height: int, width: int, fps: int,
                pix_fmt: str) -> None:
    """Refuse anything a scorer must not see silently. Each problem has its own error."""
    if info.color_trc in _HDR_TRC:
        raise HDRVideoError(f"{path}: HDR transfer {_HDR_TRC[info.color_trc]}; PairFlow scores SDR "
                            "BT.709 only and never tone-maps silently. Re-render SDR, or tone-map "
                            "explicitly before scoring and record how")
    if info.color_primaries in _BT2020 or info.colorspace in _BT2020:
        raise GamutError(f"{path}: BT.2020 primaries/matrix ({info.color_primaries}/{info.colorspace}); "
                            "convert to BT.709 explicitly (e.g. zscale) before scoring")
    if info.bits > 8:
        raise BitDepthError(f"{path}: {info.bits}-bit samples ({info.pix_fmt}); PairFlow does not "
                            "flatten to 8 bits silently. Re-encode to 8-bit with the project's recipe")
    if pix_fmt == "yuv420p" and (info.width % 2 or info.height % 2):
        raise GeometryError(f"{path}: odd size {info.width}x{info.height} and the recipe is 4:2:0; PairFlow never "
                            "resizes silently. Re-encode at an even size with the project's recipe")
    if (info.width, info.height) != (width, height):
        raise GeometryError(f"{path}: size {info.width}x{info.height}, expected {width}x{height}")
    if info.pix_fmt != pix_fmt:
        raise PixelFormatError(f"{path}: pixel format {info.pix_fmt}, the recipe writes {pix_fmt}; "
                               "re-encode with the project's encoder")
    if info.vfr:
        raise FrameRateError(f"{path}: variable frame rate; re-encode at a constant {fps}/1")
    if Fraction(info.fps) != Fraction(fps):
        raise FrameRateError(f"{path}: frame rate {info.fps}, expected {fps}/1")
    if info.frames != frames:
        err = TruncatedVideoError if info.frames < frames else GeometryError
        raise err(f"{path}: {info.frames} frames decoded, {frames} expected; regenerate it")


DECODE_MATRICES = ("bt709", "bt601")
"""YUV->RGB matrices ``read_video`` applies: ``bt709`` is the encoded one; ``bt601`` is what
OpenCV 4.x's ``VideoCapture`` applies whatever the tags say (swscale's default), so VBench,
which reads videos through it, sees BT.601-decoded frames (temporal_flickering equal to the
last digit on the default study's 42 videos decoded by opencv-python-headless 4.10)."""


def read_video(path: Path, spec: EncoderSpec, *, frames: int, height: int, width: int,
               fps: int, matrix: str = "bt709") -> np.ndarray:
    """Probe, check, then decode to uint8 RGB (F, H, W, 3) through the project's ffmpeg with
    an explicit limited-range ``matrix`` (one of ``DECODE_MATRICES``; BT.709 by default, the
    one the video was encoded with). Raises the read-guard errors of ``check_probe``, and
    ConfigError for an unknown matrix."""
    import ffmpeg

    if matrix not in DECODE_MATRICES:
        raise ConfigError(f"decode matrix {matrix!r} is not one of {DECODE_MATRICES}; set scoring/decode to a "
                          "known one")
    check_probe(probe(path), path, frames=frames, height=height, width=width, fps=fps,
                pix_fmt=expected_pix_fmt(spec))
    stream = (ffmpeg.input(str(path))
              .output("pipe:", format="rawvideo", pix_fmt="rgb24",
                      vf=f"scale=in_color_matrix={matrix}:in_range=tv")
              .global_args("-hide_banner", "-nostdin", "-loglevel", "error"))
    code, err, out = run_tool(stream.compile(cmd=ffmpeg_binary(spec)), Path(path), tool_timeout(frames, height, width))
    if code != 0:
        raise TruncatedVideoError(f"{path}: ffmpeg could not decode it: {err.decode(errors='replace').strip()}")
    arr = np.frombuffer(out, dtype=np.uint8)
    if arr.size != frames * height * width * 3:
        raise TruncatedVideoError(f"{path}: decoded {arr.size} bytes, expected "
                                  f"{frames * height * width * 3}; regenerate it")
    return arr.reshape(frames, height, width, 3)

"""Frames before they are encoded: dtype, range, NaN, layout and size checked, and refused
rather than repaired; floats mapped to uint8 by one stated rule; flat and dark frames flagged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import (
    FrameError,
)
from ..plan.config import EncoderSpec

FLOAT_TOLERANCE = 1e-3
"""Float frames may overshoot [0, 1] by this much (resampling ringing); larger is an error."""
FLAT_STD = 1.0
"""A video whose pixel standard deviation is below this (uint8 levels) is flagged near-constant."""
DARK_MEAN = 16.0
"""A video whose mean is below this (uint8 levels) is flagged near-black."""
_FLOAT_DTYPES = ("float16", "bfloat16", "float32")


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

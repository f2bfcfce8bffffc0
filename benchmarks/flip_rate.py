"""How many random single-byte flips of a video decode silently, and what catches them.

Encodes one video with the project's recipe (``media.video.encode``), then for each of N
seeds flips one byte at a random offset (XOR with a random non-zero value) in a copy and
reads the copy three ways: PairFlow's reader (``read_video``: every check, PyAV decode
with ``err_detect=explode``), the ffmpeg CLI (``-err_detect explode -xerror``, decode to
null) and the xxh3 digest the records carry. A flip "decodes silently" when the reader
returns frames without an error; of those it counts the ones whose frames equal the
original's (the flip hit bytes the decoder does not use) and the ones whose pixels
differ (silent corruption). The digest differs for every flip by construction; the
benchmark checks it anyway.

    python benchmarks/flip_rate.py [--flips 100] [--size 64x64x9]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from pairflow.errors import PairFlowError
from pairflow.identity import digest_bytes
from pairflow.media.recipe import ffmpeg_binary
from pairflow.media.video import encode, read_video
from pairflow.plan.config import EncoderSpec


def frames(f: int, h: int, w: int) -> np.ndarray:
    """A moving gradient (as ``read_speed.py``): every frame and pixel differs."""
    t, y, x = (np.arange(f)[:, None, None, None] / f, np.linspace(0, 1, h)[None, :, None, None],
               np.linspace(0, 1, w)[None, None, :, None])
    full = np.ones((f, h, w, 1))
    rgb = np.concatenate([(0.5 + 0.5 * np.sin(6.28 * (x + t))) * full, y * full, (x * y) * full], axis=3)
    return np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flips", type=int, default=100)
    ap.add_argument("--size", default="64x64x9", help="WxHxFRAMES (default: the default study's videos)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    w, h, f = (int(v) for v in args.size.split("x"))
    spec = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    binary = ffmpeg_binary(spec)
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        original = Path(tmp) / "v.mp4"
        encode(frames(f, h, w), original, spec, 8)
        data = original.read_bytes()
        clean = read_video(original, spec, frames=f, height=h, width=w, fps=8)
        counts = {"refused": 0, "silent_same": 0, "silent_changed": 0, "ffmpeg_silent": 0, "digest_caught": 0}
        for _ in range(args.flips):
            at = int(rng.integers(len(data)))
            flipped = bytearray(data)
            flipped[at] ^= int(rng.integers(1, 256))
            copy = Path(tmp) / "flipped.mp4"
            copy.write_bytes(bytes(flipped))
            counts["digest_caught"] += digest_bytes(bytes(flipped)) != digest_bytes(data)
            try:
                got = read_video(copy, spec, frames=f, height=h, width=w, fps=8)
            except PairFlowError:
                counts["refused"] += 1
            else:
                counts["silent_same" if np.array_equal(got, clean) else "silent_changed"] += 1
            cli = subprocess.run([binary, "-nostdin", "-v", "error", "-err_detect", "explode", "-xerror", "-i",
                                  str(copy), "-f", "null", "-"], capture_output=True, timeout=120, check=False)
            counts["ffmpeg_silent"] += cli.returncode == 0 and not cli.stderr.strip()
    n = args.flips
    silent = counts["silent_same"] + counts["silent_changed"]
    print(f"{w}x{h} x {f} frames, {len(data)} bytes, {n} single-byte flips (seed {args.seed}):")
    print(f"  read_video decodes silently: {silent} of {n} ({counts['silent_changed']} with other pixels, "
          f"{counts['silent_same']} with the same pixels); refused: {counts['refused']}")
    print(f"  ffmpeg CLI (-err_detect explode -xerror) decodes silently: {counts['ffmpeg_silent']} of {n}")
    print(f"  xxh3 digest differs from the recorded one: {counts['digest_caught']} of {n}")


if __name__ == "__main__":
    main()

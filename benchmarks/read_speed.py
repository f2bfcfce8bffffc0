"""read_video (every check, one open, in-process decode) against a bare PyAV decode of the same file.

Prints the fastest of alternated runs (on a shared machine the minimum is the figure least
disturbed by other load; the median is printed beside it) at 64x64 x 9 frames (the default study) and 832x480 x 33 frames
(Wan2.1's 480p), against PyAV with its default threads and with one decoder thread (what read_video
uses, so that damaged streams are refused the same way on every read).

    python benchmarks/read_speed.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import av
import numpy as np

from pairflow.media.video import encode, read_video
from pairflow.plan.config import EncoderSpec


def frames(f: int, h: int, w: int) -> np.ndarray:
    t, y, x = np.arange(f)[:, None, None, None] / f, np.linspace(0, 1, h)[None, :, None, None], np.linspace(0, 1, w)[None, None, :, None]
    full = np.ones((f, h, w, 1))
    rgb = np.concatenate([(0.5 + 0.5 * np.sin(6.28 * (x + t))) * full, y * full, (x * y) * full], axis=3)
    return np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8)


def bare(path: Path, threads: int | None) -> np.ndarray:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        if threads is not None:
            s.codec_context.thread_count = threads
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(s)])


def main() -> None:
    spec = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    tmp = Path(tempfile.mkdtemp())
    for (f, h, w), runs in (((9, 64, 64), 41), ((33, 480, 832), 11)):
        path = tmp / f"{w}x{h}.mp4"
        encode(frames(f, h, w), path, spec, 8)
        times: dict[str, list[float]] = {"read_video": [], "pyav": [], "pyav_1thread": []}
        for _ in range(runs):
            for name in times:
                t = time.perf_counter()
                if name == "read_video":
                    read_video(path, spec, frames=f, height=h, width=w, fps=8)
                else:
                    bare(path, 1 if name == "pyav_1thread" else None)
                times[name].append(time.perf_counter() - t)
        for label, stat in (("min", min), ("median", statistics.median)):
            m = {k: stat(v) for k, v in times.items()}
            print(f"{w}x{h} x {f} ({label}): read_video {m['read_video'] * 1e3:.1f} ms; bare PyAV {m['pyav'] * 1e3:.1f} ms "
                  f"(ratio {m['read_video'] / m['pyav']:.2f}); bare PyAV one thread {m['pyav_1thread'] * 1e3:.1f} ms "
                  f"(ratio {m['read_video'] / m['pyav_1thread']:.2f})")
        path.unlink()


if __name__ == "__main__":
    main()

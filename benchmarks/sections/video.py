"""The ``video`` section of ``benchmarks/run.py``. Encode and decode: the fixed-encoder writer
against the bare ffmpeg CLI."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import (
    frames,
    median_time,
)


def bench_video(runs: int, quick: bool = False) -> dict[str, Any]:
    """Writer (guards + encode + probe + digest + fsync + rename) vs the bare ffmpeg CLI on
    the same raw frames and recipe, alternated in one run; decode throughput likewise."""
    from pairflow.media.recipe import _output_args
    from pairflow.media.video import encode, ffmpeg_binary, prepare_frames, read_video
    from pairflow.plan.config import EncoderSpec

    spec = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    u8 = frames(9, 64, 64) if quick else frames(33, 480, 832)  # Wan2.1's 480p frame size
    f, h, w, _ = u8.shape
    tmp = Path(tempfile.mkdtemp())
    args = []
    for k, v in _output_args(spec, 8).items():
        args += [f"-{k}", str(v)]
    bare = [ffmpeg_binary(spec), "-hide_banner", "-nostdin", "-loglevel", "error", "-y", "-f", "rawvideo",
            "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-framerate", "8/1", "-i", "pipe:", *args, str(tmp / "bare.mp4")]
    writer_t, bare_t = [], []
    for _ in range(runs):
        t = time.perf_counter()
        prepared, _ = prepare_frames(u8, spec)
        encode(prepared, tmp / "w.mp4", spec, 8)
        writer_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(bare, input=u8.tobytes(), check=True)
        bare_t.append(time.perf_counter() - t)
    dec = median_time(lambda: read_video(tmp / "w.mp4", spec, frames=f, height=h, width=w, fps=8), runs)
    bare_dec_cmd = [ffmpeg_binary(spec), "-hide_banner", "-loglevel", "error", "-i", str(tmp / "w.mp4"),
                    "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:"]
    bare_dec = median_time(lambda: subprocess.run(bare_dec_cmd, check=True, capture_output=True), runs)
    shutil.rmtree(tmp)
    wm, bm = statistics.median(writer_t), statistics.median(bare_t)
    return {"frames": f, "size": f"{w}x{h}", "runs": runs,
            "writer_median_s": wm, "bare_ffmpeg_median_s": bm, "writer_over_bare": wm / bm,
            "writer_fps": f / wm, "bare_fps": f / bm,
            "decode_read_video_fps": f / dec, "decode_bare_fps": f / bare_dec, "read_video_over_bare": dec / bare_dec}

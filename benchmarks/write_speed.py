"""The writer (``video.encode``: guards, encode, the decode-back check, probe, digest,
fsync, rename) against the bare ffmpeg CLI on the same raw frames and recipe arguments.

Prints the fastest of alternated runs (on a shared machine the minimum is the figure least
disturbed by other load; the median beside it) at 64x64 x 9 frames (the default study)
and 832x480 x 33 frames (Wan2.1's 480p). Goal (issue 25): writer <= 1.15x bare.

    python benchmarks/write_speed.py [--save]    (--save: into benchmarks/results.json, rendered
                                                  into BENCHMARKS.md by render.py)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from read_speed import frames

from pairflow.config import EncoderSpec
from pairflow.video import _output_args, encode, ffmpeg_binary, prepare_frames


def main() -> None:
    spec = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    tmp = Path(tempfile.mkdtemp())
    out: dict[str, dict[str, float]] = {}
    for (f, h, w), runs in (((9, 64, 64), 31), ((33, 480, 832), 9)):
        u8 = frames(f, h, w)
        args = [str(x) for k, v in _output_args(spec, 8).items() for x in (f"-{k}", v)]
        bare = [ffmpeg_binary(spec), "-hide_banner", "-nostdin", "-loglevel", "error", "-y", "-f", "rawvideo",
                "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-framerate", "8/1", "-i", "pipe:", *args,
                str(tmp / "bare.mp4")]
        times: dict[str, list[float]] = {"writer": [], "bare": []}
        for _ in range(runs):
            t = time.perf_counter()
            prepared, _ = prepare_frames(u8, spec)
            encode(prepared, tmp / f"w{w}.mp4", spec, 8)
            times["writer"].append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(bare, input=u8.tobytes(), check=True)
            times["bare"].append(time.perf_counter() - t)
        wmin, bmin = min(times["writer"]), min(times["bare"])
        wmed, bmed = statistics.median(times["writer"]), statistics.median(times["bare"])
        print(f"{w}x{h}x{f}: writer {wmin * 1e3:.1f} ms (median {wmed * 1e3:.1f}), bare ffmpeg {bmin * 1e3:.1f} ms "
              f"(median {bmed * 1e3:.1f}); writer/bare {wmin / bmin:.3f} (medians {wmed / bmed:.3f})", flush=True)
        out[f"{w}x{h}x{f}"] = {"runs": runs, "writer_min_s": wmin, "bare_min_s": bmin, "writer_median_s": wmed,
                               "bare_median_s": bmed, "ratio_min": wmin / bmin, "ratio_median": wmed / bmed}
    if "--save" in sys.argv:
        path = Path(__file__).resolve().parent / "results.json"
        results = json.loads(path.read_text())
        results["write_speed"] = {"sizes": out, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

"""The writer (``video.encode``: guards, encode, the decode-back check, probe, digest,
fsync, rename) against the bare ffmpeg CLI on the same raw frames and recipe arguments.

Prints the fastest of alternated runs (on a shared machine the minimum is the figure least
disturbed by other load; the median beside it) at 64x64 x 9 frames (the default study)
and 832x480 x 33 frames (Wan2.1's 480p). Goal (issue 25): writer <= 1.15x bare.

Fair to bare ffmpeg: it runs the writer's own compiled argv (``video._argv``: the same
recipe, ``-nostdin`` and log level; without only the writer's ``-progress pipe:1``), fed the
same frames without a copy, writing into the same folder; one untimed warm-up of each; the
order alternates every run (writer first on even runs, bare first on odd ones).

    python benchmarks/write_speed.py [--save]    (--save: into benchmarks/results.json, rendered
                                                  into BENCHMARKS.md by render.py)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from read_speed import frames

from pairflow.media.recipe import _argv
from pairflow.media.video import OUTPUT_PLACEHOLDER, encode, ffmpeg_binary, prepare_frames
from pairflow.plan.config import EncoderSpec


def main() -> None:
    spec = EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False)
    tmp = Path(tempfile.mkdtemp())
    out: dict[str, dict[str, float]] = {}
    for (f, h, w), runs in (((9, 64, 64), 31), ((33, 480, 832), 9)):
        u8 = frames(f, h, w)
        raw = u8.data.cast("B")
        bare = [str(tmp / "bare.mp4") if a == OUTPUT_PLACEHOLDER else a
                for a in _argv(spec, 8, f"{w}x{h}", ffmpeg_binary(spec))]

        def writer(u8: np.ndarray = u8, out: Path = tmp / f"w{w}.mp4") -> None:
            prepared, _ = prepare_frames(u8, spec)
            encode(prepared, out, spec, 8)

        def bare_ffmpeg(argv: list[str] = bare, raw: memoryview = raw) -> None:
            subprocess.run(argv, input=raw, check=True)

        times: dict[str, list[float]] = {"writer": [], "bare": []}
        for i in range(runs + 1):  # run 0: warm-up, not kept
            for name, fn in (("writer", writer), ("bare", bare_ffmpeg))[:: 1 if i % 2 == 0 else -1]:
                t = time.perf_counter()
                fn()
                if i:
                    times[name].append(time.perf_counter() - t)
        wmin, bmin = min(times["writer"]), min(times["bare"])
        wmed, bmed = statistics.median(times["writer"]), statistics.median(times["bare"])
        print(f"{w}x{h}x{f}: writer {wmin * 1e3:.1f} ms (median {wmed * 1e3:.1f}), bare ffmpeg {bmin * 1e3:.1f} ms "
              f"(median {bmed * 1e3:.1f}); writer/bare {wmin / bmin:.3f} (medians {wmed / bmed:.3f})", flush=True)
        out[f"{w}x{h}x{f}"] = {"runs": runs, "writer_min_s": wmin, "bare_min_s": bmin, "writer_median_s": wmed,
                               "bare_median_s": bmed, "ratio_min": wmin / bmin, "ratio_median": wmed / bmed}
    if "--save" in sys.argv:
        path = Path(__file__).resolve().parent / "results.json"
        results = json.loads(path.read_text())
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        load = os.getloadavg()[0]
        # every saved run is kept (the note quotes the spread of several), the table shows the last
        history = [*results.get("write_speed", {}).get("history", []),
                   {"date": date, "load_1min": round(load, 2),
                    "ratio_median": {k: round(v["ratio_median"], 3) for k, v in out.items()},
                    "ratio_min": {k: round(v["ratio_min"], 3) for k, v in out.items()}}]
        results["write_speed"] = {**results.get("write_speed", {}), "sizes": out, "date": date, "history": history}
        path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

"""Peak memory of converting float frames to uint8 (video.prepare_frames), issue 22.

Usage: python benchmarks/convert_memory.py PACKAGE_ROOT SIDE  (e.g. workflow 8192)
One (1, SIDE, SIDE, 3) float32 frame; prints tracemalloc's peak and the process's peak
RSS. Run it against an old checkout's package root to compare.
"""

import resource
import sys
import time
import tracemalloc

import numpy as np
import torch  # noqa: F401  prepare_frames imports it; keep its memory out of the figure

sys.path.insert(0, sys.argv[1])
from pairflow.media import video
from pairflow.plan.config import EncoderSpec

side = int(sys.argv[2])
arr = np.random.default_rng(0).random((1, side, side, 3), dtype=np.float32)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
t = time.perf_counter()
video.prepare_frames(arr, EncoderSpec("", "libx264", 18, "medium", "yuv420p", 16, 1, False, False))
elapsed = time.perf_counter() - t
peak = tracemalloc.get_traced_memory()[1]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"input {arr.nbytes / 2**20:.0f} MiB; conversion peak (tracemalloc) {peak / 2**20:.0f} MiB; "
      f"peak RSS {rss / 1024:.0f} MiB (before converting {base / 1024:.0f} MiB); {elapsed:.2f} s")

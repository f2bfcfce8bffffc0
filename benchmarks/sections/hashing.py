"""The ``hash`` section of ``benchmarks/run.py``. Hashing: xxh3 against sha256, and
``digest_file``'s throughput."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .common import (
    median_time,
)


def bench_hash(runs: int, quick: bool = False) -> dict[str, Any]:

    from pairflow.identity import digest_file

    tmp = Path(tempfile.mkdtemp()) / "blob.bin"
    size = (8 if quick else 256) << 20
    tmp.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    data = tmp.read_bytes()
    xx = median_time(lambda: xxhash.xxh3_128_hexdigest(data), runs)
    sha = median_time(lambda: hashlib.sha256(data).hexdigest(), runs)
    f = median_time(lambda: digest_file(tmp), runs)
    shutil.rmtree(tmp.parent)
    mb = size / 1e6
    return {"bytes": size, "xxh3_128_MBps": mb / xx, "sha256_MBps": mb / sha, "sha256_over_xxh3": sha / xx,
            "digest_file_MBps": mb / f}

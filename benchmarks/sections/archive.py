"""The ``archive`` section of ``benchmarks/run.py``. Archive: packed against plain snapshots
(``archive_bench``)."""

from __future__ import annotations

from typing import Any


def bench_archive(runs: int, quick: bool = False) -> dict[str, Any]:
    """Packed against plain archive snapshots (``archive_bench``: files, bytes, promotion,
    verify, one-panel re-promotion) at 31,000 and 100,006 candidates."""
    from archive_bench import bench_archive as archive

    return archive(runs, quick)

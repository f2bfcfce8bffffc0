"""progress: reports reach the sink installed for the block, and nowhere else."""

from __future__ import annotations

import threading

from pairflow import progress


def test_reports_reach_the_block_sink_only_and_nest() -> None:
    outer: list[str] = []
    inner: list[str] = []
    progress.report("before any sink: dropped")
    with progress.reporting_to(outer.append):
        progress.report("a")
        with progress.reporting_to(inner.append):
            progress.report("b")
        progress.report("c")
    progress.report("after: dropped")
    assert outer == ["a", "c"] and inner == ["b"]


def test_reports_from_other_threads_arrive_and_a_failing_sink_never_reaches_the_work() -> None:
    got: list[str] = []

    def sink(note: str) -> None:
        if note == "disk full":
            raise OSError(28, "No space left on device")
        got.append(note)

    with progress.reporting_to(sink):
        threads = [threading.Thread(target=progress.report, args=(f"t{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        progress.report("disk full")  # the heartbeat could not be written: the task goes on
    assert sorted(got) == [f"t{i}" for i in range(8)]

"""startup: a panel job's start-up timeline from its telemetry record, the driver's marks
and a worker's own marks."""

from __future__ import annotations

import os
import time

import pytest

from pairflow.fleet.startup import DRIVER_MARKS, MARKS, WORKER_MARKS, mark, timeline, worker_marks
from pairflow.fleet.telemetry import process_start


def _span(rank: int, started: float, finished: float, **extra: object) -> dict:
    return {"host": "n1", "rank": rank, "gpu_index": None, "queued": 0.0, "started": started, "finished": finished,
            **extra}


def test_timeline_counts_to_each_slots_first_real_task_not_its_warm_up() -> None:
    """Start-up ends when a slot starts real work: the warm-up (imports, model load) and a
    failed attempt are inside it, never its end; worker marks are the median over warm-ups."""
    start = 1000.0
    marks0 = {"manager_started": 1003.0, "worker_started": 1004.0, "warm_up_started": 1005.0,
              "torch_diffusers_imported": 1009.0, "pipeline_imported": 1011.0, "model_loaded": 1011.5,
              "scorers_imported": 1013.0}
    marks1 = {k: v + 1.0 for k, v in marks0.items()}
    record = {"job": {"start": start},
              "startup_marks": {"driver_imported": 1001.0, "driver_ready": 1001.5, "pool_loaded": 1002.0},
              "spans": [_span(0, 1005.0, 1013.0, kind="warm-up", warm_up={"marks": marks0}),
                        _span(1, 1006.0, 1014.0, kind="warm-up", warm_up={"marks": marks1}),
                        _span(0, 1013.2, 1014.0, failure="retried", attempt=True),  # an attempt is no first task
                        _span(0, 1014.5, 1015.0), _span(1, 1016.0, 1017.0), _span(0, 1015.0, 1016.0)]}
    t = timeline(record)
    assert t["first_task_s"] == pytest.approx(14.5) and t["last_slot_s"] == pytest.approx(16.0)
    assert t["slots"] == 2 and t["warm_ups"] == 2
    assert t["marks"]["driver_imported"] == pytest.approx(1.0) and t["marks"]["parsl_imported"] is None
    assert t["marks"]["warm_up_started"] == pytest.approx(5.5)  # median of 5 and 6
    assert t["marks"]["model_loaded"] == pytest.approx(12.0)
    assert list(t["marks"]) == [*DRIVER_MARKS, *WORKER_MARKS]


def test_timeline_without_tasks_or_marks_says_none() -> None:
    t = timeline({"job": {"start": 5.0}, "spans": [_span(0, 6.0, 9.0, kind="warm-up", warm_up={})]})
    assert t["first_task_s"] is None and t["last_slot_s"] is None and t["warm_ups"] == 0
    assert all(v is None for v in t["marks"].values())


def test_a_mark_keeps_the_first_time_it_was_reached() -> None:
    MARKS.pop("test_mark", None)
    mark("test_mark", 10.0)
    mark("test_mark", 20.0)
    assert MARKS["test_mark"] == 10.0
    mark("test_mark", 30.0, again=True)  # a pool's marks: the pool just started
    assert MARKS.pop("test_mark") == 30.0


def test_worker_marks_are_this_process_and_its_parent() -> None:
    m = worker_marks()
    assert m["worker_started"] == process_start() <= m["warm_up_started"] <= time.time()
    assert m["manager_started"] == process_start(os.getppid()) <= m["worker_started"]

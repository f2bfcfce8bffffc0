"""ledger: every slot-second of every job attributed to an arm and stage as work, warm-up,
start-up, idle, failed or retried; added to across runs, never replaced."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import small_config

from pairflow.atomic import write_text
from pairflow.budget.ledger import KINDS, fanout_job, job_key, markdown, timed_pass_job, update
from pairflow.fleet.telemetry import honest_share
from pairflow.layout import Layout
from pairflow.plan.candidates import telemetry_path
from pairflow.plan.config import study_from_raw


def span(rank: int, started: float, finished: float, **kw: object) -> dict:
    return {"host": "n1", "rank": rank, "gpu_index": None, "queued": 0.0, "started": started, "finished": finished,
            **kw}


def record(start: float, label: str = "generate and score t") -> dict:
    """A combined job's telemetry: two slots from start to start+20, a warm-up each, work of
    two arms, one retried attempt and one failed task."""
    s = start
    spans = [span(0, s + 2, s + 4, kind="warm-up"), span(1, s + 3, s + 4, kind="warm-up"),
             span(0, s + 4, s + 10, stage="generate", arm="control"),
             span(1, s + 4, s + 6, stage="generate", arm="fewstep", failure="retried", attempt=True),
             span(1, s + 6, s + 8, stage="generate", arm="fewstep"),
             span(0, s + 10, s + 12, stage="score", arm="fewstep"),
             span(1, s + 8, s + 9, stage="generate", arm="fewstep", failure="other", attempt=True),
             {"queued": 0.0, "started": None, "finished": s + 9, "failure": "other", "arm": "fewstep"}]
    return {"kind": "telemetry", "label": label, "window": {"start": s + 1, "end": s + 20}, "spans": spans,
            "slots": {}, "nvml": {"status": "unavailable: no NVML"},
            "job": {"start": s, "end": s + 20, **honest_share(spans, (s, s + 20), ["n1/cpu0", "n1/cpu1"])}}


def test_every_slot_second_lands_on_an_arm_and_stage_by_kind():
    job = fanout_job(record(100.0), "generate-score")
    by = {(r["arm"], r["stage"], r["kind"]): r["slot_s"] for r in job["rows"]}
    assert job["slot_s"] == 40.0 and sum(by.values()) == pytest.approx(40.0)  # nothing lost, nothing doubled
    assert by[("control", "generate", "work")] == 6.0 and by[("fewstep", "generate", "work")] == 2.0
    assert by[("fewstep", "generate", "retried")] == 2.0 and by[("fewstep", "generate", "failed")] == 1.0
    assert by[("fewstep", "score", "work")] == 2.0
    assert job["shared"] == {"warm-up": 3.0, "start-up": 2.0 + 3.0, "idle": pytest.approx(40 - 13 - 3 - 5)}
    # shared time split by each (arm, stage)'s own seconds: control generate has 6 of 13
    assert by[("control", "generate", "warm-up")] == pytest.approx(3.0 * 6 / 13)
    assert {k for _, _, k in by} == set(KINDS)


def test_the_timed_pass_is_timing_work_split_by_runs():
    rec = {"label": "timed pass", "window": {"start": 0.0, "end": 30.0},
           "per_arm": {"control": {"runs": 4}, "fbcache": {"runs": 2}}}
    rows = {r["arm"]: r["slot_s"] for r in timed_pass_job(rec)["rows"]}
    assert rows == {"control": 20.0, "fbcache": 10.0}


def _study(tmp: Path):
    cfg = small_config(tmp, tmp / "model")
    return study_from_raw(copy.deepcopy(cfg), tmp, source="test")


def test_a_rerun_adds_to_the_ledger_and_keeps_the_failed_runs_seconds(tmp_path):
    study = _study(tmp_path)
    tel = telemetry_path(Layout(study.scratch), "t", "generate-score")
    write_text(tel, json.dumps(record(100.0)))
    first = update(study, now=1.0)
    assert list(first["jobs"]) == [job_key(record(100.0))] and first["totals"]["slot_s"] == 40.0
    assert update(study, now=2.0)["totals"]["slot_s"] == 40.0  # the same job is not counted twice
    write_text(tel, json.dumps(record(500.0)))  # the rerun overwrites the job's telemetry
    est = {"total_slot_s": 60.0, "gpu_hours": 60 / 3600, "unit": "CPU-worker-hours", "stage_slot_s": {},
           "arm_slot_s": {}, "calibration": {"key": "xxh3_128:00", "device": "cpu"}, "wall_s": 30.0}
    book = update(study, estimate=est, now=3.0)
    assert len(book["jobs"]) == 2 and book["totals"]["slot_s"] == 80.0
    assert book["totals"]["by_kind"]["failed"] == 2.0 and book["totals"]["by_kind"]["retried"] == 4.0
    assert [len(r["jobs"]) for r in book["runs"]] == [1, 1]
    on_disk = json.loads(Layout(study.scratch).ledger().read_text())
    assert on_disk == json.loads(json.dumps(book))
    text = markdown(book)
    assert "estimate / ledger = 0.75" in text and "| fewstep | generate |" in text and "unavailable" in text

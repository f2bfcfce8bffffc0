"""ledger: every job of the study with what it held (the scheduler's figures where there
is one) and the work inside, every held slot-second attributed to an arm and stage by kind;
added to across runs, never replaced."""

from __future__ import annotations

import copy
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import small_config

from pairflow.atomic import write_text
from pairflow.budget.ledger import (
    KINDS,
    STUDY_ARM,
    entries,
    job_entry,
    markdown,
    spans_work,
    timed_work,
    update,
)
from pairflow.fleet.telemetry import honest_share
from pairflow.layout import Layout
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


def account(rule: str, start: float, end: float | None, status: str = "ok", threads: int = 2,
            work: dict | None = None, slurm_job: str | None = None, **kw: Any) -> dict:
    return {"kind": "job-account", "job": rule, "rule": rule, "wildcards": kw.pop("wildcards", {}), "attempt": 1,
            "pid": 1, "host": "elsewhere", "start": start, "end": end, "status": status, "threads": threads,
            "resources": {}, "slurm_job": slurm_job, "slurm": {}, "notes": {"work": work} if work else {},
            "cpu_s": kw.pop("cpu_s", {"self": 1.0, "children": 0.5}), **kw}


def scheduler(job_id: str, start: float, end: float, gpus: int, cpus: int = 2, state: str = "COMPLETED") -> dict:
    return {"source": "scontrol", "job_id": job_id, "state": state, "terminal": True, "exit_code": "0:0",
            "submit": start - 5, "start": start, "end": end, "elapsed_s": end - start, "nodes": 1,
            "node_list": "n1", "cpus": cpus, "gpus": gpus, "tres": f"cpu={cpus},gres/gpu={gpus}", "read_at": end + 1}


def rows(entry: dict) -> dict[tuple[str, str, str], float]:
    return {(r["arm"], r["stage"], r["kind"]): r["slot_s"] for r in entry["rows"]}


def test_a_local_fanout_job_lands_every_held_core_second_on_an_arm_and_stage_by_kind():
    # the job held 2 cores for 25 s (its process: 5 s before the telemetry's window opened)
    acc = account("generate_score_panel", 95.0, 120.0, work=spans_work(record(100.0), "generate-score"))
    e = job_entry(acc, None, 1.0, now=200.0)
    by = rows(e)
    assert e["held"]["slot_s"] == 50.0 and e["held"]["slot"] == "core" and e["held"]["gpus"] == 0
    assert sum(by.values()) == pytest.approx(50.0)  # nothing lost, nothing doubled
    assert by[("control", "generate", "work")] == 6.0 and by[("fewstep", "generate", "work")] == 2.0
    assert by[("fewstep", "generate", "retried")] == 2.0 and by[("fewstep", "generate", "failed")] == 1.0
    assert e["work"]["slot_s"] == 10.0 and e["busy_share"] == pytest.approx(10.0 / 50.0)
    # the telemetry's idle stays idle; the 10 s before its window and its own start-up are start-up
    kinds = {k: sum(v for (_, _, kk), v in by.items() if kk == k) for k in KINDS}
    assert kinds["warm-up"] == pytest.approx(3.0) and kinds["idle"] == pytest.approx(40 - 13 - 3 - 5)
    assert kinds["start-up"] == pytest.approx(50 - 13 - 3 - (40 - 13 - 3 - 5))
    assert by[("control", "generate", "warm-up")] == pytest.approx(3.0 * 6 / 13)  # shared time by own seconds


def test_a_gpu_job_is_held_as_the_scheduler_granted_it_not_as_its_process_saw_it():
    # Slurm held 2 GPUs for 60 s; the job's Python ran 50 s of it and timed on one GPU for 20 s
    timed = timed_work({"label": "timed pass", "window": {"start": 10.0, "end": 30.0},
                        "per_arm": {"control": {"runs": 4}, "fbcache": {"runs": 2}}})
    acc = account("timed_pass", 5.0, 55.0, work=timed, slurm_job="7")
    e = job_entry(acc, scheduler("7", 0.0, 60.0, gpus=2, cpus=8), 1.0, now=100.0)
    assert e["held"]["gpu_s"] == 120.0 and e["held"]["slot_s"] == 120.0 and e["held"]["cpu_s"] == 480.0
    assert "scheduler" in e["held"]["from"] and e["status"] == "ok"
    by = rows(e)
    assert by[("control", "timing", "work")] == pytest.approx(20 * 4 / 6)
    assert by[(STUDY_ARM, "timing", "idle")] == pytest.approx(100.0) and e["busy_share"] == pytest.approx(20 / 120)


def test_a_cpu_job_works_its_cpu_seconds_and_a_gpu_held_without_work_is_idle():
    e = job_entry(account("study_stats", 0.0, 4.0, threads=1, cpu_s={"self": 2.5, "children": 0.5}), None, 1.0, 9.0)
    assert rows(e) == {(STUDY_ARM, "stats", "work"): 3.0, (STUDY_ARM, "stats", "idle"): 1.0}
    e = job_entry(account("calibrate", 0.0, 4.0, slurm_job="8"), scheduler("8", 0.0, 10.0, gpus=1), 1.0, 20.0)
    assert e["work"]["slot_s"] == 0.0 and rows(e) == {(STUDY_ARM, "calibrate", "idle"): 10.0}


def test_failed_and_killed_jobs_cost_all_they_held(tmp_path: Path):
    failed = job_entry(account("generate_score_panel", 0.0, 10.0, status="failed", error={"type": "X"}), None, 1.0,
                       20.0)
    assert failed["status"] == "failed" and rows(failed) == {(STUDY_ARM, "generate-score", "failed"): 20.0}
    # killed by Slurm (its Python never wrote its end): the scheduler's end and state stand
    killed = job_entry(account("generate_score_panel", 2.0, None, status="running", slurm_job="9"),
                       scheduler("9", 0.0, 30.0, gpus=1, state="CANCELLED"), 1.0, 99.0)
    assert killed["status"] == "killed" and killed["held"]["slot_s"] == 30.0


def _write(folder: Path, name: str, rec: dict) -> None:
    write_text(folder / f"{name}.json", json.dumps(rec))


def test_rules_grouped_in_one_slurm_job_share_its_held_time_and_a_submission_alone_is_a_job(tmp_path: Path):
    _write(tmp_path, "job-a", account("plots", 10.0, 20.0, slurm_job="5"))
    _write(tmp_path, "job-b", account("gallery", 20.0, 50.0, slurm_job="5"))
    sub = {"kind": "slurm-job", "slurm_job": "6", "rule": "generate_score_panel", "wildcards": {"panel": "t"},
           "attempt": 1, "outcome": "error", "scheduler": scheduler("6", 0.0, 8.0, gpus=1, state="FAILED")}
    _write(tmp_path, "slurm-6", sub)
    asked: list[str] = []

    def look_up(job_id: str) -> dict:
        asked.append(job_id)
        return scheduler(job_id, 0.0, 80.0, gpus=2)

    got = entries(tmp_path, now=100.0, scheduler=look_up)
    assert asked == ["5"]  # the submission's own record already had the scheduler's figures
    assert got["job-a"]["held"]["gpu_s"] + got["job-b"]["held"]["gpu_s"] == pytest.approx(160.0)
    assert got["job-b"]["held"]["gpu_s"] == pytest.approx(3 * got["job-a"]["held"]["gpu_s"])
    alone = got["slurm-6"]
    assert alone["status"] == "failed" and alone["held"]["gpu_s"] == 8.0 and alone["job"] == "generate_score_panel-panel=t"


def _study(tmp: Path):
    cfg = small_config(tmp, tmp / "model")
    return study_from_raw(copy.deepcopy(cfg), tmp, source="test")


def test_a_rerun_adds_to_the_ledger_rereads_running_jobs_and_never_counts_one_twice(tmp_path, monkeypatch):
    study = _study(tmp_path)
    folder = Layout(study.scratch).accounts
    monkeypatch.delenv("PAIRFLOW_ACCOUNTS", raising=False)
    write_text(Layout(study.scratch).ledger(), json.dumps({"kind": "ledger", "jobs": {}, "runs": []}))  # format 1
    _write(folder, "job-gen", account("generate_score_panel", 95.0, 120.0,
                                      work=spans_work(record(100.0), "generate-score"), wildcards={"panel": "t"}))
    mine = {"pid": os.getpid(), "host": socket.gethostname()}
    import psutil

    _write(folder, "job-util", account("utilisation", psutil.Process().create_time(), None, status="running",
                                       threads=1, **mine))
    first = update(study, now=1000.0)
    assert Layout(study.scratch).ledger().with_name("ledger.format1.json").is_file()  # kept beside, not mixed in
    assert first["jobs"]["job-util"]["status"] == "running" and first["totals"]["jobs"] == 2
    # the utilisation job ends; the archive job runs: the next update re-reads the one and never bills the
    # other (the ledger is sealed by the archive: a bill with the sealing job in it changes with every run of it)
    _write(folder, "job-util", account("utilisation", 900.0, 905.0, threads=1, **mine))
    _write(folder, "job-arch", account("archive", 910.0, 912.0, threads=1))
    est = {"total_slot_s": 40.0, "gpu_hours": 40 / 3600, "unit": "CPU-worker-hours",
           "stage_slot_s": {"generate": 10.0, "score": 3.0, "warm-up": 2.0, "timing": 25.0},
           "arm_slot_s": {}, "calibration": {"key": "xxh3_128:00", "device": "cpu"}, "wall_s": 30.0}
    book = update(study, estimate=est, now=2000.0)
    assert book["jobs"]["job-util"]["status"] == "ok" and book["totals"]["jobs"] == 2 and "job-arch" not in book["jobs"]
    assert [sorted(r["jobs"]) for r in book["updates"]] == [["job-gen", "job-util"], ["job-util"]]
    assert update(study, now=3000.0)["totals"] == book["totals"]  # nothing new: nothing counted twice
    t = book["totals"]
    assert t["slot_s"] == pytest.approx(50.0 + 5.0)
    assert t["busy_share"] == pytest.approx(t["work_s"] / t["slot_s"])
    assert book["per_stage"]["generate"]["ledger_work_s"] == pytest.approx(8.0)  # control 6 + fewstep 2
    assert book["per_stage"]["generate"]["estimate_over_work"] == pytest.approx(10 / 8)
    on_disk = json.loads(Layout(study.scratch).ledger().read_text())
    assert on_disk == json.loads(json.dumps(book))
    text = markdown(book)
    assert f"busy {t['busy_share']:.1%}" in text and "| fewstep | generate |" in text
    assert "| generate | 10.0 | 8.0 | 1.25 |" in text and "archive" not in text


def test_the_same_jobs_give_the_same_totals_whatever_order_they_were_added_in(tmp_path, monkeypatch):
    """Regression (issue 40): totals summed in the order jobs were added differed in the last
    bits from the same ledger reread (JSON keys sorted), so the sealed ledger changed
    with a no-op update and a rerun after a killed archive sealed other evidence."""
    study = _study(tmp_path)
    folder = Layout(study.scratch).accounts
    monkeypatch.delenv("PAIRFLOW_ACCOUNTS", raising=False)
    for key, length in (("job-c", 0.1), ("job-b", 0.2), ("job-a", 0.3)):  # (0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3)
        _write(folder, key, account("plots", 0.0, length, threads=1))
        update(study, now=1000.0)
    path = Layout(study.scratch).ledger()
    before = path.read_bytes()
    update(study, now=2000.0)
    assert path.read_bytes() == before

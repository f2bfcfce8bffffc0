"""status: progress read from the files a study's jobs write, without locks or writes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import small_config, write_config

from pairflow.cli import main
from pairflow.layout import Layout
from pairflow.plan.candidates import (
    candidates,
    failure_path,
    panel_dir,
    record_path,
    score_path,
    timing_path,
)
from pairflow.plan.config import study_from_raw
from pairflow.report.status import study_status


def _ledger(study, *jobs: tuple[str, dict[str, str], float, float]) -> None:  # type: ignore[no-untyped-def]
    """A ledger (``budget.ledger``) holding one finished job per (rule, wildcards, start,
    CPU seconds): one core held for 40 s, its CPU seconds its work."""
    from pairflow.budget.ledger import FORMAT, job_entry, totals

    entries = {f"job-{i}": job_entry({"kind": "job-account", "job": rule, "rule": rule, "wildcards": wc,
                                      "attempt": 1, "pid": 1, "host": "n1", "start": start, "end": start + 40,
                                      "status": "ok", "threads": 1, "resources": {}, "slurm_job": None,
                                      "notes": {}, "cpu_s": {"self": cpu, "children": 0.0}}, None, 1.0, start + 50)
               for i, (rule, wc, start, cpu) in enumerate(jobs)}
    _touch(Layout(study.scratch).ledger(), time.time(), json.dumps(
        {"kind": "ledger", "format": FORMAT, "jobs": entries, "updates": [], "totals": totals(entries.values())}))


def _touch(path: Path, mtime: float, text: str = "{}") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


@pytest.fixture
def half_done(tmp_path: Path, tiny_model: Path):  # type: ignore[no-untyped-def]
    """A study of 4 candidates (2 prompts x 1 seed x 2 arms) caught mid-run: 3 generation
    records finished 10 s apart, one failure, a live worker heartbeat, a stale one, and
    the scoring stage's telemetry from an earlier job (per-stage jobs)."""
    cfg = small_config(tmp_path, tiny_model, fleet={"cpu_workers": 1, "retries": 1, "panel_jobs": "per-stage"})
    write_config(tmp_path, cfg)
    study = study_from_raw(cfg, tmp_path)
    cands = candidates(study, study.panels[0])
    now = time.time()
    for i, c in enumerate(cands[:3]):
        _touch(record_path(Layout(study.scratch), c), now - 30 + 10 * i)
    _touch(record_path(Layout(study.scratch), cands[3]).with_name(".tmp-abc.json"), now)  # an interrupted write never counts
    _touch(failure_path(Layout(study.scratch), cands[3], "generate"), now)
    _touch(score_path(Layout(study.scratch), cands[0]), now - 5000)
    beats = panel_dir(Layout(study.scratch), "t") / "run" / "generate" / "heartbeats"
    _touch(beats / "node1-11.json", now - 1)
    _touch(beats / "node1-12.json", now - 300)  # a worker of an earlier job
    # the scoring stage's jobs in the ledger: an earlier one, then the newest (whose share counts)
    _ledger(study, ("score_panel", {"panel": "t"}, now - 9000, 4.0), ("score_panel", {"panel": "t"}, now - 4000, 20.0),
            ("score_panel", {"panel": "other"}, now - 100, 40.0))
    return study, now


def test_counts_rate_time_left_failures_slots_and_busy_share(half_done) -> None:  # type: ignore[no-untyped-def]
    study, now = half_done
    gen, score, timing = study_status(study, now=now)
    assert (gen.stage, gen.done, gen.total, gen.failures, gen.active_slots) == ("generate", 3, 4, 1, 1)
    assert gen.rate_per_s == pytest.approx(2 / 20)  # 3 records over 20 s
    assert gen.left_s == pytest.approx(10.0)  # 1 left at 0.1/s
    assert gen.busy_share is None and not gen.finished
    assert (score.done, score.total, score.failures, score.active_slots) == (1, 4, 0, 0)
    assert score.rate_per_s is None and score.left_s is None  # idle: its only output is old
    assert score.busy_share == pytest.approx(0.5)  # the newest job of this panel: 20 CPU-s of 40 held
    assert (timing.stage, timing.done, timing.total) == ("timing", 0, 4)


def test_one_job_per_panel_reports_its_slots_and_busy_share_for_both_stages(tmp_path: Path,
                                                                         tiny_model: Path) -> None:
    """Under ``fleet.panel_jobs: combined`` both stages run in one job: its heartbeats and
    its telemetry record are what both rows report."""
    from pairflow.plan.candidates import COMBINED

    study = study_from_raw(small_config(tmp_path, tiny_model), tmp_path)
    now = time.time()
    _touch(panel_dir(Layout(study.scratch), "t") / "run" / COMBINED / "heartbeats" / "node1-11.json", now - 1)
    _ledger(study, ("generate_score_panel", {"panel": "t"}, now - 100, 36.0))
    gen, score, _ = study_status(study, now=now)
    assert (gen.active_slots, score.active_slots) == (1, 1)
    assert gen.busy_share == score.busy_share == pytest.approx(0.9)


def test_study_wide_job_reports_its_slots_and_busy_share_for_every_panel(tmp_path: Path,
                                                                         tiny_model: Path) -> None:
    """Under ``fleet.allocation: study`` one job runs every panel: its heartbeats and its
    telemetry record (``study/run/fleet``, ``study/telemetry/fleet.json``) are what every
    panel's generation and scoring rows report; the timed pass keeps its own."""
    from pairflow.layout import Layout

    cfg = small_config(tmp_path, tiny_model, fleet={"cpu_workers": 1, "retries": 1, "allocation": "study"})
    cfg["panels"]["u"] = cfg["panels"]["t"]
    study = study_from_raw(cfg, tmp_path)
    now = time.time()
    layout = Layout(study.scratch)
    _touch(layout.fleet_run_dir / "heartbeats" / "node1-11.json", now - 1)
    _touch(layout.fleet_run_dir / "heartbeats" / "node2-12.json", now - 2)
    _ledger(study, ("fleet_study", {}, now - 100, 30.0), ("timed_pass", {}, now - 50, 10.0))
    rows = study_status(study, now=now)
    assert {(r.panel, r.stage) for r in rows if r.stage != "timing" and r.active_slots == 2
            and r.busy_share == pytest.approx(0.75)} == {(p, s) for p in ("t", "u") for s in ("generate", "score")}
    assert {(r.active_slots, r.busy_share) for r in rows if r.stage == "timing"} == {(0, 0.25)}


def test_cli_prints_a_table_and_check_fails_on_failures(half_done, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    study, _ = half_done
    monkeypatch.chdir(study.root)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "generate" in out and "3/4" in out and "1/4" in out and "4/12 outputs (33%)" in out
    assert "1 failure record(s)" in out
    # the study's figure is the ledger's own line, word for word (ledger.md shows the same)
    from pairflow.budget.ledger import busy_line

    book = json.loads(Layout(study.scratch).ledger().read_text())
    assert f"ledger: {busy_line(book)}" in out and "busy 53.3% of 120.0 slot-s held over 3 job(s)" in out
    assert main(["status", "--check"]) == 1


def test_watch_stops_when_every_stage_is_done(half_done, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    study, now = half_done
    for c in candidates(study, study.panels[0]):
        for path in (record_path(Layout(study.scratch), c), score_path(Layout(study.scratch), c), timing_path(Layout(study.scratch), c)):
            if not path.exists():
                _touch(path, now)
    monkeypatch.chdir(study.root)
    assert main(["status", "--watch", "1"]) == 0  # returns at once: nothing left to wait for
    assert "12/12 outputs (100%)" in capsys.readouterr().out


def test_json_gives_every_stage_and_the_totals(half_done, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    study, _ = half_done
    monkeypatch.chdir(study.root)
    assert main(["status", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["study"], out["done"], out["total"], out["failures"], out["finished"]) == (study.study, 4, 12, 1, False)
    assert out["ledger"]["busy_share"] == pytest.approx(64 / 120) and out["ledger"]["jobs"] == 3
    gen = next(s for s in out["stages"] if s["stage"] == "generate")
    assert (gen["done"], gen["total"], gen["failures"], gen["active_slots"]) == (3, 4, 1, 1)
    assert gen["rate_per_s"] == pytest.approx(0.1) and gen["finished"] is False


def test_watch_redraws_in_place_on_a_terminal(half_done) -> None:  # type: ignore[no-untyped-def]
    """Regression (issue 26): --watch appended a new block every refresh (1,306 lines in 10
    minutes). On a terminal it now moves the cursor back over the last block; the pty's
    output holds several refreshes but only one block's worth of new lines."""
    import pty
    import select
    import signal
    import subprocess
    import sys

    study, _ = half_done
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pairflow.cli", "status", "--watch", "1"], cwd=study.root,
                            stdin=follower, stdout=follower, stderr=follower, start_new_session=True)
    os.close(follower)
    out = b""
    deadline = time.time() + 60
    try:
        while time.time() < deadline and out.count(b"done/total") < 3:
            if select.select([leader], [], [], 1)[0]:
                try:
                    out += os.read(leader, 65536)
                except OSError:
                    break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        os.close(leader)
    assert out.count(b"done/total") >= 3, out[-2000:]
    first = out.index(b"done/total")
    rest = out[first:]
    # every later block is drawn after a cursor-up (ANSI 'F'/'A'), not below the last one
    assert rest.count(b"\x1b[") >= 2 and (b"F" in rest or b"A" in rest)
    # no newline-only growth: the redraws carry cursor moves between the blocks
    blocks = rest.split(b"done/total")[1:]
    assert all(b"\x1b[" in b for b in blocks[:-1])


def test_without_rich_the_redraw_moves_the_cursor_back_over_the_last_block(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from pairflow.cli import _redrawer

    for name in ("rich", "rich.console", "rich.live", "rich.text"):
        monkeypatch.setitem(sys.modules, name, None)  # as when rich is not installed
    draw = _redrawer()
    draw("a\nb\nc")
    draw("d\ne\nf")
    out = capsys.readouterr().out
    assert out == "\x1b[Ja\nb\nc\n\x1b[3F\x1b[Jd\ne\nf\n"  # up 3 lines, clear, redraw


def test_a_running_timed_pass_counts_its_unwritten_runs_and_gives_its_rate(half_done) -> None:  # type: ignore[no-untyped-def]
    """The timed pass writes a block's records at its end; while it runs, its heartbeat
    (``stages.timing``) carries the runs not yet written and its rate: 7 runs at 3 per
    candidate are 2 candidates done (of 4), 2 left at 0.5 a second. A heartbeat that
    stopped moving (a pass that died) says nothing: the records alone count."""
    study, now = half_done
    beats = panel_dir(Layout(study.scratch), "t") / "run" / "timed-pass" / "heartbeats"
    live = {"what": "timed pass", "phase": "task", "timing": {"in_flight": 7, "repeats": 3, "rate_per_s": 0.5}}
    _touch(beats / "node1-21.json", now - 2, json.dumps(live))
    timing = study_status(study, now=now)[2]
    assert (timing.done, timing.total, timing.active_slots) == (2, 4, 1)
    assert timing.rate_per_s == 0.5 and timing.left_s == pytest.approx((4 - 7 / 3) / 0.5)
    _touch(beats / "node1-21.json", now - 300, json.dumps(live))  # the pass died 5 minutes ago
    timing = study_status(study, now=now)[2]
    assert (timing.done, timing.rate_per_s, timing.left_s, timing.active_slots) == (0, None, None, 0)

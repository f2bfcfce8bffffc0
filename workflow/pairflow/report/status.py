"""``pairflow status``: how far a study has got, read from the files its jobs write.

Read-only and lock-free, so it is safe beside running jobs on a cluster's shared file
system: it lists files and reads small JSON ones, never takes a panel lock and never
deep-verifies (that is ``pairflow verify``). Per panel and stage it reports:

* done/total: outputs present under their final names (an interrupted write's ``.tmp-*``
  never counts) against what the config implies;
* rate and time left: from the modification times of the outputs finished in the last
  ``RATE_WINDOW_S`` seconds (none recent: the stage is idle, no estimate). The timed pass
  writes a block's records together once its last repeat round ends, so while it runs
  its heartbeat (``stages.timing``) says more: done counts the timed runs not yet written
  (each ``timing.repeats`` runs one candidate), and the rate is the pass's own;
* failures: failure records left by tasks that failed after their retries;
* slots: workers whose heartbeat (rewritten as their task reports progress) moved in the
  last ``fleet.ACTIVE_S`` seconds (a job is running now), and the busy share of the
  stage's last job in the ledger (``study/ledger.json``: work over everything the job
  held, the figure the ledger and the report show), with the study's own line below.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget.ledger import FORMAT as LEDGER_FORMAT
from ..budget.ledger import busy_line
from ..fleet.pool import ACTIVE_S
from ..layout import Layout
from ..plan.candidates import (
    COMBINED,
    candidates,
    failure_path,
    job_stage,
    look_job,
    record_path,
    score_path,
    timing_path,
)
from ..plan.config import StudySpec

RATE_WINDOW_S = 600.0
"""Outputs finished within this many seconds of the newest one set the rate."""
STAGES = ("generate", "score", "timing")


@dataclass(frozen=True)
class StageStatus:
    """One panel's progress in one stage (times in seconds, rate in outputs per second)."""

    panel: str
    stage: str
    done: int
    total: int
    failures: int
    rate_per_s: float | None
    left_s: float | None
    active_slots: int
    busy_share: float | None

    @property
    def finished(self) -> bool:
        return self.done >= self.total


def _mtimes(paths: Iterable[Path]) -> list[float]:
    out = []
    for p in paths:
        try:
            out.append(p.stat().st_mtime)
        except OSError:  # not written yet, or being replaced right now
            continue
    return sorted(out)


def _rate(mtimes: list[float], now: float) -> float | None:
    """Outputs per second over the recent ones; None when fewer than two finished in the
    last ``RATE_WINDOW_S`` seconds (idle, or too early to say)."""
    recent = [t for t in mtimes if t >= now - RATE_WINDOW_S]
    if len(recent) < 2 or recent[-1] <= recent[0]:
        return None
    return (len(recent) - 1) / (recent[-1] - recent[0])


def _timing_live(beat_dir: Path, now: float) -> tuple[float, float | None] | None:
    """A running timed pass's word on the panel (candidates' worth of timed runs not yet
    written as records, the pass's rate in candidates per second), from its heartbeat
    files that moved in the last ``ACTIVE_S`` seconds; None when none did (no pass runs)."""
    runs, rate, live = 0.0, None, False
    for p in beat_dir.glob("*.json"):
        try:
            if p.name.startswith(".") or now - p.stat().st_mtime > ACTIVE_S:
                continue
            t = json.loads(p.read_text())["timing"]
            runs += t["in_flight"] / t["repeats"]
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):  # being replaced, or a pool's beat
            continue
        live, rate = True, t["rate_per_s"] if t["rate_per_s"] is not None else rate
    return (runs, rate) if live else None


def _active_slots(beat_dir: Path, now: float) -> int:
    return sum(1 for t in _mtimes(p for p in beat_dir.glob("*.json") if not p.name.startswith("."))
               if now - t <= ACTIVE_S)


def read_ledger(study: StudySpec) -> dict[str, Any] | None:
    """The study's ledger (``budget.ledger``), None before any run added to it."""
    try:
        book: dict[str, Any] = json.loads(Layout(study.scratch).ledger().read_text())
    except (OSError, ValueError):
        return None
    return book if "totals" in book and book.get("format") == LEDGER_FORMAT else None


def _busy_share(book: dict[str, Any] | None, rules: tuple[str, ...], panel: str | None) -> float | None:
    """The busy share of the newest job in the ledger of one of ``rules`` (for ``panel``)."""
    jobs = [j for j in (book or {}).get("jobs", {}).values() if j.get("rule") in rules
            and (panel is None or (j.get("wildcards") or {}).get("panel") == panel)]
    newest = max(jobs, key=lambda j: j["held"]["start"], default=None)
    return None if newest is None else newest.get("busy_share")


def _rules(study: StudySpec, stage: str) -> tuple[tuple[str, ...], bool]:
    """The rules that run ``stage`` of a panel, and whether their jobs are per panel."""
    if stage == "timing":
        return ("timed_pass",), False
    if study.fleet.allocation == "study":
        return ("fleet_study",), False
    if study.fleet.panel_jobs == "combined":
        return ("generate_score_panel", *(("look_panel",) if study.sequential else ())), True
    return (("generate_panel",) if stage == "generate" else ("score_panel",)), True


def study_status(study: StudySpec, now: float | None = None) -> list[StageStatus]:
    """Progress of every panel and stage of ``study``, in config order."""
    now = time.time() if now is None else now
    out = []
    book = read_ledger(study)
    for panel in study.panels:
        cands = candidates(study, panel)
        layout = Layout(study.scratch)
        outputs = {"generate": [record_path(layout, c) for c in cands],
                   "score": [score_path(layout, c) for c in cands],
                   "timing": [timing_path(layout, c) for c in cands]}
        for stage in STAGES:
            paths = outputs[stage]
            beat_dir = _beat_dir(study, panel.name, stage)
            rules, per_panel = _rules(study, stage)
            mtimes = _mtimes(paths)
            rate = _rate(mtimes, now)
            done = float(len(mtimes))
            live = _timing_live(beat_dir, now) if stage == "timing" else None
            if live is not None:
                done, rate = min(float(len(paths)), done + live[0]), live[1] or rate
            left = len(paths) - done
            failures = sum(1 for c in cands if failure_path(layout, c, stage).exists())
            out.append(StageStatus(
                panel=panel.name, stage=stage, done=int(done), total=len(paths), failures=failures,
                rate_per_s=rate, left_s=left / rate if rate and left else (0.0 if not left else None),
                active_slots=_active_slots(beat_dir, now),
                busy_share=_busy_share(book, rules, panel.name if per_panel else None)))
    return out


def _beat_dir(study: StudySpec, panel: str, stage: str) -> Path:
    """The heartbeat folder of the job that runs ``panel``'s ``stage``: under
    ``fleet.panel_jobs: combined`` both stages report their one job's slots; under
    ``fleet.allocation: study`` every panel reports the study-wide job's."""
    layout = Layout(study.scratch)
    if stage == "timing":
        return layout.timed_run_dir(panel) / "heartbeats"
    if study.fleet.allocation == "study":
        return layout.fleet_run_dir / "heartbeats"
    if study.sequential is not None:  # the look's job that ran last (each look has its own folder)
        dirs = [layout.run_dir(panel, job) / "heartbeats"
                for job in (COMBINED, *(look_job(k) for k in range(1, len(study.sequential.looks) + 1)))]
        return max((d for d in dirs if d.is_dir()), key=lambda d: d.stat().st_mtime, default=dirs[0])
    return layout.run_dir(panel, job_stage(study, stage)) / "heartbeats"


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render(rows: list[StageStatus], study: StudySpec) -> str:
    """A fixed-width table, one line per panel and stage, and a summary line."""
    head = f"{'panel':<16} {'stage':<9} {'done/total':>11} {'rate/min':>9} {'left':>8} {'failed':>6} " \
           f"{'slots':>5} {'busy':>6}"
    lines = [f"study {study.study} ({study.scratch})", head]
    for r in rows:
        lines.append(
            f"{r.panel:<16} {r.stage:<9} {f'{r.done}/{r.total}':>11} "
            f"{(f'{r.rate_per_s * 60:.1f}' if r.rate_per_s and not r.finished else '-'):>9} "
            f"{('done' if r.finished else _duration(r.left_s)):>8} "
            f"{r.failures:>6} {r.active_slots:>5} {(f'{r.busy_share:.0%}' if r.busy_share is not None else '-'):>6}")
    done, total = sum(r.done for r in rows), sum(r.total for r in rows)
    failed = sum(r.failures for r in rows)
    lines.append(f"{done}/{total} outputs ({done / total:.0%})" if total else "nothing to do")
    book = read_ledger(study)
    lines.append(f"ledger: {busy_line(book)} (study/ledger.json, as of the last run's end)" if book
                 else "ledger: none yet (written at the end of each run)")
    if failed:
        lines.append(f"{failed} failure record(s): see {study.scratch}/panels/<panel>/failures/; "
                     "a rerun retries them")
    return "\n".join(lines)


def as_dict(rows: list[StageStatus], study: StudySpec, now: float | None = None) -> dict[str, Any]:
    """``pairflow status --json``: the study, the time read (Unix seconds), one object per
    panel and stage (``StageStatus``'s fields plus ``finished``) and the totals."""
    done, total = sum(r.done for r in rows), sum(r.total for r in rows)
    return {"study": study.study, "scratch": str(study.scratch), "time": time.time() if now is None else now,
            "stages": [{**dataclasses.asdict(r), "finished": r.finished} for r in rows],
            "done": done, "total": total, "failures": sum(r.failures for r in rows),
            "finished": all(r.finished for r in rows), "ledger": _ledger_summary(read_ledger(study))}


def _ledger_summary(book: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ledger's study figures for ``--json``: the same numbers ``ledger.md`` shows."""
    if book is None:
        return None
    t = book["totals"]
    return {k: t[k] for k in ("busy_share", "slot_s", "work_s", "gpu_s", "cpu_s", "gpu_busy_share", "jobs", "status")}

"""The study's bill: every job it ran, what each held and for how long, and the work done
inside, kept across runs (``study/ledger.json``, ``ledger.md``).

Sources, all under ``Layout.accounts`` (module ``jobaccount``):

- every job's own account (``job-*.json``: rule, wildcards, attempt, start, end, status,
  cores reserved, CPU seconds, and the work the job noted about itself); prepare,
  calibrate, estimate, panel, fleet, timed pass, stats and report jobs, retried and failed
  attempts included; not the archive rule's, nor rule card's after it (``layout.SEALING_RULES``): the ledger is part
  of the evidence the archive seals, and a bill that counted the sealing job would change
  with every run of it (a rerun after a killed archive would seal other evidence);
- on Slurm, each submission's record (``slurm-*.json``, written by the pairflow-slurm
  executor: the scheduler's own start, end, CPUs and GPUs, ``fleet.sites.slurmacct``);
  an account whose record is missing is looked up in the scheduler when the ledger is
  updated; a submission that never started the job's Python is a job of its own.

Held: on Slurm the scheduler's figures, GPUs and CPUs granted times its elapsed time
(several rules in one Slurm job share its held time by their own lengths); locally the
cores Snakemake reserved (the rule's ``threads``) times the job's process lifetime. A
job's slot is a GPU where it held any, else a core: ``slot_s`` is GPU-seconds or
core-seconds. Work, in the same slots:

- a fan-out job: its task spans (``telemetry.honest_share``: task work, warm-up, failed
  and retried attempts per arm and stage; a CPU worker's seconds count its cores); what
  is left of the held time is start-up (before the slots' first task: the scheduler's
  start, the interpreter, Parsl) and idle;
- the timed pass: its timing window on the one device it times on (one GPU, or the
  cores its runs use, ``generation.threads``: it holds every core so that nothing else
  runs beside it, and those idle cores are its cost too), split over arms by their runs;
- calibrate: the seconds it measured in, on one GPU or its cores;
- any other job on CPU: its CPU seconds (process and reaped children); on a GPU it noted
  no work for: none (the GPU was held idle);
- a failed or killed job: all of its held time is ``failed``.

Busy share is work over held, per job, per stage and for the study; ``pairflow status``
and the report read it from here. Entries are keyed by account, so the ledger is added to,
never replaced: a job seen finished is not counted twice; one seen running is read again.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

from ..atomic import write_text
from ..fleet.sites import slurmacct
from ..layout import SEALING_RULES, Layout
from ..plan.config import StudySpec

log = logging.getLogger(__name__)

FORMAT = 2
KINDS = ("work", "warm-up", "start-up", "idle", "failed", "retried")
STUDY_ARM = "(study)"
"""The arm of a job that serves every arm (prepare, calibrate, stats, report, archive)."""
FANOUT = ("generate_score_panel", "generate_panel", "score_panel", "fleet_study", "replicate_panel", "look_panel")
STAGE_OF_RULE = {"build_tiny_model": "prepare", "check_arms": "prepare", "calibrate": "calibrate",
                 "estimate": "estimate", "generate_score_panel": "generate-score", "generate_panel": "generate",
                 "score_panel": "score", "fleet_study": "generate-score", "timed_pass": "timing",
                 "study_stats": "stats", "repeatability": "stats", "plots": "report", "gallery": "report",
                 "track": "report", "utilisation": "report", "archive": "archive", "replicate_panel": "replicate",
                 "look_panel": "generate-score", "look": "stats"}
Scheduler = Callable[[str], "dict[str, Any] | None"]


# --- what a job noted about its own work (stages call these, then jobaccount.note) --------


def spans_work(record: dict[str, Any], stage: str) -> dict[str, Any]:
    """A fan-out job's work from its telemetry record: span seconds per (arm, stage, kind)
    in slot-seconds of the record's slots, the record's honest figures and fleet health."""
    job = record.get("job") or {}
    start, end = float(job.get("start", record["window"]["start"])), float(job.get("end", record["window"]["end"]))
    rows: dict[str, float] = {}
    warm = 0.0
    for s in record["spans"]:
        if s.get("started") is None or s.get("finished") is None:
            continue  # a task lost with its worker: the pool's retry record carries its time
        took = max(0.0, min(float(s["finished"]), end) - max(float(s["started"]), start))
        if s.get("kind") == "warm-up":
            warm += took
            continue
        kind = "retried" if s.get("failure") == "retried" else "failed" if s.get("failure") else "work"
        key = "|".join((str(s.get("arm") or STUDY_ARM), str(s.get("stage") or stage), kind))
        rows[key] = rows.get(key, 0.0) + took
    return {"from": "task spans", "label": record.get("label"), "slots": int(job.get("slots") or 1),
            "rows": rows, "warm-up": warm, "honest": {k: job.get(k) for k in ("work_s", "warmup_s", "startup_s",
                                                                             "idle_s", "slot_s")},
            "health": health(record)}


def timed_work(record: dict[str, Any], cores: int = 1) -> dict[str, Any]:
    """The timed pass's work from its telemetry: its timing window, split over arms by runs,
    on one device (one GPU; on CPU the ``cores`` its runs use, ``generation.threads``)."""
    length = max(0.0, float(record["window"]["end"]) - float(record["window"]["start"]))
    runs = {a: float(v.get("runs", 0)) for a, v in (record.get("per_arm") or {}).items()}
    total = sum(runs.values())
    rows = ({f"{a}|timing|work": length * r / total for a, r in sorted(runs.items())} if total > 0
            else {f"{STUDY_ARM}|timing|work": length})
    return {"from": "timing window", "label": record.get("label"), "rows": rows, "cores": cores,
            "health": health(record)}


def measured_work(seconds: float, stage: str, cores: int = 1) -> dict[str, Any]:
    """Work a job measured itself (calibrate: the fresh worker's run) on one device (one
    GPU; on CPU the ``cores`` it used)."""
    return {"from": "measured run", "rows": {f"{STUDY_ARM}|{stage}|work": max(0.0, seconds)}, "cores": cores}


def health(record: dict[str, Any]) -> dict[str, Any]:
    """Fleet health of a job from its NVML summary: per GPU the share of samples active
    (>= ``telemetry.ACTIVE_PCT`` % utilisation), peak temperature; tensor-core activity where it was
    read, else ``unavailable``; ``no GPU sampled`` without NVML samples."""
    nvml = record.get("nvml") or {}
    gpus = {u: {"active_share": g.get("active_share"), "samples": g.get("samples"),
                "temperature_c_max": g.get("temperature_c_max"),
                "tensor_active": g.get("tensor_active", "unavailable")}
            for u, g in (nvml.get("summary") or {}).items()}
    return {"nvml": nvml.get("status", "not sampled"), "gpus": gpus} if gpus else {
        "nvml": nvml.get("status", "not sampled"), "gpus": {}, "note": "no GPU sampled"}


# --- held, work and rows of one job ----------------------------------------------------------


def _alive(account: dict[str, Any]) -> bool:
    """Whether the account's process still runs (on this host; elsewhere assume it does)."""
    if account.get("host") != socket.gethostname():
        return True
    try:
        started = float(psutil.Process(int(account["pid"])).create_time())
        return abs(started - float(account["start"])) < 1.0
    except (OSError, ValueError, KeyError, psutil.Error):
        return False


KILLED_STATES = ("CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE", "BOOT_FAIL")


def _status(account: dict[str, Any] | None, sched: dict[str, Any] | None) -> str:
    """ok, failed, killed, running or unknown: the scheduler's end state where it has one."""
    if sched is not None and sched.get("terminal") and sched.get("state") != "COMPLETED":
        return "killed" if sched.get("state") in KILLED_STATES else "failed"
    if account is None:
        return "ok" if sched and sched.get("state") == "COMPLETED" else "unknown"
    if account["status"] != "running":
        return str(account["status"])
    if sched is not None and sched.get("terminal"):
        return "killed"
    return "running" if _alive(account) else "killed"


def held(account: dict[str, Any] | None, sched: dict[str, Any] | None, share: float, now: float,
         mtime: float | None, status: str) -> dict[str, Any]:
    """What a job held: GPUs, CPUs and nodes, from when to when; GPU-, CPU- and slot-seconds
    (``share`` of the Slurm job's, for several rules run in one Slurm job). Without the
    scheduler's start, a ``killed`` job (``_status``) ended at its account's last touch
    (``mtime``); one still running, now."""
    if sched is not None and sched.get("start") is not None:
        start = float(sched["start"])
        end = float(sched["end"]) if sched.get("end") is not None and sched.get("terminal") else None
        elapsed = float(sched.get("elapsed_s") or 0.0) if end is not None else now - start
        gpus, cpus, nodes = int(sched.get("gpus") or 0), int(sched.get("cpus") or 0), int(sched.get("nodes") or 1)
        source = f"scheduler: {sched.get('source')} (Slurm job {sched.get('job_id')})"
    else:
        assert account is not None
        start = float(account["start"])
        end = account.get("end")
        if end is None and status == "killed":
            end = mtime
        elapsed = (float(end) if end is not None else now) - start
        res = account.get("resources") or {}
        gpus = int(res.get("gpu") or 0) if not account.get("slurm_job") else len(
            [g for g in str((account.get("slurm") or {}).get("SLURM_JOB_GPUS", "")).split(",") if g])
        cpus, nodes = int(account.get("threads") or 1), 1
        source = ("account: process lifetime x the rule's threads" if not account.get("slurm_job") else
                  f"account: no scheduler record of Slurm job {account['slurm_job']} was found")
    elapsed = max(0.0, elapsed) * share
    slots = gpus if gpus > 0 else max(cpus, 1)
    return {"gpus": gpus, "cpus": cpus, "nodes": nodes, "start": start, "end": end, "elapsed_s": elapsed,
            "gpu_s": gpus * elapsed, "cpu_s": cpus * elapsed, "slot": "gpu" if gpus > 0 else "core",
            "slots": slots, "slot_s": slots * elapsed, "from": source,
            **({"share_of_slurm_job": share} if share < 1.0 else {})}


def rows_of(account: dict[str, Any] | None, h: dict[str, Any], status: str) -> tuple[dict[str, float], str]:
    """A job's held slot-seconds by ``arm|stage|kind``, summing to its ``slot_s``, and where
    its work figure comes from."""
    rule = (account or {}).get("rule", "")
    stage = STAGE_OF_RULE.get(rule, rule or "unknown")
    total = h["slot_s"]
    if status in ("failed", "killed", "unknown") or account is None:
        return {f"{STUDY_ARM}|{stage}|failed": total}, f"none: the job {status}"
    work = (account.get("notes") or {}).get("work")
    rows: dict[str, float] = {}
    if work and work.get("from") == "task spans":
        # a span is one slot's second; a CPU worker holds the job's cores over its slots
        f = 1.0 if h["gpus"] > 0 else h["cpus"] / max(int(work.get("slots") or 1), 1)
        for k, v in work["rows"].items():
            rows[k] = rows.get(k, 0.0) + v * f
        own = sum(rows.values())
        arms: dict[tuple[str, str], float] = {}
        for k, v in rows.items():
            a, st, _ = k.split("|")
            arms[(a, st)] = arms.get((a, st), 0.0) + v
        honest = work.get("honest") or {}
        warm = float(work.get("warm-up") or 0.0) * f
        rest = max(0.0, total - own - warm)
        idle = min(rest, float(honest.get("idle_s") or 0.0) * f)
        shared = {"warm-up": warm, "start-up": rest - idle, "idle": idle}
        weight = sum(arms.values())
        for kind, v in shared.items():  # shared time split over (arm, stage) by their own seconds
            for (a, st), w in (arms.items() if weight > 0 else [((STUDY_ARM, stage), 1.0)]):
                key = f"{a}|{st}|{kind}"
                rows[key] = rows.get(key, 0.0) + v * (w / weight if weight > 0 else 1.0)
        return rows, str(work["from"])
    if work:  # timed pass, calibrate: work on one device (a GPU, or the cores its runs used)
        for k, v in work["rows"].items():
            rows[k] = v * (1 if h["gpus"] > 0 else min(int(work.get("cores") or 1), h["cpus"]))
        source = str(work["from"])
    elif h["gpus"] == 0:
        cpu = account.get("cpu_s") or {}
        rows[f"{STUDY_ARM}|{stage}|work"] = min(total, float(cpu.get("self", 0.0)) + float(cpu.get("children", 0.0)))
        source = "process CPU time"
    else:
        source = "none noted: the GPU was held without work"
    scale = min(1.0, total / sum(rows.values())) if sum(rows.values()) > 0 else 1.0
    rows = {k: v * scale for k, v in rows.items()}
    rows[f"{STUDY_ARM}|{stage}|idle"] = max(0.0, total - sum(rows.values()))
    return rows, source


def job_entry(account: dict[str, Any] | None, sched: dict[str, Any] | None, share: float, now: float,
              mtime: float | None = None, submission: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ledger entry: the job, its status, what it held, its work and busy share."""
    status = _status(account, sched)
    h = held(account, sched, share, now, mtime, status)
    rows, source = rows_of(account, h, status)
    work_s = sum(v for k, v in rows.items() if k.endswith("|work"))
    a = account or {}
    sub = submission or {}
    rule = a.get("rule") or sub.get("rule") or "unknown"
    work_note = (a.get("notes") or {}).get("work") or {}
    return {"job": a.get("job") or "-".join([rule, *(f"{k}={v}" for k, v in (sub.get("wildcards") or {}).items())]),
            "rule": rule, "stage": STAGE_OF_RULE.get(rule, rule), "wildcards": a.get("wildcards", sub.get("wildcards")),
            "attempt": a.get("attempt", sub.get("attempt")), "status": status, "host": a.get("host"),
            "slurm_job": a.get("slurm_job") or sub.get("slurm_job"), "held": h,
            "work": {"slot_s": work_s, "from": source}, "busy_share": work_s / h["slot_s"] if h["slot_s"] else None,
            "rows": [{"arm": k.split("|")[0], "stage": k.split("|")[1], "kind": k.split("|")[2], "slot_s": v}
                     for k, v in sorted(rows.items())],
            "slot_s": h["slot_s"], "health": work_note.get("health"),
            **({"error": a["error"]} if a.get("error") else {}),
            **({"scheduler": sched} if sched else {})}


# --- the ledger ------------------------------------------------------------------------------


def _read(path: Path) -> dict[str, Any] | None:
    try:
        out: dict[str, Any] = json.loads(path.read_text())
        return out
    except (OSError, ValueError):
        return None


def entries(folder: Path, now: float, done: Iterable[str] = (),
            scheduler: Scheduler | None = None) -> dict[str, dict[str, Any]]:
    """Ledger entries (key → entry) for every account and Slurm submission under ``folder``
    but the keys in ``done`` (finished entries already in the ledger) and the archive
    rule's accounts (module docstring)."""
    done = set(done)
    look_up = scheduler or slurmacct.scheduler_job
    accounts: dict[str, tuple[dict[str, Any], float]] = {}
    subs: dict[str, dict[str, Any]] = {}
    for p in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        if p.name.startswith(".tmp-"):
            continue
        rec = _read(p)
        if rec is None:
            continue
        if rec.get("kind") == "job-account":
            if rec.get("rule") in SEALING_RULES:
                continue
            with_mtime = (rec, p.stat().st_mtime)
            accounts[p.stem] = with_mtime
        elif rec.get("kind") == "slurm-job" and rec.get("slurm_job"):
            subs[str(rec["slurm_job"])] = rec
    per_job: dict[str, list[str]] = {}
    for key, (rec, _) in accounts.items():
        if rec.get("slurm_job"):
            per_job.setdefault(str(rec["slurm_job"]), []).append(key)
    out: dict[str, dict[str, Any]] = {}
    scheds: dict[str, dict[str, Any] | None] = {}

    def sched_of(job_id: str) -> dict[str, Any] | None:
        if job_id not in scheds:
            s = (subs.get(job_id) or {}).get("scheduler")
            if s is None or not s.get("terminal"):
                s = look_up(job_id) or s
            scheds[job_id] = s
        return scheds[job_id]

    for key, (rec, mtime) in accounts.items():
        if key in done:
            continue
        jid = str(rec["slurm_job"]) if rec.get("slurm_job") else None
        share = 1.0
        if jid is not None and len(per_job[jid]) > 1:  # rules grouped in one Slurm job share its time
            lengths = {k: max(1e-9, float(accounts[k][0].get("end") or now) - float(accounts[k][0]["start"]))
                       for k in per_job[jid]}
            share = lengths[key] / sum(lengths.values())
        out[key] = job_entry(rec, sched_of(jid) if jid else None, share, now, mtime, subs.get(jid or ""))
    for jid, sub in subs.items():  # a submission whose job never started its Python: its own entry
        key = f"slurm-{jid}"
        if jid in per_job or key in done:
            continue
        out[key] = job_entry(None, sched_of(jid), 1.0, now, None, sub)
    return out


def update(study: StudySpec, path: Path | None = None, estimate: dict[str, Any] | None = None,
           now: float | None = None, scheduler: Scheduler | None = None) -> dict[str, Any]:
    """Add every job under ``Layout.accounts`` not yet in the ledger at ``path`` (default
    ``Layout.ledger()``), re-read those it saw running, recompute the totals, keep the
    newest ``estimate`` beside them. Written atomically. Returns the ledger."""
    lay = Layout(study.scratch)
    path = Path(path) if path is not None else lay.ledger()
    now = time.time() if now is None else now
    ledger: dict[str, Any] | None = _read(path) if path.is_file() else None
    if ledger is None or ledger.get("format") != FORMAT:
        if ledger is not None:  # an earlier format's ledger (telemetry-only): kept beside, never mixed in
            os.replace(path, path.with_name(f"{path.stem}.format{ledger.get('format', 1)}{path.suffix}"))
        ledger = {"kind": "ledger", "format": FORMAT, "study": study.study, "jobs": {}, "updates": []}
    finished = [k for k, j in ledger["jobs"].items() if j["status"] != "running"]
    fresh = entries(Path(os.environ.get("PAIRFLOW_ACCOUNTS") or lay.accounts), now, finished, scheduler)
    changed = [k for k, e in fresh.items() if ledger["jobs"].get(k) != e]
    ledger["jobs"].update(fresh)
    if changed or not ledger["updates"]:
        ledger["updates"].append({"at": now, "jobs": changed, "slot_s": sum(fresh[k]["slot_s"] for k in changed)})
    if estimate is not None:
        ledger["estimate"] = {k: estimate[k] for k in ("total_slot_s", "gpu_hours", "unit", "stage_slot_s",
                                                       "arm_slot_s", "calibration", "wall_s") if k in estimate}
    # In the keys' order, whatever order the jobs were added in: float sums depend on their
    # order, and the same jobs must give the same bytes (the archive seals this file).
    ledger["totals"] = totals(ledger["jobs"][k] for k in sorted(ledger["jobs"]))
    ledger["per_stage"] = per_stage(ledger["totals"], ledger.get("estimate"))
    write_text(path, json.dumps(ledger, indent=1, sort_keys=True) + "\n")
    return ledger


def totals(jobs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Over ``jobs``: held slot-, GPU- and CPU-seconds, work and the busy share; slot-seconds
    per kind, per arm → stage → kind, and held and work per stage; jobs per status."""
    by_kind = dict.fromkeys(KINDS, 0.0)
    by: dict[str, dict[str, dict[str, float]]] = {}
    stages: dict[str, dict[str, float]] = {}
    out = {"slot_s": 0.0, "gpu_s": 0.0, "cpu_s": 0.0, "work_s": 0.0, "gpu_work_s": 0.0, "jobs": 0}
    status: dict[str, int] = {}
    for j in jobs:
        out["jobs"] += 1
        status[j["status"]] = status.get(j["status"], 0) + 1
        out["slot_s"] += j["held"]["slot_s"]
        out["gpu_s"] += j["held"]["gpu_s"]
        out["cpu_s"] += j["held"]["cpu_s"]
        out["work_s"] += j["work"]["slot_s"]
        if j["held"]["gpus"] > 0:
            out["gpu_work_s"] += j["work"]["slot_s"]
        for r in j["rows"]:
            by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["slot_s"]
            cell = by.setdefault(r["arm"], {}).setdefault(r["stage"], {})
            cell[r["kind"]] = cell.get(r["kind"], 0.0) + r["slot_s"]
            st = stages.setdefault(r["stage"], {"held_s": 0.0, "work_s": 0.0})
            st["held_s"] += r["slot_s"]
            st["work_s"] += r["slot_s"] if r["kind"] == "work" else 0.0
    return {**out, "hours": out["slot_s"] / 3600.0,
            "busy_share": out["work_s"] / out["slot_s"] if out["slot_s"] else None,
            "gpu_busy_share": out["gpu_work_s"] / out["gpu_s"] if out["gpu_s"] else None,
            "status": status, "by_kind": by_kind, "by_arm": by, "by_stage": stages}


def per_stage(t: dict[str, Any], est: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Estimate against ledger per estimated stage: the estimate's slot-seconds beside the
    ledger's work and everything held for that stage (warm-up: the ledger's warm-up and
    start-up kinds, where a slot's imports and loads land)."""
    if not est:
        return {}
    out = {}
    for stage, e in (est.get("stage_slot_s") or {}).items():
        if stage == "warm-up":  # the estimate's imports and loads per slot: in the ledger, warm-up tasks
            # and start-up (a fork server's imports, a slot's wait for its first task) both hold them
            work = held_s = t["by_kind"].get("warm-up", 0.0) + t["by_kind"].get("start-up", 0.0)
        else:
            got = t["by_stage"].get(stage) or {}
            work, held_s = got.get("work_s", 0.0), got.get("held_s", 0.0)
        out[stage] = {"estimate_s": e, "ledger_work_s": work, "ledger_held_s": held_s,
                      "estimate_over_work": e / work if work else None,
                      "estimate_over_held": e / held_s if held_s else None}
    return out


def busy_line(ledger: dict[str, Any]) -> str:
    """The study's busy share as one line: the figure status, the report and the ledger show."""
    t = ledger["totals"]
    share = t.get("busy_share")
    return (f"busy {share:.1%} of {t['slot_s']:.1f} slot-s held over {t['jobs']} job(s)"
            + (f" (GPU: {t['gpu_busy_share']:.1%} of {t['gpu_s']:.1f} GPU-s)" if t.get("gpu_busy_share") is not None
               else "")) if share is not None else "no job accounted yet"


def _ratio(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def markdown(ledger: dict[str, Any]) -> str:
    """The ledger's report section: the study's busy share, every job with what it held and
    its work, totals per kind, per arm and stage, and estimate against ledger per stage."""
    t = ledger["totals"]
    lines = ["# Ledger: every job, what it held, the work inside", "",
             f"**{busy_line(ledger)}**: work over held time. A slot is a GPU where a job held any, else a "
             "core; held time is the scheduler's (Slurm) or the job's process lifetime times the cores it "
             "reserved (locally). Work: task spans (fan-out jobs), the timing window (timed pass) or the "
             "measured run (calibrate) on one GPU or the cores its runs used; CPU time for the other jobs on CPU. "
             f"{t['gpu_s']:.1f} GPU-s and {t['cpu_s']:.1f} CPU-s held in all; jobs by status: "
             + ", ".join(f"{k} {v}" for k, v in sorted(t["status"].items())) + ".", ""]
    lines += ["| job | attempt | status | slurm | held | GPUs | CPUs | elapsed s | slot-s | work slot-s | busy "
              "| work from |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, j in sorted(ledger["jobs"].items(), key=lambda kv: (kv[1]["held"]["start"], kv[0])):
        h = j["held"]
        share = j.get("busy_share")
        lines.append(f"| {j['job']} | {j.get('attempt') or ''} | {j['status']} | {j.get('slurm_job') or ''} "
                     f"| {h['from']} | {h['gpus']} | {h['cpus']} | {h['elapsed_s']:.1f} | {h['slot_s']:.1f} "
                     f"| {j['work']['slot_s']:.1f} | {'' if share is None else f'{share:.1%}'} | {j['work']['from']} |")
    est = ledger.get("estimate")
    if est:
        ratio = est["total_slot_s"] / t["slot_s"] if t["slot_s"] else None
        lines += ["", f"Estimate (calibration {est['calibration']['key']}, {est['calibration'].get('device', '')}): "
                  f"{est['total_slot_s']:.1f} slot-s ({est['gpu_hours']:.4f} {est['unit']})"
                  + (f"; estimate / ledger = {ratio:.2f} over everything held (the estimate leaves out start-up, "
                     "idle and the jobs around the fan-out)" if ratio else ""), "",
                  "| stage | estimate slot-s | ledger work slot-s | estimate / work | ledger held slot-s "
                  "| estimate / held |", "|---|---|---|---|---|---|"]
        for stage, s in (ledger.get("per_stage") or {}).items():
            stage = "warm-up (ledger: warm-up + start-up)" if stage == "warm-up" else stage
            over_work, over_held = (_ratio(s["estimate_over_work"]), _ratio(s["estimate_over_held"]))
            lines.append(f"| {stage} | {s['estimate_s']:.1f} | {s['ledger_work_s']:.1f} | {over_work} "
                         f"| {s['ledger_held_s']:.1f} | {over_held} |")
    lines += ["", "| kind | slot-s | share |", "|---|---|---|"]
    lines += [f"| {k} | {v:.1f} | {v / t['slot_s']:.1%} |" for k, v in t["by_kind"].items() if t["slot_s"]]
    lines += ["", "| arm | stage | " + " | ".join(KINDS) + " | total |", "|---|---|" + "---|" * (len(KINDS) + 1)]
    for arm, stages in sorted(t["by_arm"].items()):
        for stage, kinds in sorted(stages.items()):
            lines.append(f"| {arm} | {stage} | " + " | ".join(f"{kinds.get(k, 0.0):.1f}" for k in KINDS)
                         + f" | {sum(kinds.values()):.1f} |")
    lines += ["", "## Updates", "", "Rule utilisation adds the jobs before it; the end of every run, failed or not, "
              "adds the rest.", "", "| update | at (UTC) | jobs added or re-read | slot-s |", "|---|---|---|---|"]
    for i, r in enumerate(ledger["updates"], 1):
        lines.append(f"| {i} | {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r['at']))} | {len(r['jobs'])} "
                     f"| {r['slot_s']:.1f} |")
    lines += ["", "## Fleet health", "", "| job | NVML | GPU | active share | peak C | tensor cores |",
              "|---|---|---|---|---|---|"]
    for _, j in sorted(ledger["jobs"].items()):
        h = j.get("health")
        if not h:
            continue
        if not h.get("gpus"):
            lines.append(f"| {j['job']} | {h.get('nvml', '')} | none sampled | | | unavailable |")
        for u, g in (h.get("gpus") or {}).items():
            share = g.get("active_share")
            lines.append(f"| {j['job']} | {h['nvml']} | {u} | {'' if share is None else f'{share:.1%}'} "
                         f"| {g.get('temperature_c_max', '')} | {g.get('tensor_active')} |")
    return "\n".join(lines) + "\n"

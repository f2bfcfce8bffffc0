"""Where the slot-seconds went: every job's slot time attributed to an arm and stage as
work, warm-up, start-up, idle, failed or retried, kept across runs.

Read from the jobs' telemetry records (``telemetry.write_telemetry``: spans per task with
their stage and arm, failed and retried attempts included; the job's window and slots)
and the timed pass's. Per fan-out job:

- ``work``, ``failed`` (the final attempt of a task that failed after its retries),
  ``retried`` (attempts Parsl retried) and ``warm-up`` come from spans; a task span is
  its own arm's and stage's; a warm-up span is the job's (shared);
- ``start-up`` (job start to each slot's first span) and ``idle`` (the rest of the slot
  time) are the job's, from its ``honest_share`` figures;
- shared seconds (warm-up, start-up, idle) are split over the (arm, stage) pairs in
  proportion to their own seconds (work + failed + retried) in that job, so every
  slot-second lands on an arm; ``shared`` in the job keeps the unsplit figures.

The timed pass (exclusive, one slot) is ``timing`` work, split over arms by their timed
runs. Each job is keyed by its label and start, so the ledger is added to, never
replaced: a rerun's jobs are new entries, a job seen before is not counted twice, and a
failed job's seconds stay after its rerun overwrites its telemetry (the workflow adds
to the ledger after every run, failed runs included: ``onerror`` in common.smk).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..layout import Layout
from ..plan.candidates import job_stage, telemetry_path
from ..plan.config import StudySpec

KINDS = ("work", "warm-up", "start-up", "idle", "failed", "retried")
SHARED = ("warm-up", "start-up", "idle")


def job_key(record: dict[str, Any]) -> str:
    """A job's identity in the ledger: its label and start (epoch seconds, ms)."""
    start = (record.get("job") or {}).get("start", record["window"]["start"])
    return f"{record['label']}@{float(start):.3f}"


def _clip(s: dict[str, Any], start: float, end: float) -> float:
    return max(0.0, min(float(s["finished"]), end) - max(float(s["started"]), start))


def fanout_job(record: dict[str, Any], stage: str) -> dict[str, Any]:
    """One fan-out job's slot-seconds by (arm, stage, kind) (module docstring). ``stage``:
    the job's stage, for spans that carry none."""
    job = record.get("job") or {}
    start, end = float(job.get("start", record["window"]["start"])), float(job.get("end", record["window"]["end"]))
    own: dict[tuple[str, str, str], float] = {}
    shared = dict.fromkeys(SHARED, 0.0)
    for s in record["spans"]:
        if s.get("started") is None or s.get("finished") is None:
            continue  # a task lost with its worker: its time is the slot's idle time
        took = _clip(s, start, end)
        if s.get("kind") == "warm-up":
            shared["warm-up"] += took
            continue
        kind = "retried" if s.get("failure") == "retried" else "failed" if s.get("failure") else "work"
        k = (str(s.get("arm") or "unattributed"), str(s.get("stage") or stage), kind)
        own[k] = own.get(k, 0.0) + took
    shared["start-up"] = float(job.get("startup_s", 0.0))
    shared["idle"] = float(job.get("idle_s", 0.0))
    weights: dict[tuple[str, str], float] = {}
    for (arm, st, _), v in own.items():
        weights[(arm, st)] = weights.get((arm, st), 0.0) + v
    total = sum(weights.values())
    rows = dict(own)
    for kind, v in shared.items():
        for (arm, st), w in (weights.items() if total > 0 else [(("unattributed", stage), 1.0)]):
            rows[(arm, st, kind)] = rows.get((arm, st, kind), 0.0) + v * (w / total if total > 0 else 1.0)
    slot_s = float(job.get("slot_s", sum(rows.values())))
    return {"label": record["label"], "start": start, "end": end, "slots": job.get("slots"), "slot_s": slot_s,
            "rows": [{"arm": a, "stage": st, "kind": k, "slot_s": v} for (a, st, k), v in sorted(rows.items())],
            "shared": shared, "health": health(record)}


def timed_pass_job(record: dict[str, Any]) -> dict[str, Any]:
    """The exclusive timed pass: its window on one slot, ``timing`` work split over arms by
    their timed runs."""
    start, end = float(record["window"]["start"]), float(record["window"]["end"])
    runs = {a: float(v.get("runs", 0)) for a, v in (record.get("per_arm") or {}).items()}
    total = sum(runs.values())
    length = max(0.0, end - start)
    rows = ([{"arm": a, "stage": "timing", "kind": "work", "slot_s": length * r / total}
             for a, r in sorted(runs.items())] if total > 0
            else [{"arm": "unattributed", "stage": "timing", "kind": "work", "slot_s": length}])
    return {"label": record["label"], "start": start, "end": end, "slots": 1, "slot_s": length, "rows": rows,
            "shared": {}, "health": health(record)}


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


def study_records(study: StudySpec) -> dict[str, tuple[dict[str, Any], str]]:
    """The telemetry records present now: name → (record, the job's stage)."""
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for p in study.panels:
        for stage in dict.fromkeys(job_stage(study, s) for s in ("generate", "score")):
            path = telemetry_path(Layout(study.scratch), p.name, stage)
            if path.is_file():
                out[f"{stage}:{p.name}"] = (json.loads(path.read_text()), stage)
    timed = Layout(study.scratch).timed_pass_telemetry
    if timed.is_file():
        out["timing"] = (json.loads(timed.read_text()), "timing")
    return out


def update(study: StudySpec, path: Path | None = None, estimate: dict[str, Any] | None = None,
           now: float | None = None) -> dict[str, Any]:
    """Add every job whose telemetry is present and not yet in the ledger at ``path``
    (default ``Layout.ledger()``) as one new run; recompute the totals; keep the newest
    ``estimate`` beside them. Written atomically. Returns the ledger."""
    path = Path(path) if path is not None else Layout(study.scratch).ledger()
    ledger: dict[str, Any] = (json.loads(path.read_text()) if path.is_file()
                              else {"kind": "ledger", "study": study.study, "jobs": {}, "runs": []})
    added = []
    for name, (record, stage) in sorted(study_records(study).items()):
        key = job_key(record)
        if key in ledger["jobs"]:
            continue
        job = timed_pass_job(record) if stage == "timing" else fanout_job(record, stage)
        ledger["jobs"][key] = {**job, "job": name}
        added.append(key)
    if added or not ledger["runs"]:
        ledger["runs"].append({"at": now if now is not None else time.time(), "jobs": added,
                               "slot_s": sum(ledger["jobs"][k]["slot_s"] for k in added)})
    if estimate is not None:
        ledger["estimate"] = {k: estimate[k] for k in ("total_slot_s", "gpu_hours", "unit", "stage_slot_s",
                                                       "arm_slot_s", "calibration", "wall_s") if k in estimate}
    ledger["totals"] = totals(ledger["jobs"].values())
    write_text(path, json.dumps(ledger, indent=1, sort_keys=True) + "\n")
    return ledger


def totals(jobs: Any) -> dict[str, Any]:
    """Slot-seconds over ``jobs``: in all, per kind, and per arm → stage → kind."""
    by_kind = dict.fromkeys(KINDS, 0.0)
    by: dict[str, dict[str, dict[str, float]]] = {}
    slot_s = 0.0
    for j in jobs:
        slot_s += float(j["slot_s"])
        for r in j["rows"]:
            by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["slot_s"]
            cell = by.setdefault(r["arm"], {}).setdefault(r["stage"], {})
            cell[r["kind"]] = cell.get(r["kind"], 0.0) + r["slot_s"]
    return {"slot_s": slot_s, "hours": slot_s / 3600.0, "by_kind": by_kind, "by_arm": by}


def markdown(ledger: dict[str, Any]) -> str:
    """The ledger's report section: totals per kind, per arm and stage, beside the estimate."""
    t = ledger["totals"]
    lines = ["# Ledger: where the slot-seconds went", "",
             f"{len(ledger['jobs'])} job(s) over {len(ledger['runs'])} run(s): **{t['slot_s']:.1f} slot-seconds** "
             f"({t['hours']:.4f} slot-hours; a slot is a GPU, or a CPU worker without one). Failed and retried "
             "attempts are kept; warm-up, start-up and idle time is split over arms by their own seconds.", ""]
    est = ledger.get("estimate")
    if est:
        ratio = est["total_slot_s"] / t["slot_s"] if t["slot_s"] else None
        lines += [f"Estimate (calibration {est['calibration']['key']}): {est['total_slot_s']:.1f} slot-seconds "
                  f"({est['gpu_hours']:.4f} {est['unit']})" + (f"; estimate / ledger = {ratio:.2f}" if ratio else ""),
                  ""]
    lines += ["| kind | slot-s | share |", "|---|---|---|"]
    lines += [f"| {k} | {v:.1f} | {v / t['slot_s']:.1%} |" for k, v in t["by_kind"].items() if t["slot_s"]]
    lines += ["", "| arm | stage | " + " | ".join(KINDS) + " | total |", "|---|---|" + "---|" * (len(KINDS) + 1)]
    for arm, stages in sorted(t["by_arm"].items()):
        for stage, kinds in sorted(stages.items()):
            lines.append(f"| {arm} | {stage} | " + " | ".join(f"{kinds.get(k, 0.0):.1f}" for k in KINDS)
                         + f" | {sum(kinds.values()):.1f} |")
    lines += ["", "## Runs", "", "| run | at (UTC) | jobs added | slot-s |", "|---|---|---|---|"]
    for i, r in enumerate(ledger["runs"], 1):
        lines.append(f"| {i} | {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r['at']))} | {len(r['jobs'])} "
                     f"| {r['slot_s']:.1f} |")
    lines += ["", "## Fleet health", "", "| job | NVML | GPU | active share | peak C | tensor cores |",
              "|---|---|---|---|---|---|"]
    for key, j in sorted(ledger["jobs"].items()):
        h = j.get("health") or {}
        if not h.get("gpus"):
            lines.append(f"| {key} | {h.get('nvml', '')} | none sampled | | | unavailable |")
        for u, g in (h.get("gpus") or {}).items():
            share = g.get("active_share")
            lines.append(f"| {key} | {h['nvml']} | {u} | {'' if share is None else f'{share:.1%}'} "
                         f"| {g.get('temperature_c_max', '')} | {g.get('tensor_active')} |")
    return "\n".join(lines) + "\n"

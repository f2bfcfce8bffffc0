"""The ``e2e`` section of ``benchmarks/run.py``. The default study's time by stage, read from a
finished run's records and benchmarks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .common import (
    ROOT,
)

PANEL_RULES = {"generate_score_panel": "generate-score", "generate_panel": "generate", "score_panel": "score"}
"""The rules whose jobs generate and score panels (one job per panel, or one per stage),
and the name of each one's telemetry record."""


def bench_e2e(runs: int, quick: bool = False, scratch: Path | None = None) -> dict[str, Any]:
    """Where the default study's time goes, from its records, telemetry and Snakemake's
    per-job benchmark files (``scratch``, default results/scratch of the last run):
    per-video work (generation, encoding, scoring) against the jobs' wall time (the work
    share), and per worker the one-time costs split into import, model load and warm-up."""
    scratch = scratch or ROOT / "results" / "scratch"
    recs = [json.loads(p.read_text()) for p in scratch.glob("panels/*/records/*/*.json")]
    scores = [json.loads(p.read_text()) for p in scratch.glob("panels/*/scores/*/*.json")]
    if not recs:
        return {"skipped": f"no study run under {scratch}: run snakemake --profile profiles/local first"}
    jobs: dict[str, float] = {}
    panel_slot_s = 0.0  # the panel jobs' wall time x the slots each ran (its telemetry's slots)
    for tsv in (scratch / "benchmarks").rglob("*.tsv"):
        rows = tsv.read_text().splitlines()
        rule = tsv.parent.name
        jobs[rule] = jobs.get(rule, 0.0) + float(rows[1].split("\t")[0])
        tel = scratch / "panels" / tsv.stem / "telemetry" / f"{PANEL_RULES.get(rule)}.json"
        if tel.exists():
            panel_slot_s += float(rows[1].split("\t")[0]) * len(json.loads(tel.read_text())["slots"])
    # One-time costs per worker process: its warm-up task's figures, else what its tasks
    # paid importing and loading (a worker of a combined panel job serves both kinds once).
    workers: dict[tuple[str, int], dict[str, float]] = {}
    for rs in (recs, scores):
        for r in rs:
            w = workers.setdefault((r["worker"]["host"], r["worker"]["pid"]), {"import_s": 0.0, "load_s": 0.0})
            warm = r["worker"].get("warm_up") or {}
            t = r["timing"]
            w["import_s"] = max(w["import_s"], warm.get("import_s", 0.0), t.get("import_s", 0.0))
            w["load_s"] = max(w["load_s"], warm.get("load_s", 0.0), t.get("load_s", 0.0))
    warm_spans = []
    for tel in scratch.glob("panels/*/telemetry/*.json"):
        warm_spans += [s for s in json.loads(tel.read_text()).get("spans", []) if s.get("kind") == "warm-up"]
    mbps = json.loads((ROOT / "benchmarks" / "results.json").read_text()).get("hash", {}).get("digest_file_MBps",
                                                                                            5000.0) \
        if (ROOT / "benchmarks" / "results.json").exists() else 5000.0
    video_bytes = sum(r["video"]["bytes"] for r in recs)
    raw_bytes = sum(r["video"]["frames"] * r["video"]["height"] * r["video"]["width"] * 3 for r in recs)
    rec_bytes = sum(p.stat().st_size for p in scratch.rglob("*.json"))
    # Hashing share: every video is hashed when written, when its candidate is checked for
    # completeness, before scoring and at archive verification (4 passes, bounded above);
    # raw frames once; records a few times. Time from digest_file's measured throughput.
    hash_s = (4 * video_bytes + raw_bytes + 4 * rec_bytes) / (mbps * 1e6)
    gen_s = sum(r["timing"]["generate_s"] for r in recs)
    enc_s = sum(r["timing"]["encode_s"] for r in recs)
    score_s = sum(s["timing"]["score_s"] for s in scores)
    total = sum(jobs.values())
    panel_jobs = sum(v for k, v in jobs.items() if k in PANEL_RULES)
    util = scratch / "study" / "utilisation.json"
    busy = json.loads(util.read_text()).get("busy_share") if util.exists() else None
    return {"candidates": len(recs), "hash_s_estimate": hash_s,
            # Other users' load slows the per-video work and so moves every share: say what it was.
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "panel_jobs": "combined" if "generate_score_panel" in jobs else "per-stage",
            "panel_jobs_wall_s": panel_jobs,
            "work_share_of_panel_jobs": (gen_s + enc_s + score_s) / panel_jobs if panel_jobs else None,
            # Per-video seconds are summed over parallel workers: against slot time (job
            # wall x its slots) the share cannot pass 100%.
            "panel_jobs_slot_s": panel_slot_s,
            "work_share_of_panel_slot_time": (gen_s + enc_s + score_s) / panel_slot_s if panel_slot_s else None,
            # What the panel jobs' slots spent on anything but per-video work (start-up,
            # imports, loads, verification, manifests, idle tails): less sensitive than the
            # shares to how fast this machine ran the videos during the run.
            "panel_overhead_slot_s": panel_slot_s - (gen_s + enc_s + score_s) if panel_slot_s else None,
            "slot_busy_share": busy,
            "hash_share": hash_s / max(1e-9, total),
            "generate_s_sum": gen_s, "encode_s_sum": enc_s, "score_s_sum": score_s,
            "work_s": gen_s + enc_s + score_s, "job_wall_s": total,
            "work_share": (gen_s + enc_s + score_s) / total if total else None,
            "workers": len(workers),
            "import_s_sum": sum(w["import_s"] for w in workers.values()),
            "model_load_s_sum": sum(w["load_s"] for w in workers.values() if w["load_s"] > 0),
            "warm_up_tasks": len(warm_spans),
            "warm_up_s_sum": sum(s["finished"] - s["started"] for s in warm_spans),
            "job_wall_s_by_rule": jobs}

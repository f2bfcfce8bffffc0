"""Repeatability reruns: the noise floor of generation, scoring and timing.

A replicate regenerates, rescores and re-times panels under
``scratch/replicates/r<n>/`` with the same config. The report states, against the
original run: the share of videos bitwise identical to the original; per metric, the
spread of each candidate's score across original and replicates (the scorer's and
generator's noise floor); and the coefficient of variation of timed latency.
Imports without torch.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import PairingError
from ..layout import Layout
from ..plan.config import StudySpec
from ..records.types import GenerationRecord, ScoreRecord, TimingRecord


def replicate_study(study: StudySpec, rep: str) -> StudySpec:
    """The same study with its scratch moved under ``replicates/<rep>``."""
    return dataclasses.replace(study, scratch=Layout(study.scratch).replicate(rep).scratch)


def noise_report(runs: dict[str, tuple[list[GenerationRecord], list[ScoreRecord], list[TimingRecord]]]
                 ) -> dict[str, Any]:
    """Compare runs. ``runs['original']`` and each replicate hold (generation, score,
    timing) records of the same candidates. Returns the replicates' names, how many
    replicate videos were compared and the share bitwise identical to the original (None
    when none was), per metric the spread of a candidate's score over every run (max and
    median range, max population SD) and the latency's coefficient of variation (across
    runs, and within a run over the timed repeats). Raises PairingError for a replicate
    video whose candidate the original run lacks."""
    def key(r: GenerationRecord | ScoreRecord | TimingRecord) -> tuple[str, str, str, int]:
        c = r["candidate"]
        return (c["panel"], r["arm"]["name"], c["prompt_id"], int(c["seed"]))

    orig_gen = {key(r): r for r in runs["original"][0]}
    reps = [name for name in runs if name != "original"]
    identical = total = 0
    for name in reps:
        for r in runs[name][0]:
            original = orig_gen.get(key(r))
            if original is None:
                raise PairingError(f"replicate {name}: candidate {key(r)} has no generation record in the original "
                                   "run; run the study (snakemake) before its repeatability rules")
            total += 1
            identical += r["video"]["digest"] == original["video"]["digest"]
    values: dict[str, dict[tuple[str, str, str, int], list[float]]] = {}
    for _name, (_g, scores, _t) in runs.items():
        for sr in scores:
            for metric, s in sr["scores"].items():
                values.setdefault(metric, {}).setdefault(key(sr), []).append(s["value"])
    floors = {}
    for metric, by in sorted(values.items()):
        spreads = [max(v) - min(v) for v in by.values()]
        sds = [statistics.pstdev(v) for v in by.values()]
        floors[metric] = {"max_range": max(spreads), "median_range": statistics.median(spreads),
                          "max_sd": max(sds), "candidates": len(by)}
    lat: dict[tuple[str, str, str, int], list[float]] = {}
    within = []
    for _name, (_g, _s, timings) in runs.items():
        for t in timings:
            seconds = t["timing"]["latency_s"]
            if seconds is None:  # a pair outside the timing/pairs sample
                continue
            lat.setdefault(key(t), []).append(seconds)
            xs = t["timing"].get("seconds", [])
            if len(xs) > 1:
                within.append(statistics.stdev(xs) / statistics.mean(xs))
    across = [statistics.stdev(v) / statistics.mean(v) for v in lat.values() if len(v) > 1]
    return {
        "replicates": reps,
        "videos_compared": total,
        "bitwise_identical_share": identical / total if total else None,
        "noise_floor": floors,
        "latency_cv": {"across_runs_median": statistics.median(across) if across else None,
                       "across_runs_max": max(across) if across else None,
                       "within_run_median": statistics.median(within) if within else None},
    }


def markdown(report: dict[str, Any], flags: list[str]) -> str:
    """The repeatability report (``noise_report``) and the noise-floor flags
    (``stats.noise_flags``) as Markdown."""
    share = report["bitwise_identical_share"]
    lines = ["# Repeatability", "",
             f"Replicates: {', '.join(report['replicates']) or 'none'}; videos compared with the original: "
             f"{report['videos_compared']}; bitwise identical: {'n/a' if share is None else f'{share:.1%}'}.",
             "", "| metric | candidates | max range | median range | max SD |", "|---|---|---|---|---|"]
    for m, f in report["noise_floor"].items():
        lines.append(f"| {m} | {f['candidates']} | {f['max_range']:.4g} | {f['median_range']:.4g} "
                     f"| {f['max_sd']:.4g} |")
    cv = report["latency_cv"]

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2%}"

    lines += ["", f"Timed latency CV: across runs median {fmt(cv['across_runs_median'])}, max "
              f"{fmt(cv['across_runs_max'])}; within a run (repeats) median {fmt(cv['within_run_median'])}.", ""]
    lines += ["## Study differences against the noise floor", ""] + [f"- {f}" for f in flags] + [""]
    return "\n".join(lines)


def write(report: dict[str, Any], flags: list[str], out_json: Path, out_md: Path) -> None:
    """Write the report with its flags as JSON (``noise_flags`` added) and as Markdown, atomically."""
    write_text(out_json, json.dumps({**report, "noise_flags": flags}, indent=1, sort_keys=True) + "\n")
    write_text(out_md, markdown(report, flags))

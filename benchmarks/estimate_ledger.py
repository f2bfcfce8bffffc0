"""Estimate against the ledger (issue 28): after one run of a study in PROJECT (default the
current directory), calibrate (unless its table exists), estimate, add the run's jobs to
the ledger and print both figures and their ratio, in total and for task work only.

    .venv/bin/snakemake --profile profiles/local && .venv/bin/python benchmarks/estimate_ledger.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pairflow.atomic import write_text
from pairflow.budget.calibrate import calibrate
from pairflow.budget.estimate import estimate
from pairflow.layout import Layout
from pairflow.plan.config import load_study
from pairflow.stages.steps import add_to_ledger


def main(project: Path) -> dict[str, float]:
    study = load_study(project / "config" / "config.yaml", project)
    est = estimate(study, calibrate(study))
    write_text(Layout(study.scratch).estimate, json.dumps(est, indent=1, sort_keys=True) + "\n")
    book = add_to_ledger(study)
    t, s = book["totals"], est["stage_slot_s"]
    work = t["by_kind"]["work"]
    est_work = s["generate"] + s["score"] + s["timing"]
    out = {"estimate_slot_s": est["total_slot_s"], "ledger_slot_s": t["slot_s"],
           "ratio": est["total_slot_s"] / t["slot_s"], "estimate_work_s": est_work, "ledger_work_s": work,
           "work_ratio": est_work / work, "ledger_warmup_s": t["by_kind"]["warm-up"],
           "ledger_startup_s": t["by_kind"]["start-up"], "estimate_warmup_s": s["warm-up"]}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd())

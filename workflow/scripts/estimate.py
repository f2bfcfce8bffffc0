"""Rule adapter: the study's cost estimate from the calibration table, and the budget guard.
A refusal is one line in the rule's log and exit 3 (no traceback); the workflow then says it
once and exits 3 (common.smk)."""
import sys
from pathlib import Path

from pairflow.stages.steps import estimate_study, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
sys.exit(estimate_study(study, Path(sm.input.table), Path(sm.output[0]), "the study config"))

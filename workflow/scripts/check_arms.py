"""Rule adapter: check every arm against the model, before any model loads (or copy the
check this run's preparing job made: then no torch is imported here)."""
from pathlib import Path

from pairflow.stages.steps import check_arms, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
check_arms(study, Path(sm.output[0]))

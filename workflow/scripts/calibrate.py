"""Rule adapter: the frozen calibration table (one representative candidate per arm),
copied from this run's preparing job when it measured it, else measured in a fresh worker."""
from pathlib import Path

from pairflow.stages.steps import calibrate_study, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
calibrate_study(study, Path(sm.output[0]), sm.params.key)

"""Rule adapter: the frozen calibration table (one representative candidate per arm)."""
from pathlib import Path

from pairflow.calibrate import calibrate
from pairflow.steps import study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
calibrate(study, Path(sm.output[0]), force=True, planned_key=sm.params.key)

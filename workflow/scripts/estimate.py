"""Rule adapter: the study's cost estimate from the calibration table, and the budget guard."""
from pathlib import Path

from pairflow.stages.steps import estimate_study, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
estimate_study(study, Path(sm.input.table), Path(sm.output[0]), ", ".join(sm.params.configfiles))

"""Rule adapter: the study's cost estimate from the calibration table, and the budget guard."""
from pathlib import Path

from pairflow.estimate import write_estimate
from pairflow.steps import study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
write_estimate(study, Path(sm.input.table), Path(sm.output[0]), ", ".join(sm.params.configfiles))

"""Rule adapter: the repeatability report."""
from pathlib import Path

from pairflow.stages.steps import repeatability, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
repeatability(study, Path(sm.input.stats), Path(sm.output.json), Path(sm.output.table))

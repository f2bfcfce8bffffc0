"""Rule adapter: one repeatability replicate of one panel."""
from pathlib import Path

from pairflow.stages.steps import replicate_panel, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
replicate_panel(study, sm.wildcards.rep, sm.wildcards.panel, Path(sm.output[0]))

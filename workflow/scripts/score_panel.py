"""Rule adapter: score one panel's videos through Parsl."""
from pathlib import Path

from pairflow.stages.steps import score_panel, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
score_panel(study, sm.wildcards.panel, Path(sm.output[0]))

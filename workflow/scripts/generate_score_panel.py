"""Rule adapter: generate and score one panel in one job through one Parsl pool."""
from pathlib import Path

from pairflow.stages.steps import generate_score_panel, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
generate_score_panel(study, sm.wildcards.panel, Path(sm.output.generation), Path(sm.output.scores))

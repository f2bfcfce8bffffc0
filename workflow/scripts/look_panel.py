"""Rule adapter: generate and score one panel's prompts released by one look."""
from pathlib import Path

from pairflow.stages.steps import look_panel, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
look_panel(study, sm.wildcards.panel, int(sm.wildcards.look), Path(sm.output.generation), Path(sm.output.scores))

"""Rule adapter: generate one panel's incomplete candidates through Parsl."""
from pathlib import Path

from pairflow.stages.steps import generate_panel, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
generate_panel(study, sm.wildcards.panel, Path(sm.output[0]))

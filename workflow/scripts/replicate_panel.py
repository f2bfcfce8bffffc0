"""Rule adapter: one repeatability replicate of one panel."""
import os
from pathlib import Path

from pairflow.fleet import grant_from_env
from pairflow.steps import replicate_panel, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
replicate_panel(study, sm.wildcards.rep, sm.wildcards.panel, Path(sm.output[0]), grant_from_env(dict(os.environ)))

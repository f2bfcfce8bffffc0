"""Rule adapter: one repeatability replicate of one panel."""
import os
from pathlib import Path

from pairflow.fleet import granted_accelerators
from pairflow.steps import replicate_panel, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
replicate_panel(study, sm.wildcards.rep, sm.wildcards.panel, Path(sm.output[0]),
                granted_accelerators(dict(os.environ)))

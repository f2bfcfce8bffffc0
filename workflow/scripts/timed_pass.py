"""Rule adapter: the exclusive timed pass over the whole study."""
from pathlib import Path

from pairflow.stages.steps import study_for_rule, timed_pass

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
timed_pass(study, Path(sm.output[0]))

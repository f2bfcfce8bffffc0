"""Rule adapter: the exclusive timed pass for one panel."""
from pathlib import Path

from pairflow.steps import study_for_rule
from pairflow.timing import run_timed_pass

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
run_timed_pass(study, sm.wildcards.panel, Path(sm.output[0]))

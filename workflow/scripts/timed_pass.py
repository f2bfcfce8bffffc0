"""Rule adapter: the exclusive timed pass over the whole study."""
import os
from pathlib import Path

from pairflow.slurm import allocation
from pairflow.steps import study_for_rule
from pairflow.timing import run_timed_pass

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
run_timed_pass(study, [p.name for p in study.panels], Path(sm.output[0]), allocation(dict(os.environ)))

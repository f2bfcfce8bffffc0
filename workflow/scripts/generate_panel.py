"""Rule adapter: generate one panel's incomplete candidates through Parsl."""
import os
from pathlib import Path

from pairflow.fleet import grant_from_env
from pairflow.layout import Layout
from pairflow.panel import run_generation
from pairflow.steps import study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
out = Path(sm.output[0])
run_generation(study, sm.wildcards.panel, out, Layout(study.scratch).run_dir(sm.wildcards.panel, "generate"),
               grant_from_env(dict(os.environ)))

"""Rule adapter: per-slot busy share of the study's fan-out jobs."""
from pathlib import Path

from pairflow.stages.steps import study_for_rule, utilisation

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
utilisation(study, Path(sm.output.json), Path(sm.output.table))

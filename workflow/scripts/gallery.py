"""Rule adapter: the report's video gallery (control beside each treatment, per pair)."""
from pathlib import Path

from pairflow.stages.steps import gallery, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
gallery(study, Path(sm.input.stats), Path(sm.output.gallery))

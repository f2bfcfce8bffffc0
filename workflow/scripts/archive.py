"""Rule adapter: promote compact evidence to work storage and verify it."""
from pathlib import Path

from pairflow.stages.steps import archive, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
archive(study, Path(sm.output[0]), tuple(sm.params.configfiles))

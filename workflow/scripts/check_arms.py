"""Rule adapter: check every arm against the model, before any model loads."""
from pathlib import Path

from pairflow.arms import write_arms_check
from pairflow.steps import study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
write_arms_check(study.arms, study.model, Path(sm.output[0]))

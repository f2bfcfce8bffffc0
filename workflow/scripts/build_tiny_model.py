"""Rule adapter: build the embedded tiny Wan pipeline into the model directory, then
prepare (in this one process) what rules check_arms and calibrate copy."""
from pathlib import Path

from pairflow.stages.steps import build_model, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)  # the config, not params: an arm's change must not rebuild the model
build_model(Path(sm.output[0]).parent, study)

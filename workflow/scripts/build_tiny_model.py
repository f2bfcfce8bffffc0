"""Rule adapter: build the embedded tiny Wan pipeline into the model directory."""
from pathlib import Path

from pairflow.stages.steps import build_model, log_to

log_to(Path(snakemake.log[0]))  # noqa: F821 - injected by Snakemake
build_model(Path(snakemake.output[0]).parent)  # noqa: F821

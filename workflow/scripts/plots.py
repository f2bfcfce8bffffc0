"""Rule adapter: the report's figures."""
from pathlib import Path

from pairflow.stages.steps import plots, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
plots(study, Path(sm.input.stats), {k: Path(v) for k, v in sm.output.items()})

"""Rule adapter: paired statistics for one panel."""
from pathlib import Path

from pairflow.steps import panel_stats, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
manifests = {k: Path(sm.input[k]) for k in ("generation", "scores", "timing")}
panel_stats(study, sm.wildcards.panel, manifests, Path(sm.output.stats), Path(sm.output.table))

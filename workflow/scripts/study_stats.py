"""Rule adapter: paired statistics for the whole study and the study manifest."""
from pathlib import Path

from pairflow.steps import study_for_rule, study_stats

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
manifests = {f"{kind}:{Path(p).parent.name}": Path(p) for kind in ("generation", "scores") for p in sm.input[kind]}
manifests["timing"] = Path(sm.input.timing)
study_stats(study, manifests, Path(sm.output.stats), Path(sm.output.table), Path(sm.output.manifest))

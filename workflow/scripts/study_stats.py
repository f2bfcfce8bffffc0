"""Rule adapter: paired statistics for the whole study and the study manifest."""
from pathlib import Path

from pairflow.layout import Layout
from pairflow.steps import study_for_rule, study_stats

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
layout = Layout(study.scratch)
manifests = {f"{kind}:{p.name}": path(p.name) for kind, path in (("generation", layout.generation_manifest),
                                                                  ("scores", layout.score_manifest))
             for p in study.panels}
manifests["timing"] = Path(sm.input.timing)
study_stats(study, manifests, Path(sm.output.stats), Path(sm.output.table), Path(sm.output.manifest))

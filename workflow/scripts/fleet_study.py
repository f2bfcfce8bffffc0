"""Rule adapter: generate and score every panel of the study in one job (fleet.allocation: study)."""
from pathlib import Path

from pairflow.stages.steps import fleet_study, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
manifests = zip(sm.params.panels, sm.output.generation, sm.output.scores, strict=True)
outputs = {p: (Path(g), Path(s)) for p, g, s in manifests}
fleet_study(study, outputs)

"""Rule adapter: paired statistics for the whole study and the study manifest."""
from pathlib import Path

from pairflow.stages.steps import study_for_rule, study_manifests, study_stats

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
study_stats(study, study_manifests(study, Path(sm.input.timing)), Path(sm.output.stats), Path(sm.output.table),
            Path(sm.output.manifest))

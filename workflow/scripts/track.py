"""Rule adapter: log the study table, headline numbers and gallery to report/tracker."""
from pathlib import Path

from pairflow.stages.steps import study_for_rule, track

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
track(study, Path(sm.input.stats), Path(sm.input.table), Path(sm.input.gallery), Path(sm.input.manifest),
      Path(sm.output.tracked))

"""Rule adapter: checkpoint look, the group-sequential decision after one look."""
from pathlib import Path

from pairflow.stages.steps import decide_look, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
study = study_for_rule(sm)
decide_look(study, int(sm.wildcards.look), Path(sm.output[0]))

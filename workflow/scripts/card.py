"""Rule adapter: the claim card's results part and page, after the archive."""
from pairflow.stages.steps import card, study_for_rule

sm = snakemake  # noqa: F821 - injected by Snakemake
card(study_for_rule(sm))

# PairFlow: paired evaluation of video-generation models.
# Stages, in order (rule names in brackets):
#   build the embedded model [build_tiny_model] → check every arm against it [check_arms]
#   → calibrate, then estimate the cost against fleet.budget_gpu_hours [calibrate, estimate]
#   → generate and score each panel, one Parsl fan-out per panel [generate_score_panel;
#     fleet.panel_jobs: per-stage makes it generate_panel then score_panel; fleet.allocation:
#     study makes it one job for every panel, fleet_study; sequential: each look's jobs
#     first [look_panel], then its decision [checkpoint look], until one says stop]
#   → exclusive timed pass [timed_pass] → paired statistics per panel and for the study
#     [study_stats] → figures, gallery, tracker [plots, gallery, track] → slot utilisation
#     [utilisation] → archive evidence [archive] → the claim card's results [card] (the card
#     itself is sealed by the first generation job, before it generates anything).
#   On demand: repeatability reruns [replicate_panel, repeatability].
from snakemake.utils import min_version

min_version("9.0")


# --configfile means that file alone: the default config loads only when none is given
# (Snakemake would otherwise merge the two, and a one-panel config would run both panels).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/calibrate.smk"
# fleet.allocation: study: one job for every panel. Else fleet.panel_jobs: one job per
# panel for generation and scoring, or one per stage.
if STUDY.fleet.allocation == "study":

    include: "workflow/rules/fleet.smk"

elif STUDY.fleet.panel_jobs == "combined":

    include: "workflow/rules/panel.smk"

    if STUDY.sequential is not None:

        include: "workflow/rules/looks.smk"

else:

    include: "workflow/rules/generate.smk"
    include: "workflow/rules/score.smk"


include: "workflow/rules/timing.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/telemetry.smk"
include: "workflow/rules/archive.smk"
include: "workflow/rules/repeatability.smk"


# Light aggregation steps run where Snakemake runs, not as scheduler jobs: each such rule
# says `localrule: True` itself (build_tiny_model, check_arms, estimate, study_stats, plots,
# gallery, track, utilisation, archive, card, repeatability), which a module's `use rule * from
# pairflow as pairflow_*` keeps; a global `localrules:` list names unprefixed rules and
# would be dropped there.


rule all:
    input:
        MANIFESTS,
        ARCHIVE_DONE,
        CARD_RESULTS,
        STUDY_TABLE,
        STUDY_TABLE_HTML,
        GALLERY,
        TRACKERS,
    default_target: True

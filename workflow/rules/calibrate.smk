# Calibration before scale: one representative candidate per arm, measured in a fresh
# worker, frozen in a table named by its key's digest (model, arms, shape, scorers,
# software, device); a changed key names a missing table, so this runs again only then.
# Where this run's preparing job (build_tiny_model or check_arms) already measured the
# table for this key, its import phase first, as a fresh worker's, the job copies it.
rule calibrate:
    input:
        model=MODEL_INPUT,
        arms=ancient(ARMS_CHECK),
    output:
        CALIBRATION,
    log:
        f"{LOGS}/calibrate.log",
    params:
        key=CALIBRATION_KEY,
    threads: max(STUDY.generation.threads, STUDY.scoring.threads)
    resources:
        runtime=30,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/calibrate.py"


# The estimate from the table and the config, and the budget guard: over
# fleet.budget_gpu_hours this job refuses (exit 3, the message in its log), no panel job
# starts (they take its output as input), and the run ends with that one message and exit
# 3 (budget_refused, common.smk), as planning refuses when the table already exists.
# Settings that change the cost rerun it; the budget and the config files' names do not
# (they change no output: planning checks the budget whenever the table exists).
rule estimate:
    localrule: True
    input:
        table=CALIBRATION,
    output:
        ESTIMATE,
    log:
        f"{LOGS}/estimate.log",
    params:
        drivers=ESTIMATE_DRIVERS,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/estimate.py"


# A refusal is deterministic: never retried (the Slurm profile's `retries: 1` would run it
# twice). Set on the rule itself: Snakemake reads `retries: 0` as "not set". Deployed as a
# module (`use rule * from pairflow as pairflow_*`) the rule has the deploying project's
# name for it, or is not there at all when the project did not take it.
if workflow.is_rule(workflow.modifier.modify_rulename("estimate")):
    workflow.get_rule(workflow.modifier.modify_rulename("estimate")).restart_times = 0

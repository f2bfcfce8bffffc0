# The run's first heavy job: it imports torch and diffusers once, builds the model, then
# checks the arms and (fleet.calibrate, local site) measures the calibration table in the
# same process, leaving both under scratch/cache/prepared (calibworker.prepare). Rules
# check_arms and calibrate keep their own outputs and rerun triggers; they copy from there
# without importing torch. The config is read from the job, not params: an arm's change
# reruns the check, never the build.
rule build_tiny_model:
    localrule: True
    output:
        MODEL_INDEX,
    log:
        f"{LOGS}/build_tiny_model.log",
    resources:
        runtime=10,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/build_tiny_model.py"


# Every arm checked against the model before any model loads (cache class, params and
# support by the transformer, scheduler, attention backend, a student's latents, a
# search verifier). Its own job, so planning never imports diffusers; generation takes
# its output as ancient input: a rerun of the check alone regenerates nothing. It copies
# the check the build job made for these arms and model files; else it is the preparing
# job itself (the check, then the calibration table for rule calibrate).
rule check_arms:
    localrule: True
    input:
        arms_check_input,
    output:
        ARMS_CHECK,
    log:
        f"{LOGS}/check_arms.log",
    params:
        key=ARMS_KEY,
    resources:
        runtime=10,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/check_arms.py"

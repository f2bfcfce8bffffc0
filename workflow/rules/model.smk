rule build_tiny_model:
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
# its output as ancient input: a rerun of the check alone regenerates nothing.
rule check_arms:
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

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

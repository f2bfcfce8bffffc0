# One job per panel (never per candidate); candidates fan out through Parsl inside it.
rule generate_panel:
    input:
        model_input,
    output:
        GEN_MANIFEST,
    log:
        f"{LOGS}/generate/{{panel}}.log",
    params:
        config_digest=STUDY.subtree_digest("study", "model", "arms", "generation", "encoder", "panels"),
    threads: STUDY.fleet.cpu_workers * STUDY.generation.threads
    resources:
        gpus=0,
        runtime=120,
    conda:
        "../../envs/generate.yaml"
    script:
        "../scripts/generate_panel.py"

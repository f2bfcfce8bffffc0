# One job per panel (never per candidate); candidates fan out through Parsl inside it.
rule generate_panel:
    input:
        model=MODEL_INPUT,
        arms=arms_checked(GEN_MANIFEST),
        # the budget guard passed (rule estimate); not ancient: Snakemake (9) then skips a job
        # whose other inputs changed while the estimate is being remade (a new prompt ran nothing)
        estimate=ESTIMATE_INPUT,
        sheet=panel_sheet,
        heal=healing(GEN_MANIFEST),
    output:
        GEN_MANIFEST,
    benchmark:
        str(LAYOUT.benchmark("generate_panel", "{panel}"))
    log:
        f"{LOGS}/generate/{{panel}}.log",
    params:
        panel_digest=panel_digest,
    threads: STUDY.fleet.cpu_workers * STUDY.generation.threads
    resources:
        runtime=120,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/generate_panel.py"

# The exclusive timed pass: every core locally (so no other job shares the machine);
# the Slurm profile asks for an exclusive node. Runs after the panel's bulk generation.
rule timed_panel:
    input:
        GEN_MANIFEST,
    output:
        TIMING_MANIFEST,
    benchmark:
        f"{SCRATCH}/benchmarks/timed_panel/{{panel}}.tsv"
    log:
        f"{LOGS}/timing/{{panel}}.log",
    params:
        timing=STUDY.raw["timing"],
    threads: workflow.cores
    resources:
        runtime=120,
    conda:
        "../../envs/generate.yaml"
    script:
        "../scripts/timed_panel.py"

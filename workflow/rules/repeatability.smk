# Repeatability reruns, on demand: `snakemake --profile profiles/local repeatability`.
rule replicate_panel:
    input:
        scores=SCORE_MANIFEST,
        timing=TIMING_MANIFEST,
    output:
        REPLICATE_TIMING,
    log:
        f"{LOGS}/replicates/{{rep}}-{{panel}}.log",
    threads: lambda wildcards: workflow.cores  # every local core; on Slurm: set-threads + --exclusive
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/replicate_panel.py"


rule repeatability:
    localrule: True
    input:
        stats=STUDY_STATS,
        replicates=replicate_outputs,
    output:
        json=REPEATABILITY,
        table=report(REPEATABILITY_MD, caption="../report/repeatability.rst",
                     category="Repeatability"),
    log:
        f"{LOGS}/repeatability.log",
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/repeatability.py"

# The exclusive timed pass, one job for the study: every core locally (so no other job
# shares the machine); the Slurm profile asks for an exclusive node. Candidates already
# timed against their current generation record are kept.
rule timed_pass:
    input:
        expand(GEN_MANIFEST, panel=PANELS),
        heal=healing(TIMING_MANIFEST),
    output:
        TIMING_MANIFEST,
    benchmark:
        str(LAYOUT.benchmark("timed_pass", "study"))
    log:
        f"{LOGS}/timing.log",
    params:
        timing=STUDY.raw["timing"],
    threads: lambda wildcards: workflow.cores  # every local core; on Slurm: set-threads + --exclusive
    resources:
        runtime=120,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/timed_pass.py"

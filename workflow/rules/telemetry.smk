# Slot utilisation from the fan-out jobs' per-task spans (and NVML samples where a GPU
# exists): the share of allocated slot time spent running tasks.
rule utilisation:
    input:
        generation=expand(GEN_MANIFEST, panel=PANELS),
        scores=expand(SCORE_MANIFEST, panel=PANELS),
        timing=TIMING_MANIFEST,
    output:
        json=UTILISATION,
        table=report(UTILISATION_MD, caption="../report/utilisation.rst", category="Fleet"),
    log:
        f"{LOGS}/utilisation.log",
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/utilisation.py"

# Slot utilisation from the fan-out jobs' per-task spans (and NVML samples where a GPU
# exists): the share of allocated slot time spent running tasks.
rule utilisation:
    localrule: True
    input:
        # Written after every panel's generation and scoring and the timed pass (one
        # edge, not three per panel: planning cost grows with the edges).
        STUDY_MANIFEST,
    output:
        json=UTILISATION,
        table=report(UTILISATION_MD, caption="../report/utilisation.rst", category="Fleet"),
        # the ledger's report section (study/ledger.json beside it is added to by every
        # run, failed ones included, so it is not an output Snakemake would remove first)
        ledger=report(LEDGER_MD, caption="../report/ledger.rst", category="Fleet"),
    log:
        f"{LOGS}/utilisation.log",
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/utilisation.py"

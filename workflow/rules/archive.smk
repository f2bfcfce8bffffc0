# Compact evidence goes to work storage; videos stay on scratch.
rule archive:
    localrule: True
    input:
        STUDY_MANIFEST,
        f"{PLOTS}/forest.png",
        UTILISATION,
    output:
        ARCHIVE_DONE,
    benchmark:
        str(LAYOUT.benchmark("archive", "study"))
    log:
        f"{LOGS}/archive.log",
    params:
        configfiles=CONFIGFILES,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/archive.py"

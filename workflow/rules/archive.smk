# Compact evidence goes to work storage; videos stay on scratch. The last rule of a run:
# every other output it seals is finished (and the ledger brought up to date) first.
rule archive:
    localrule: True
    input:
        STUDY_MANIFEST,
        f"{PLOTS}/forest.png",
        UTILISATION,
        GALLERY,
        TRACKERS,
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


# The claim card after the archive: the results against the card sealed before generation
# (by the first generation job), with the archive's root digest; not itself archived.
rule card:
    localrule: True
    input:
        ARCHIVE_DONE,
    output:
        CARD_RESULTS,
    log:
        f"{LOGS}/card.log",
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/card.py"

rule panel_stats:
    input:
        generation=GEN_MANIFEST,
        scores=SCORE_MANIFEST,
    output:
        stats=PANEL_STATS,
        table=report(PANEL_TABLE, caption="../report/panel_table.rst", category="Panels"),
    log:
        f"{LOGS}/stats/{{panel}}.log",
    params:
        stats=STUDY.raw["stats"],
    conda:
        "../../envs/stats.yaml"
    script:
        "../scripts/panel_stats.py"


rule study_stats:
    input:
        generation=expand(GEN_MANIFEST, panel=PANELS),
        scores=expand(SCORE_MANIFEST, panel=PANELS),
    output:
        stats=STUDY_STATS,
        table=report(STUDY_TABLE, caption="../report/study_table.rst", category="Study"),
        manifest=STUDY_MANIFEST,
    log:
        f"{LOGS}/stats/study.log",
    params:
        stats=STUDY.raw["stats"],
    conda:
        "../../envs/stats.yaml"
    script:
        "../scripts/study_stats.py"

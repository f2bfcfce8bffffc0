rule panel_stats:
    input:
        generation=GEN_MANIFEST,
        scores=SCORE_MANIFEST,
        timing=TIMING_MANIFEST,
    output:
        stats=PANEL_STATS,
        table=report(PANEL_TABLE, caption="../report/panel_table.rst", category="Panels"),
    benchmark:
        f"{SCRATCH}/benchmarks/panel_stats/{{panel}}.tsv"
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
        timing=expand(TIMING_MANIFEST, panel=PANELS),
    output:
        stats=STUDY_STATS,
        table=report(STUDY_TABLE, caption="../report/study_table.rst", category="Study"),
        manifest=STUDY_MANIFEST,
    benchmark:
        f"{SCRATCH}/benchmarks/study_stats/study.tsv"
    log:
        f"{LOGS}/stats/study.log",
    params:
        stats=STUDY.raw["stats"],
    conda:
        "../../envs/stats.yaml"
    script:
        "../scripts/study_stats.py"


rule plots:
    input:
        STUDY_MANIFEST,
        stats=STUDY_STATS,
    output:
        forest=report(f"{PLOTS}/forest.png", caption="../report/forest.rst", category="Plots"),
        latency=report(f"{PLOTS}/latency.png", caption="../report/latency.rst", category="Plots"),
        scatter=report(f"{PLOTS}/scatter.png", caption="../report/scatter.rst", category="Plots"),
        per_prompt=report(f"{PLOTS}/per_prompt.png", caption="../report/per_prompt.rst", category="Plots"),
    benchmark:
        f"{SCRATCH}/benchmarks/plots/study.tsv"
    log:
        f"{LOGS}/plots.log",
    conda:
        "../../envs/stats.yaml"
    script:
        "../scripts/plots.py"

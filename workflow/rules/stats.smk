rule study_stats:
    localrule: True
    input:
        # A panel's scores follow its generation (score_panel takes GEN_MANIFEST), so the
        # generation manifests are not listed again: planning cost grows with the edges.
        scores=expand(SCORE_MANIFEST, panel=PANELS),
        timing=TIMING_MANIFEST,
        heal=healing(STUDY_MANIFEST),
        looks=stop_look,  # sequential/enabled: where the study stopped (stats.json's sequential)
    output:
        panel_stats=expand(PANEL_STATS, panel=PANELS),
        panel_tables=expand(PANEL_TABLE, panel=PANELS),
        panel_html=report(expand(PANEL_TABLE_HTML, panel=PANELS), caption="../report/panel_table.rst",
                          category="Panels"),
        stats=STUDY_STATS,
        table=STUDY_TABLE,
        html=report(STUDY_TABLE_HTML, caption="../report/study_table.rst", category="Study"),
        manifest=STUDY_MANIFEST,
    benchmark:
        str(LAYOUT.benchmark("study_stats", "study"))
    log:
        f"{LOGS}/stats/study.log",
    params:
        stats=STUDY.raw["stats"],
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/study_stats.py"


rule plots:
    localrule: True
    input:
        STUDY_MANIFEST,
        stats=STUDY_STATS,
    output:
        forest=report(f"{PLOTS}/forest.png", caption="../report/forest.rst", category="Plots"),
        latency=report(f"{PLOTS}/latency.png", caption="../report/latency.rst", category="Plots"),
        scatter=report(f"{PLOTS}/scatter.png", caption="../report/scatter.rst", category="Plots"),
        per_prompt=report(f"{PLOTS}/per_prompt.png", caption="../report/per_prompt.rst", category="Plots"),
        pareto=report(f"{PLOTS}/pareto.png", caption="../report/pareto.rst", category="Plots"),
    benchmark:
        str(LAYOUT.benchmark("plots", "study"))
    log:
        f"{LOGS}/plots.log",
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/plots.py"


rule gallery:
    localrule: True
    input:
        STUDY_MANIFEST,
        stats=STUDY_STATS,
    output:
        gallery=report(GALLERY, caption="../report/gallery.rst", category="Gallery"),
    benchmark:
        str(LAYOUT.benchmark("gallery", "study"))
    log:
        f"{LOGS}/gallery.log",
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/gallery.py"


# Only a target when report/tracker names a tracker (rule all's TRACKERS). The tracker's
# package is never a dependency: with the .venv it must be installed there (checked at
# planning, common.smk); under --software-deployment-method conda add it to
# envs/pairflow.yaml's pip list (the rule refuses, naming the package, where it is missing).
rule track:
    localrule: True
    input:
        stats=STUDY_STATS,
        table=STUDY_TABLE,
        html=STUDY_TABLE_HTML,
        gallery=GALLERY,
        manifest=STUDY_MANIFEST,
    output:
        tracked=TRACKED,
    benchmark:
        str(LAYOUT.benchmark("track", "study"))
    log:
        f"{LOGS}/track.log",
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/track.py"

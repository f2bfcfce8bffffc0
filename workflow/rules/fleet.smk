# fleet.allocation: study. One job generates and scores every panel (on Slurm one
# multi-node allocation, one worker per GPU on every node) from one queue; each panel's
# manifests are written as it completes. Snakemake still owns the DAG: this rule's
# outputs are every panel's manifests, so stats, the timed pass and the archive follow
# as under per-panel jobs. Replaces rule generate_score_panel (panel.smk).
FLEET_GENERATION = expand(GEN_MANIFEST, panel=PANELS)
FLEET_SCORES = expand(SCORE_MANIFEST, panel=PANELS)


# Every panel's manifests' heal stamps (see ``healing``): the rule has no wildcards, so a list.
FLEET_HEALING = [s for o in (*FLEET_GENERATION, *FLEET_SCORES)
                 for s in stamp_input(LAYOUT.scratch, o, STAMPS, STALE)]


rule fleet_study:
    input:
        model=MODEL_INPUT,
        arms=arms_checked(*FLEET_GENERATION, *FLEET_SCORES),
        sheets=[str(as_named(p.sheet)) for p in STUDY.panels],
        estimate=ESTIMATE_INPUT,  # the budget guard passed (rule estimate), as for per-panel jobs
        heal=FLEET_HEALING,
    output:
        generation=FLEET_GENERATION,
        scores=FLEET_SCORES,
    benchmark:
        str(LAYOUT.benchmark("fleet_study", "study"))
    log:
        f"{LOGS}/fleet/study.log",
    params:
        panels=PANELS,  # the outputs' order, for the adapter
        panel_digests={p: STUDY.panel_digest(p) for p in PANELS},
        scorers=STUDY.scorers,
        scoring=STUDY.raw["scoring"],  # batch, threads, static filter: a change rescores
        weights=STUDY.raw["weights"],  # the mirror; its lock digest is checked inside the job
    threads: STUDY.fleet.cpu_workers * max(STUDY.generation.threads, STUDY.scoring.threads)
    resources:
        runtime=720,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/fleet_study.py"

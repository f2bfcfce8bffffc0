# fleet.panel_jobs: combined (the default). One job per panel generates and scores: one
# Parsl pool whose workers load the model and scorers once; a candidate is scored as soon
# as its video and its control's land. Same outputs as generate_panel + score_panel.
rule generate_score_panel:
    input:
        model=MODEL_INPUT,
        arms=arms_checked(GEN_MANIFEST, SCORE_MANIFEST),
        # the budget guard passed (rule estimate); not ancient: Snakemake (9) then skips a job
        # whose other inputs changed while the estimate is being remade (a new prompt ran nothing)
        estimate=ESTIMATE_INPUT,
        sheet=panel_sheet,
        heal_generation=healing(GEN_MANIFEST),
        heal_scores=healing(SCORE_MANIFEST),
        # sequential/enabled: the stopping look's decision (the release these manifests hold)
        looks=stop_look,
    output:
        generation=GEN_MANIFEST,
        scores=SCORE_MANIFEST,
    benchmark:
        str(LAYOUT.benchmark("generate_score_panel", "{panel}"))
    log:
        f"{LOGS}/generate-score/{{panel}}.log",
    params:
        panel_digest=panel_digest,
        scorers=STUDY.scorers,
        scoring=STUDY.raw["scoring"],  # batch, threads, static filter: a change rescores
        weights=STUDY.raw["weights"],  # the mirror; its lock digest is checked inside the job
    threads: STUDY.fleet.cpu_workers * max(STUDY.generation.threads, STUDY.scoring.threads)
    resources:
        runtime=180,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/generate_score_panel.py"

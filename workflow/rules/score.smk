rule score_panel:
    input:
        GEN_MANIFEST,
        heal=healing(SCORE_MANIFEST),
    output:
        SCORE_MANIFEST,
    benchmark:
        str(LAYOUT.benchmark("score_panel", "{panel}"))
    log:
        f"{LOGS}/score/{{panel}}.log",
    params:
        scorers=STUDY.scorers,
        scoring=STUDY.raw["scoring"],  # batch, threads, static filter: a change reruns scoring
        weights=STUDY.raw["weights"],  # the mirror; its lock digest is checked inside the job
    threads: STUDY.fleet.cpu_workers
    resources:
        runtime=60,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/score_panel.py"

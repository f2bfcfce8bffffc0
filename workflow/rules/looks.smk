# sequential/enabled: group-sequential looks over prompts. Look k's job per panel generates
# and scores the prompts released by then (each panel's first ceil(f_k * planned) prompts;
# earlier looks' are reused); checkpoint look tests every pre-registered question against
# its alpha-spending boundary and says stop or continue. Snakemake re-plans from it: the
# next look's jobs, or (stop_look, common.smk) the panel jobs of rule generate_score_panel
# at that release, which find every candidate done and write the manifests. What a
# stopped study did not release is not in its plan (plan.config reads the decision).
rule look_panel:
    input:
        model=MODEL_INPUT,
        arms=arms_checked(LOOK_GEN, LOOK_SCORES),
        estimate=ESTIMATE_INPUT,
        sheet=panel_sheet,
        previous=previous_look,
    output:
        generation=LOOK_GEN,
        scores=LOOK_SCORES,
    benchmark:
        str(LAYOUT.benchmark("look_panel", "{panel}-look{look}"))
    log:
        f"{LOGS}/look/{{panel}}-look{{look}}.log",
    params:
        panel_digest=panel_digest,
        released=lambda wildcards: look_count(wildcards),
        scorers=STUDY.scorers,
        scoring=STUDY.raw["scoring"],
        weights=STUDY.raw["weights"],
    threads: STUDY.fleet.cpu_workers * max(STUDY.generation.threads, STUDY.scoring.threads)
    resources:
        runtime=180,
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/look_panel.py"


checkpoint look:
    localrule: True
    input:
        scores=lambda wildcards: expand(LOOK_SCORES, panel=PANELS, look=wildcards.look),
    output:
        LOOK_DECISION,
    log:
        f"{LOGS}/look/look{{look}}.log",
    params:
        sequential=STUDY.raw["sequential"],
        stats=STUDY.raw["stats"],
    conda:
        "../../envs/pairflow.yaml"
    script:
        "../scripts/look.py"

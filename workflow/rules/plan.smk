rule plan:
    output:
        f"{RESULTS}/plan/bench.yaml",
    log:
        f"{RESULTS}/logs/plan.log",
    params:
        bench=config["bench"],
    conda:
        "../envs/tiledattn.yaml"
    script:
        "../scripts/plan.py"

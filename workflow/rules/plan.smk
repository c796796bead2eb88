rule plan:
    output:
        bench=f"{RESULTS}/plan/bench.yaml",
        study=f"{RESULTS}/plan/study-config.yaml",
    log:
        f"{RESULTS}/logs/plan.log",
    params:
        bench=config["bench"],
        points=n_points(BENCH),
    conda:
        "../envs/tiledattn.yaml"
    script:
        "../scripts/plan.py"


rule plan_ladder:
    output:
        f"{RESULTS}/plan/ladder.yaml",
    log:
        f"{RESULTS}/logs/plan-ladder.log",
    params:
        bench=ladder_bench(),
        points=n_points(LADDER),
    conda:
        "../envs/tiledattn.yaml"
    script:
        "../scripts/plan.py"


rule plan_shapes:
    output:
        f"{RESULTS}/plan/shapes-g{{g}}.yaml",
    log:
        f"{RESULTS}/logs/plan-shapes-g{{g}}.log",
    wildcard_constraints:
        g=r"\d+",
    params:
        bench=lambda wildcards: shapes_bench(int(wildcards.g)),
        points=lambda wildcards: n_points(SHAPES[int(wildcards.g)]),
    conda:
        "../envs/tiledattn.yaml"
    script:
        "../scripts/plan.py"

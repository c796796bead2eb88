# One job per shard. The job submits its shard through the configured launcher and waits.
# Rows land in shards/rows-shard<i>of<n>.jsonl, which is deliberately not a declared
# output: Snakemake deletes the outputs of a failed job, and a rerun must resume from the
# finished rows. The marker file says the shard completed.
rule bench_shard:
    input:
        rules.plan.output.bench,
    output:
        touch(f"{RESULTS}/shards/shard{{i}}of{SHARDS}.done"),
    log:
        f"{RESULTS}/logs/bench-shard{{i}}.log",
    params:
        launcher=config["launcher"],
        options=launcher_options(),
        shards=SHARDS,
        out=lambda wildcards, output: os.path.dirname(output[0]),
    resources:
        gpu=lambda wildcards: 1 if config["launcher"] == "local" else 0,
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn sweep --config {input} --launcher {params.launcher}"
        " --launcher-options '{params.options}' --shards {params.shards}"
        " --only {wildcards.i} --out {params.out} > {log} 2>&1"


# Table 6: the schedule ladder, one job through the same launcher (a GPU node under SLURM).
rule ladder:
    input:
        f"{RESULTS}/plan/ladder.yaml",
    output:
        touch(f"{RESULTS}/ladder/ladder.done"),
    log:
        f"{RESULTS}/logs/ladder.log",
    params:
        launcher=config["launcher"],
        options=launcher_options(),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    resources:
        gpu=lambda wildcards: 1 if config["launcher"] == "local" else 0,
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn sweep --config {input} --launcher {params.launcher}"
        " --launcher-options '{params.options}' --shards 1 --out {params.out} > {log} 2>&1"

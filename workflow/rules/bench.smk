# One job per shard. The job submits its shard through the configured launcher and waits.
# Rows land in shards/rows-shard<i>of<n>.jsonl, which is deliberately not a declared
# output: Snakemake deletes the outputs of a failed job, and a rerun must resume from the
# finished rows. The marker file says the shard completed.
rule bench_shard:
    input:
        f"{RESULTS}/plan/bench.yaml",
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

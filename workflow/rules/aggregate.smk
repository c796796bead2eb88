rule aggregate:
    input:
        expand(f"{RESULTS}/shards/shard{{i}}of{SHARDS}.done", i=range(SHARDS)),
    output:
        table=report(
            f"{RESULTS}/aggregate/rows.csv",
            caption="../report/rows.rst",
            category="Benchmark rows",
        ),
        jsonl=f"{RESULTS}/aggregate/rows.jsonl",
    log:
        f"{RESULTS}/logs/aggregate.log",
    params:
        rows=lambda wildcards, input: os.path.dirname(input[0]),
        out=lambda wildcards, output: os.path.dirname(output.table),
        shards=SHARDS,
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn aggregate --rows {params.rows} --out {params.out}"
        " --expect-shards {params.shards} > {log} 2>&1"

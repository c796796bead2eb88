# One job per shard. The job submits its shard through the configured launcher and waits.
# Rows land in shards/rows-shard<i>of<n>.jsonl, which is deliberately not a declared
# output: Snakemake deletes the outputs of a failed job, and a rerun must resume from the
# finished rows. The marker file says the shard completed. Every GPU step tees its output
# to its log and the terminal (stderr): job ids, states, pending reasons, log paths (tee -i:
# a Ctrl-C leaves it to carry the launcher's last lines, the jobs it cancelled).
rule bench_shard:
    input:
        rules.plan.output.bench,
    output:
        touch(f"{RESULTS}/shards/shard{{i}}of{SHARDS}.done"),
    log:
        f"{RESULTS}/logs/bench-shard{{i}}.log",
    params:
        launcher=launcher_args(),
        shards=SHARDS,
        out=lambda wildcards, output: os.path.dirname(output[0]),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn sweep --config {input:q} {params.launcher} --step bench"
        " --shards {params.shards} --only {wildcards.i} --out {params.out:q}"
        " 2>&1 | tee -i {log:q} >&2"


# Table 6: the schedule ladder, one job through the same launcher (a GPU node under SLURM).
rule ladder:
    input:
        f"{RESULTS}/plan/ladder.yaml",
    output:
        touch(f"{RESULTS}/ladder/ladder.done"),
    log:
        f"{RESULTS}/logs/ladder.log",
    params:
        launcher=launcher_args(),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn sweep --config {input:q} {params.launcher} --step ladder --shards 1"
        " --out {params.out:q} 2>&1 | tee -i {log:q} >&2"


# The shapes grids (tile and wave quantization), one job each through the same launcher.
rule shapes:
    input:
        f"{RESULTS}/plan/shapes-g{{g}}.yaml",
    output:
        touch(f"{RESULTS}/shapes/g{{g}}/shapes.done"),
    log:
        f"{RESULTS}/logs/shapes-g{{g}}.log",
    wildcard_constraints:
        g=r"\d+",
    params:
        launcher=launcher_args(),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn sweep --config {input:q} {params.launcher} --step shapes-g{wildcards.g}"
        " --shards 1 --out {params.out:q} 2>&1 | tee -i {log:q} >&2"

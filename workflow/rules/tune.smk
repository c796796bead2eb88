# Optional (tune.enabled): tune schedules (Table 5's winners, runners-up and sensitivity)
# as one job of the configured launcher, on a GPU node under SLURM or a free local GPU.
# Where the job finds no GPU the table records why and the study goes on. With
# tune.passes [fwd, fwd+bwd] the same job then tunes the backward into the same table.
rule tune:
    output:
        f"{RESULTS}/tune/schedule-table.json",
    log:
        f"{RESULTS}/logs/tune.log",
    params:
        state=lambda wildcards, output: os.path.join(os.path.dirname(output[0]), "state.jsonl"),
        stage=stage_args("tune"),
        launcher=launcher_args(),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn tune {params.launcher} {params.stage}"
        " --state {params.state:q} --out {output:q} 2>&1 | tee -i {log:q} >&2"

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
        space=config["tune"]["space"],
        state=lambda wildcards, output: os.path.join(os.path.dirname(output[0]), "state.jsonl"),
        passes=" ".join(config["tune"]["passes"]),
        restrict=tune_restrictions(),
        launcher=launcher_args(),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn tune {params.launcher} --pass {params.passes} --space {params.space}"
        " --state {params.state:q} --out {output:q} {params.restrict}"
        " 2>&1 | tee -i {log:q} >&2"

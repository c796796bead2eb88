# Optional (tune.enabled): tune schedules on this GPU (Table 5's winners, runners-up and
# sensitivity); the table can then be used with TILEDATTENTION_SCHEDULE_TABLE. Needs a GPU
# on the machine running the job.
rule tune:
    output:
        f"{RESULTS}/tune/schedule-table.json",
    log:
        f"{RESULTS}/logs/tune.log",
    params:
        space=config["tune"]["space"],
        state=lambda wildcards, output: os.path.join(os.path.dirname(output[0]), "state.jsonl"),
        restrict=tune_restrictions(),
    resources:
        gpu=1,
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn tune --space {params.space} --state {params.state} --out {output}"
        " {params.restrict} > {log} 2>&1"

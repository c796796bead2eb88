# Optional (model.enabled): the tiny Llama end to end, prefill, decode and training-step
# tokens/s (eager and compiled: model.phases) per attention implementation, as one job of
# the configured launcher (a GPU node under SLURM, a free local GPU). Where the job finds no GPU or no transformers its rows record
# why and the study goes on.
rule model:
    output:
        f"{RESULTS}/model/rows.jsonl",
    log:
        f"{RESULTS}/logs/model.log",
    params:
        stage=stage_args("model"),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=launcher_args(),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn model {params.stage} {params.launcher} --out {params.out:q}"
        " 2>&1 | tee -i {log:q} >&2"

# Optional (model.enabled): the tiny Llama end to end, prefill and decode tokens/s per
# attention implementation, as one job of the configured launcher (a GPU node under
# SLURM, a free local GPU). Where the job finds no GPU or no transformers its rows record
# why and the study goes on.
rule model:
    output:
        f"{RESULTS}/model/rows.jsonl",
    log:
        f"{RESULTS}/logs/model.log",
    params:
        m=MODEL,
        batches=" ".join(map(str, MODEL.batches)),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=launcher_args(),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn model --batches {params.batches} --prompt {params.m.prompt}"
        " --steps {params.m.steps} --reps {params.m.reps} --seed {params.m.seed}"
        " {params.launcher} --out {params.out:q} 2>&1 | tee -i {log:q} >&2"

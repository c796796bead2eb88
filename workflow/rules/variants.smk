# Optional (variants.enabled): each attention variant against FlexAttention, SDPA with a
# materialised mask and eager attention (the variants table and figure), as one job of the
# configured launcher (a GPU node under SLURM, a free local GPU). Where the job finds no GPU
# its rows record why and the study goes on.
rule variants:
    output:
        f"{RESULTS}/variants/rows.jsonl",
    log:
        f"{RESULTS}/logs/variants.log",
    params:
        stage=stage_args("variants"),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=launcher_args(),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn variants {params.stage} {params.launcher} --out {params.out:q}"
        " 2>&1 | tee -i {log:q} >&2"

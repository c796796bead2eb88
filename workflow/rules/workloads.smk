# Optional (workloads.enabled): packed variable-length training batches and a paged KV cache
# (decode, chunked prefill) against FlashAttention-4, FlexAttention, SDPA on the padded batch
# and PyTorch's varlen (the workloads tables), as one job of the configured launcher. Where
# the job finds no GPU the GPU methods' rows record why and the study goes on.
rule workloads:
    output:
        f"{RESULTS}/workloads/rows.jsonl",
    log:
        f"{RESULTS}/logs/workloads.log",
    params:
        stage=stage_args("workloads"),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=launcher_args(),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn workloads {params.stage} {params.launcher} --out {params.out:q}"
        " 2>&1 | tee -i {log:q} >&2"

# Nsight Compute on representative shapes, as one job of the configured launcher (a GPU
# node under SLURM, a free local GPU). Without ncu, a GPU or counter permission the
# summary records why and the rule still succeeds, so the study finishes everywhere; a
# job that fails (crash, timeout, cancel) fails the rule naming its id, state and log.
rule profile:
    output:
        report(
            f"{RESULTS}/profile/summary.md",
            caption="../report/profile.rst",
            category="6. Profiles",
        ),
    log:
        f"{RESULTS}/logs/profile.log",
    params:
        stage=stage_args("profile"),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=launcher_args(),
    resources:
        gpu=gpu_slots(),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn profile {params.stage} {params.launcher}"
        " --out {params.out:q} 2>&1 | tee -i {log:q} >&2"

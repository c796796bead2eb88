# Nsight Compute on representative shapes. Without ncu, a GPU or counter permission the
# summary records why and the rule still succeeds, so the study finishes everywhere.
rule profile:
    output:
        report(
            f"{RESULTS}/profile/summary.md",
            caption="../report/profile.rst",
            category="Profiles",
        ),
    log:
        f"{RESULTS}/logs/profile.log",
    params:
        shapes=" ".join(f"--shape {s}" for s in config["profile"]["shapes"]),
        methods=" ".join(config["profile"]["methods"]),
        p=config["profile"],
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=lambda wildcards: (
            f"--launcher {config['launcher']} --launcher-options '{launcher_options()}'"
            if config["profile"]["via_launcher"] else ""
        ),
    resources:
        gpu=1,
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn profile {params.shapes} --methods {params.methods}"
        " --clock-control {params.p[clock_control]} --warmup {params.p[warmup]}"
        " --tokens {params.p[tokens]} --width {params.p[width]} {params.launcher}"
        " --out {params.out} > {log} 2>&1"

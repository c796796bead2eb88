# The last rule: the Zenodo-ready bundle (directory + zip), then its verification.
rule bundle:
    input:
        unpack(aggregate_inputs),
        rows=rules.aggregate.output.jsonl,
        figures=rules.figures.output,
        manifest=rules.manifest.output,
        study=rules.plan.output.study,
        stages=bundle_stage_inputs(),
    output:
        sums=f"{RESULTS}/bundle/SHA256SUMS",
        zip=f"{RESULTS}/bundle.zip",
    log:
        f"{RESULTS}/logs/bundle.log",
    params:
        study=lambda wildcards, input: os.path.dirname(input.manifest[0]),
        out=lambda wildcards, output: os.path.dirname(output.sums),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn bundle create --study {params.study:q} --config {input.study:q}"
        " --out {params.out:q} > {log:q} 2>&1"


rule bundle_verify:
    input:
        rules.bundle.output.sums,
        zip=rules.bundle.output.zip,
    output:
        f"{RESULTS}/bundle.verified",
    log:
        f"{RESULTS}/logs/bundle-verify.log",
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn bundle verify {input.zip:q} > {output:q} 2> {log:q}"

# All rows into one table plus the summary tables; the study manifest; the figures.
rule aggregate:
    input:
        unpack(aggregate_inputs),
        manifest=f"{RESULTS}/manifest.json",  # the GPU whose peak the % peak @ clock use
    output:
        table=report(
            f"{RESULTS}/aggregate/rows.csv",
            caption="../report/rows.rst",
            category="5. Data",
        ),
        jsonl=f"{RESULTS}/aggregate/rows.jsonl",
        parquet=f"{RESULTS}/aggregate/rows.parquet",
        columns=f"{RESULTS}/aggregate/columns.md",
        headline=report(
            f"{RESULTS}/aggregate/tables/headline.csv",
            caption="../report/headline.rst",
            category="4. Tables",
        ),
        tables=report(
            expand(f"{RESULTS}/aggregate/tables/{{name}}.csv",
                   name=[t for t in TABLES if t != "headline"]),
            caption="../report/tables.rst",
            category="4. Tables",
        ),
    log:
        f"{RESULTS}/logs/aggregate.log",
    params:
        rows=lambda wildcards, input: os.path.dirname(input.shards[0]),
        out=lambda wildcards, output: os.path.dirname(output.table),  # tables/ below it
        shards=SHARDS,
        extra=study_extras,
        stage_rows=aggregate_rows_arg,
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn aggregate --rows {params.rows:q} --out {params.out:q}"
        " --manifest {input.manifest:q}"
        " --expect-shards {params.shards} {params.extra} {params.stage_rows} > {log:q} 2>&1"


rule figures:
    input:
        unpack(aggregate_inputs),
        rows=rules.aggregate.output.jsonl,
        manifest=f"{RESULTS}/manifest.json",  # the GPU every title names, its peaks
    output:
        # One report entry per figure, each with its own caption; the key ones first.
        **{name: report(f"{RESULTS}/figures/{name}.png", caption=figure_caption(name),
                        category=figure_category(name)) for name in FIGURES},
    log:
        f"{RESULTS}/logs/figures.log",
    params:
        out=lambda wildcards, output: os.path.dirname(output[0]),
        extra=study_extras,
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn figures --rows {input.rows:q} --out {params.out:q}"
        " --manifest {input.manifest:q} {params.extra}"
        " > {log:q} 2>&1"


# The report's own pages: the landing text includes landing.html (what was and was not
# measured, the headline, the status, Table 4); each table is also a page of its own.
rule report_pages:
    input:
        rows=rules.aggregate.output.jsonl,
        headline=rules.aggregate.output.headline,
        manifest=f"{RESULTS}/manifest.json",
    output:
        landing=f"{RESULTS}/report/landing.html",
        **{name: report(f"{RESULTS}/report/{name}.html", caption="../report/pages.rst",
                        category="1. Headline") for name in REPORT_PAGES},
    log:
        f"{RESULTS}/logs/report_pages.log",
    params:
        tables=lambda wildcards, input: os.path.dirname(input.headline),
        out=lambda wildcards, output: os.path.dirname(output.landing),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn report-pages --rows {input.rows:q} --tables {params.tables:q}"
        " --manifest {input.manifest:q} --out {params.out:q} > {log:q} 2>&1"


rule manifest:
    input:
        unpack(aggregate_inputs),
        study=rules.plan.output.study,
    output:
        f"{RESULTS}/manifest.json",
    log:
        f"{RESULTS}/logs/manifest.log",
    params:
        runs=lambda wildcards, input: sorted(
            {os.path.dirname(p)
             for k in ("shards", *ROWS_STAGES)
             if k in input.keys()
             for p in ([input[k]] if isinstance(input[k], str) else input[k])}
        ),
        image=lambda wildcards: (
            f"--image {shlex.quote(config['launcher_options']['image'])}"
            if config["launcher_options"].get("image") else ""
        ),
    conda:
        "../envs/tiledattn.yaml"
    shell:
        "tiledattn manifest --runs {params.runs:q} --config {input.study:q} {params.image}"
        " --out {output:q} > {log:q} 2>&1"

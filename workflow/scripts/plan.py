"""Write a benchmark config for the jobs (and, for the study plan, the effective study
config: the config file with every --config override applied, as the bundle records it).
common.smk validated both before any job; this only writes them."""

import yaml

smk = snakemake  # noqa: F821 (injected by Snakemake)
with open(smk.output[0], "w") as f:
    yaml.safe_dump(smk.params.bench, f, sort_keys=False)
if hasattr(smk.output, "study"):  # a Namedlist: `in` would test the paths
    with open(smk.output.study, "w") as f:
        yaml.safe_dump(dict(smk.config), f, sort_keys=False)
with open(smk.log[0], "w") as f:
    f.write(f"{smk.params.points} points\n")

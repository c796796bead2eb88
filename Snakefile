# The TiledAttention study: plan the grid into shards, run each shard through a launcher
# (local processes, SLURM via submitit, or in-process), optionally tune, and aggregate.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    input:
        all_outputs(),

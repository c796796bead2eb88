# The TiledAttention study: plan the grid into shards, run each shard through a launcher
# (local processes, SLURM via submitit, or in-process), optionally tune, run the schedule
# ladder and the profiles, aggregate into tables and figures, and bundle for publication.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/bundle.smk"


rule all:
    input:
        all_outputs(),

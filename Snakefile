# The TiledAttention study: plan the grid into shards; run every GPU step (bench shards,
# tuning, the schedule ladder, the profiles) as a job of the configured launcher (local
# GPU processes, SLURM via submitit, or in-process); aggregate into tables and figures in
# this process, and bundle for publication.
from snakemake.utils import min_version

min_version("9.0")


# The paper's study unless the command line names a config: a --configfile replaces it
# rather than being merged over it, so a smaller study inherits none of its keys.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/plan.smk"


# One rule file per GPU stage, from tiledattention.stages' registry (common.smk imports it).
for _rule_file in STAGE_RULE_FILES:

    include: f"workflow/rules/{_rule_file}"


include: "workflow/rules/aggregate.smk"
include: "workflow/rules/bundle.smk"


rule all:
    input:
        all_outputs(),

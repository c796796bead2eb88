"""``python -m tiledattention.stages``: the generated sections of the workflow's config
schema, as the workflow adds them to workflow/schemas/config.schema.yaml's keys at its start
(``study_schema``)."""

import yaml

from . import schema

print(yaml.safe_dump(schema(), sort_keys=False, width=90, default_flow_style=None), end="")

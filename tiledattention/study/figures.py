"""Old path of presentation.figures, kept for one reader: the committed reference bundles'
workflow snapshots (results/reference/*/workflow-snapshot.zip, workflow/rules/common.smk)
import ``tiledattention.study.figures`` and call ``names``. New code imports
``tiledattention.study.presentation.figures``."""

from .presentation.figures import names

__all__ = ["names"]

"""Old path of presentation.tables, kept for one reader: the committed reference bundles'
workflow snapshots (results/reference/*/workflow-snapshot.zip, workflow/rules/common.smk)
import ``tiledattention.study.tables`` and read ``NAMES``. New code imports
``tiledattention.study.presentation.tables``."""

from .presentation.tables import NAMES

__all__ = ["NAMES"]

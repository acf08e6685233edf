"""Every SessionRunHook of mxrec: eviction, table statistics, incremental checkpoints, the
graph modifier and mx_rec's string-op check.

mx_rec's paths of the hooks (`mxrec.core.feature_process.EvictHook`,
`mxrec.graph.modifier.GraphModifierHook`, `mxrec.graph.acg_push_ops`) reach these classes
(mxrec.compat).
"""

from mxrec.hooks.acg_push_ops import ACGPushOpsToDatasetHook
from mxrec.hooks.evict import EvictHook
from mxrec.hooks.graph_modifier import GraphModifierHook
from mxrec.hooks.incremental_checkpoint import IncrementalCheckpointHook
from mxrec.hooks.stats import TableStatsHook

__all__ = ["ACGPushOpsToDatasetHook", "EvictHook", "GraphModifierHook",
           "IncrementalCheckpointHook", "TableStatsHook"]

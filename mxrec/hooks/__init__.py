"""Training hooks: eviction, table statistics, incremental checkpoints."""

from mxrec.hooks.checkpoint import IncrementalCheckpointHook
from mxrec.hooks.evict import EvictHook
from mxrec.hooks.stats import TableStatsHook

__all__ = ["EvictHook", "IncrementalCheckpointHook", "TableStatsHook"]

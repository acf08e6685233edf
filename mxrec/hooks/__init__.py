"""Training hooks: eviction and table statistics."""

from mxrec.hooks.evict import EvictHook
from mxrec.hooks.stats import TableStatsHook

__all__ = ["EvictHook", "TableStatsHook"]

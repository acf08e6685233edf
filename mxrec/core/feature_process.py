"""mx_rec's `mx_rec.core.feature_process`: `EvictHook`, which lives with the hooks
(`mxrec.hooks.evict`)."""

from mxrec.hooks.evict import EvictHook

__all__ = ["EvictHook"]

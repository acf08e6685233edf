"""EvictHook's old path; the hook lives in mxrec.core.feature_process (mx_rec's path)."""

from mxrec.core.feature_process import EvictHook

__all__ = ["EvictHook"]

"""IncrementalCheckpointHook: full and delta checkpoints on a timer, restore at start.

The hook drives mxrec's Saver and is defined beside it (`mxrec.saver.checkpoint`, also its
mx_rec path); this is its path among the hooks.
"""

from mxrec.saver.checkpoint import IncrementalCheckpointHook  # noqa: F401 (re-exported)

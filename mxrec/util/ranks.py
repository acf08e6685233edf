"""This process's rank among the training processes, for the layers below `mxrec.distributed`.

One process is rank 0 of 1. `mxrec.distributed.communication` fills the registry's `RANKS`
slot (mxrec.util.registry) with its own queries when it is imported (`init()` imports it), so
the layers below the wing read the cluster it set up without importing it. They read the rank
size only to name a setting in a refusal, or as data (a checkpoint file per rank); what several
ranks do differently is the wing's (`mxrec.core.wing`).
"""

from mxrec.util import registry


def get_rank_id() -> int:
    """This process's rank (0 in single-process training)."""
    queries = registry.provided(registry.RANKS)
    return 0 if queries is None else queries[0]()


def get_rank_size() -> int:
    """The number of training processes (1 in single-process training)."""
    queries = registry.provided(registry.RANKS)
    return 1 if queries is None else queries[1]()

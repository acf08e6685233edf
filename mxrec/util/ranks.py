"""This process's rank among the training processes, for the layers below `mxrec.distributed`.

One process is rank 0 of 1. `mxrec.distributed.communication` registers its own queries when
it is imported (`init()` imports it), so the layers below the wing read the cluster it set up
without importing it. They read the rank size only to name a setting in a refusal, or as
data (a checkpoint file per rank); what several ranks do differently is the wing's
(`mxrec.core.wing`).
"""

from typing import Callable, Optional, Tuple

_QUERIES: Optional[Tuple[Callable[[], int], Callable[[], int]]] = None


def register(rank_id: Callable[[], int], rank_size: Callable[[], int]) -> None:
    """Called by mxrec.distributed.communication: where the rank and size come from."""
    global _QUERIES
    _QUERIES = (rank_id, rank_size)


def get_rank_id() -> int:
    """This process's rank (0 in single-process training)."""
    return 0 if _QUERIES is None else _QUERIES[0]()


def get_rank_size() -> int:
    """The number of training processes (1 in single-process training)."""
    return 1 if _QUERIES is None else _QUERIES[1]()

"""mxrec.keras on several ranks: this process's place among them, and the dense weights
made equal on every rank.

Each rank builds the same model; its tables are sharded by ID (or replicated, is_dp=True)
and need nothing here. Its dense weights are the rank's own variables: unless every rank
draws them alike (a seeded initializer, `tf.keras.utils.set_random_seed` with the same seed
on every rank) or restores them from one checkpoint, call `broadcast_weights(model)` once
after building the model, on every rank, so that every rank starts from rank 0's.
"""

from typing import Tuple

import tensorflow as tf

from mxrec.distributed import communication
from mxrec.keras import _compat


def rank_and_size() -> Tuple[int, int]:
    """(this process's rank, the number of ranks): (0, 1) in one process."""
    return communication.get_rank_id(), communication.get_rank_size()


def broadcast_weights(model) -> int:
    """Sets every dense weight of `model` (its tables left out: each rank holds its own
    rows) to rank 0's value, in one all-reduce; collective: every rank calls it, eagerly,
    with the same model. Nothing happens in one process. Returns how many weights were set.

    Raises:
        RuntimeError: called inside a tf.function (it assigns eagerly).
    """
    if tf.inside_function():
        raise RuntimeError("mxrec.keras.broadcast_weights: call it eagerly (after building "
                           "the model, before training), not inside a tf.function")
    rank, size = rank_and_size()
    weights = [_compat.tf_variable(w) for w in model.weights if _compat.table_of(w) is None]
    if size == 1 or not weights:
        return 0
    keep = 1.0 if rank == 0 else 0.0
    by_dtype = {}
    for weight in weights:
        by_dtype.setdefault(weight.dtype, []).append(weight)
    for dtype, group in by_dtype.items():
        flat = tf.concat([tf.reshape(w, [-1]) * tf.cast(keep, dtype) for w in group], axis=0)
        total = communication.allreduce(flat, "sum")
        pieces = tf.split(total, [int(w.shape.num_elements()) for w in group])
        for weight, piece in zip(group, pieces):
            weight.assign(tf.reshape(piece, weight.shape))
    return len(weights)

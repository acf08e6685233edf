"""mx_rec's `train_params_config.get_target_batch(is_training)` for the graph modifier
(mxrec.graph.modifier registers `get_target_batch` with its own functions)."""

import tensorflow as tf

from mxrec.core import target_batch


def get_target_batch(is_training: bool, get_initializer, rewritten_tensor):
    """The `batch=` of this mode's modify_graph lookups, its tensors swapped for the
    rewritten iterator's outputs (the modifier's `rewritten_tensor`).

    Raises:
        RuntimeError: the default graph was not rewritten for that mode, or its lookups
            were given no `batch=`.
    """
    graph = tf.compat.v1.get_default_graph()
    get_initializer(is_training, graph)  # raises unless that mode was rewritten
    batch = target_batch.batch_of(graph, is_training)
    if batch is None:
        raise RuntimeError(
            f"get_target_batch({is_training}): no sparse_lookup(..., modify_graph=True, "
            f"is_train={is_training}) of this graph was given batch=; pass the iterator's "
            "get_next() as batch=, or fetch mxrec.graph.modifier.rewritten_tensor(tensor)")
    return rewritten_tensor(batch, graph)

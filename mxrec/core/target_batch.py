"""The `batch=` of modify_graph lookups, per graph and mode, for mx_rec's
`ConfigInitializer.get_instance().train_params_config.get_target_batch(is_training)`.

The graph modifier replaces an iterator's get_next; mx_rec scripts then fetch the
rewritten iterator's batch (its labels, say) through get_target_batch. The graph layer
answers it (mxrec.graph.modifier.get_target_batch) from what sparse_lookup remembers in the
graph's state (`GraphState.target_batches`, dropped with the graph).
"""

from typing import Optional

import tensorflow as tf

from mxrec.core.graph_state import existing_state, graph_state


def remember(graph: tf.Graph, is_train: bool, batch) -> None:
    """Keeps the first `batch=` a modify_graph lookup of this mode was given in `graph`."""
    if batch is not None:
        graph_state(graph).target_batches.setdefault(bool(is_train), batch)


def batch_of(graph: tf.Graph, is_train: bool) -> Optional[object]:
    state = existing_state(graph)
    return None if state is None else state.target_batches.get(bool(is_train))

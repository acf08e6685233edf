"""The `batch=` of modify_graph lookups, per graph and mode, for mx_rec's
`ConfigInitializer.get_instance().train_params_config.get_target_batch(is_training)`.

The graph modifier replaces an iterator's get_next; mx_rec scripts then fetch the
rewritten iterator's batch (its labels, say) through get_target_batch. The graph layer
answers it (mxrec.graph.target_batch) from what sparse_lookup remembers here.
"""

import weakref
from typing import Dict, Optional

import tensorflow as tf

# graph -> {is_train: batch}; dropped with the graph.
_BATCHES: "weakref.WeakKeyDictionary[tf.Graph, Dict[bool, object]]" = (
    weakref.WeakKeyDictionary())


def remember(graph: tf.Graph, is_train: bool, batch) -> None:
    """Keeps the first `batch=` a modify_graph lookup of this mode was given in `graph`."""
    if batch is not None:
        _BATCHES.setdefault(graph, {}).setdefault(bool(is_train), batch)


def batch_of(graph: tf.Graph, is_train: bool) -> Optional[object]:
    return _BATCHES.get(graph, {}).get(bool(is_train))

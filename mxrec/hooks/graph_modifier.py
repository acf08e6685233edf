"""GraphModifierHook: the graph modifier (mxrec.graph.modifier) in an Estimator's hooks.

mx_rec's path of the hook, `mxrec.graph.modifier.GraphModifierHook`, reaches this class
(mxrec.compat).
"""

from typing import Dict, List, Optional

import tensorflow as tf

from mxrec.graph import modifier


class GraphModifierHook(tf.compat.v1.train.SessionRunHook):
    """Rewrites an Estimator's graph and starts the rewritten iterators.

    Add it to the hooks of `train`, `evaluate`, `predict`, or to the
    TrainSpec and EvalSpec of `train_and_evaluate`; build the lookups in
    `model_fn` with `sparse_lookup(..., modify_graph=True, is_train=mode == TRAIN)`.

    Example:
        >>> est.train(input_fn, hooks=[GraphModifierHook()], max_steps=100)
    """

    def __init__(self, dump_graph: bool = False, modify_graph: bool = True,
                 dump_dir: str = modifier.DEFAULT_DUMP_DIR):
        self._dump_graph = dump_graph
        self._modify_graph = modify_graph
        self._dump_dir = dump_dir
        self._initializers: List[tf.Operation] = []
        self._graph: Optional[tf.Graph] = None

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self._graph = graph
        if self._modify_graph:
            modifier.modify_graph_and_start_emb_cache(graph, dump_graph=self._dump_graph,
                                                      dump_dir=self._dump_dir)
        self._initializers = modifier.rewritten_initializers(graph)

    def after_create_session(self, session, coord):
        del coord
        if self._initializers:
            session.run(self._initializers)

    def before_run(self, run_context):
        """Swaps replaced get_next outputs in the caller's fetches for their replacements.

        An Estimator fetches its predictions dict as model_fn returned it, and a model_fn
        may put a raw feature there (mx_rec's demo returns its label). The dict (and lists
        in it) are changed in place, so the fetch reads the step's own batch; a fetch held
        in a tuple or alone cannot be changed and still fails with the message that names
        `rewritten_tensor`.
        """
        replacements = modifier.replacements(self._graph) if self._graph is not None else {}
        if replacements:
            _swap_in_place(run_context.original_args.fetches, replacements)
        return None


def _swap_in_place(fetches, replacements: Dict[str, tf.Tensor]) -> None:
    """Replaces, inside dicts and lists (recursively), tensors named in `replacements`."""
    if isinstance(fetches, dict):
        keys = list(fetches)
    elif isinstance(fetches, list):
        keys = range(len(fetches))
    else:
        return
    for key in keys:
        value = fetches[key]
        if isinstance(value, tf.Tensor) and value.name in replacements:
            fetches[key] = replacements[value.name]
        else:
            _swap_in_place(value, replacements)

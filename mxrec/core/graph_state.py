"""What mxrec keeps per `tf.Graph`, in one object reached through the graph.

The state is an attribute of the graph itself, not a value of a module-level map: the
tensors it holds refer back to their graph, so a map from graph to state would keep every
graph alive (a `WeakKeyDictionary` entry whose value reaches its key is never dropped). Held
by the graph, the state and the graph form one cycle that Python's collector frees as soon
as nothing else holds the graph (an Estimator builds a graph per `train`/`evaluate`). What a
higher layer provides for one graph (the serving export's lookup) is kept on the graph the same
way, by `mxrec.util.registry`.
"""

from typing import Callable, Dict, List, Optional, Set

_ATTRIBUTE = "_mxrec_graph_state"


class GraphState:
    """mxrec's state of one graph.

    Attributes:
        tables: {table name: the table created in this graph} (the latest of a name).
        modify_graph_lookups: the `LookupRecord`s of modify_graph=True lookups, in order.
        last_key_stage: {(key-stage chain, is_train): the latest key-stage op}; a table's
            next key stage runs after it (`SparseEmbedding.key_stage_dependency`).
        tier_swap_chain: {(table key, component): the latest swap of a tiered table}.
        tier_lookups: {table key: the training lookups of a tiered table in the graph}.
        modifier: what the graph modifier rewired (mxrec.graph.modifier), or None.
        default_savers: {(init() prefix, directory): the Saver save_persistables made}.
        target_batches: {is_train: the first `batch=` a modify_graph lookup of that mode was
            given} (mx_rec's get_target_batch).
        shared: {key: a tensor built once and read by every lookup that asks for the same
            key} (`shared_tensor`: a batch time, its all-reduce across the ranks).
        distinct_rows: names of the tensors of table rows known to hold no row twice (a
            training lookup's unique rows, unpadded), which a table's gather reads; the hash
            optimizers update such rows without summing duplicates first
            (mxrec.optimizers.base.distinct_indices).
    """

    def __init__(self):
        self.tables: Dict[str, object] = {}
        self.modify_graph_lookups: List[object] = []
        self.last_key_stage: Dict[object, object] = {}
        self.tier_swap_chain: Dict[tuple, object] = {}
        self.tier_lookups: Dict[str, int] = {}
        self.modifier = None
        self.default_savers: Dict[tuple, object] = {}
        self.target_batches: Dict[bool, object] = {}
        self.shared: Dict[tuple, object] = {}
        self.distinct_rows: Set[str] = set()


def graph_state(graph) -> GraphState:
    """The state of `graph`, made on first use."""
    state = getattr(graph, _ATTRIBUTE, None)
    if state is None:
        state = GraphState()
        setattr(graph, _ATTRIBUTE, state)
    return state


def existing_state(graph) -> Optional[GraphState]:
    """The state of `graph` if mxrec made one, else None (nothing is created)."""
    return getattr(graph, _ATTRIBUTE, None)


def shared_tensor(graph, key: tuple, make: Callable[[], object]):
    """The tensor `make()` built for `key` in `graph`, built once: a later call with the same
    key gets the same tensor, unless it is made in another control-flow context (inside a
    tf.cond or a while loop the earlier tensor cannot be read), where it builds its own."""
    state = graph_state(graph)
    context = graph._get_control_flow_context()  # noqa: SLF001 (no public accessor)
    found = state.shared.get(key)
    if found is not None and found[0] is context:
        return found[1]
    tensor = make()
    if found is None:
        state.shared[key] = (context, tensor)
    return tensor

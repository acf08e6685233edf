"""Finds the dataset iterator behind a lookup's IDs, and the ops in between.

The graph modifier needs, for every lookup built with `modify_graph=True`:
the `IteratorGetNext` op whose outputs the IDs are computed from, the
iterator's kind and dataset, and the preprocessing ops between the two (cast,
reshape, `tf.strings.to_number`, slicing, ...), which it replays inside the
input pipeline.

    IteratorGetNext:k ─► [preprocessing ops] ─► record.ids ─► key stage
"""

import dataclasses
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

_GET_NEXT_TYPES = ("IteratorGetNext", "IteratorGetNextSync")
# Ops whose value the input pipeline cannot reproduce: fed or stored in the session.
_SESSION_STATE_TYPES = (
    "Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
    "VariableV2", "Variable", "VarHandleOp", "ReadVariableOp",
)
INITIALIZABLE = "initializable"
ONE_SHOT = "one_shot"


@dataclasses.dataclass
class IteratorSource:
    """One dataset iterator that feeds lookups.

    Attributes:
        get_next: the IteratorGetNext op.
        iterator: the op that makes the iterator resource.
        kind: INITIALIZABLE or ONE_SHOT.
        dataset_variant: the dataset of an initializable iterator (MakeIterator's input).
        dataset_factory: the function attr of a one-shot iterator that makes its dataset.
    """

    get_next: tf.Operation
    iterator: tf.Operation
    kind: str
    dataset_variant: Optional[tf.Tensor] = None
    dataset_factory: Optional[object] = None


@dataclasses.dataclass
class IdsSource:
    """How one lookup's key-stage inputs (IDs, timestamp) come from an iterator's outputs.

    Attributes:
        get_next: the IteratorGetNext op the IDs come from.
        ops: the ops between its outputs and the key stage's inputs, in graph order.
        used_outputs: indexes of the get_next outputs the IDs depend on.
    """

    get_next: tf.Operation
    ops: List[tf.Operation]
    used_outputs: List[int]


def _describe(lookup_name: str) -> str:
    return f"sparse_lookup {lookup_name!r}"


def trace_ids(tensors: List[tf.Tensor], lookup_name: str) -> IdsSource:
    """Walks back from `tensors` (a key stage's inputs) to the IteratorGetNext they come from.

    Raises:
        ValueError: the inputs depend on a placeholder, a variable or other
            session state, on no iterator, or on more than one iterator.
    """
    get_nexts: Dict[str, tf.Operation] = {}
    used = set()
    seen = set()
    ops: List[tf.Operation] = []
    stack = []
    for tensor in tensors:
        if tensor.op.type in _GET_NEXT_TYPES:
            used.add(tensor.value_index)
        stack.append(tensor.op)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _GET_NEXT_TYPES:
            get_nexts[op.name] = op
            continue
        if op.type in ("IteratorGetNextAsOptional", "OptionalGetValue"):
            raise ValueError(
                f"{_describe(lookup_name)}: its IDs come from {op.type} op {op.name!r}; the "
                "graph modifier supports iterator.get_next() only. Use get_next(), or "
                "sparse_lookup(..., modify_graph=False)")
        if op.type in _SESSION_STATE_TYPES or any(t.dtype == tf.resource for t in op.inputs):
            raise ValueError(
                f"{_describe(lookup_name)}: its IDs depend on {op.type} op {op.name!r}, which the "
                "input pipeline cannot compute. With modify_graph=True the IDs (and the "
                "timestamp) must be computed from a tf.data iterator's get_next() by stateless "
                "ops only; feed the IDs from tf.data, or use sparse_lookup(..., "
                "modify_graph=False)")
        ops.append(op)
        for tensor in op.inputs:
            if tensor.op.type in _GET_NEXT_TYPES:
                used.add(tensor.value_index)
            stack.append(tensor.op)
    if not get_nexts:
        raise ValueError(
            f"{_describe(lookup_name)}: its IDs ({tensors[0].name}) do not come from a tf.data "
            "iterator. With modify_graph=True the IDs must be computed from "
            "iterator.get_next() of a tf.compat.v1.data initializable or one-shot iterator; "
            "feed the IDs from tf.data, or use sparse_lookup(..., modify_graph=False)")
    if len(get_nexts) > 1:
        raise ValueError(
            f"{_describe(lookup_name)}: its IDs combine the outputs of several iterators "
            f"({sorted(get_nexts)}); the graph modifier needs the IDs of one lookup to come from "
            "one iterator. Zip the datasets into one, or use modify_graph=False")
    get_next = next(iter(get_nexts.values()))
    order = {op.name: i for i, op in enumerate(tensors[0].graph.get_operations())}
    ops.sort(key=lambda op: order[op.name])
    return IdsSource(get_next=get_next, ops=ops, used_outputs=sorted(used))


def find_iterator(get_next: tf.Operation) -> IteratorSource:
    """The iterator behind `get_next` and where its dataset comes from.

    Raises:
        ValueError: an iterator kind the modifier cannot rebuild.
    """
    iterator = get_next.inputs[0].op
    if iterator.type == "OneShotIterator":
        return IteratorSource(get_next=get_next, iterator=iterator, kind=ONE_SHOT,
                              dataset_factory=iterator.get_attr("dataset_factory"))
    if iterator.type in ("IteratorV2", "Iterator"):
        makers = [op for op in iterator.graph.get_operations()
                  if op.type == "MakeIterator" and op.inputs[1].op is iterator]
        if len(makers) == 1:
            return IteratorSource(get_next=get_next, iterator=iterator, kind=INITIALIZABLE,
                                  dataset_variant=makers[0].inputs[0])
        what = ("has no initializer (MakeIterator)" if not makers else
                f"has {len(makers)} initializers (a reinitializable iterator)")
        raise ValueError(
            f"iterator {iterator.name!r} ({iterator.type}) behind {get_next.name!r} {what}; the "
            "graph modifier supports tf.compat.v1.data.make_initializable_iterator and "
            "make_one_shot_iterator, one dataset per iterator")
    raise ValueError(
        f"iterator op {iterator.name!r} of type {iterator.type} behind {get_next.name!r} is not "
        "supported by the graph modifier (supported: tf.compat.v1.data."
        "make_initializable_iterator, make_one_shot_iterator); use one of those, or "
        "sparse_lookup(..., modify_graph=False)")


def output_specs(get_next: tf.Operation) -> Tuple[tf.TensorSpec, ...]:
    """The flat element spec of an iterator: one TensorSpec per get_next output."""
    types = get_next.get_attr("output_types")
    shapes = get_next.get_attr("output_shapes")
    return tuple(tf.TensorSpec(tf.TensorShape(s), tf.as_dtype(t)) for s, t in zip(shapes, types))


def subgraph_def(source: IdsSource, graph: tf.Graph) -> tf.compat.v1.GraphDef:
    """The preprocessing ops as a GraphDef for `tf.import_graph_def`.

    Control inputs, devices and colocation are dropped: the copy runs inside a
    dataset function, where only the data flow from the element matters.
    """
    graph_def = tf.compat.v1.GraphDef()
    graph_def.versions.CopyFrom(graph.graph_def_versions)
    needs_library = False
    for op in source.ops:
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        node.device = ""
        kept = [name for name in node.input if not name.startswith("^")]
        del node.input[:]
        node.input.extend(kept)
        if "_class" in node.attr:
            del node.attr["_class"]
        needs_library |= any(value.HasField("func") for value in node.attr.values())
    if needs_library:
        graph_def.library.CopyFrom(graph.as_graph_def().library)
    return graph_def

"""mx_rec's `ACGPushOpsToDatasetHook`: string parsing of the IDs runs in the input pipeline.

mx_rec's hook moves the `StringSplit` / `StringToNumber` ops that read the
iterator's output out of the step and into a `dataset.map`. In mxrec the graph
modifier already does this for every op between `get_next()` and a
`sparse_lookup(..., modify_graph=True)` (it replays that preprocessing inside the
pipeline, ahead of the step), so this hook checks, when the graph is built, that
each such string op of the graph feeds a modify_graph lookup, and refuses one that
does not (it would stay in the step), naming it. Put it before
`GraphModifierHook()` in the hook list, as mx_rec's examples do.

mx_rec's path of this module is `mxrec.graph.acg_push_ops` (mxrec.compat).

Example:
    >>> hooks = [ACGPushOpsToDatasetHook(dump_graph=False), GraphModifierHook()]
    >>> estimator.train(input_fn, hooks=hooks)
"""

import os
from typing import Set

import tensorflow as tf

from mxrec.core.planners import modify_graph_lookups

PUSHED_OP_TYPES = frozenset(["StringSplit", "StringSplitV2", "StringToNumber"])
DUMP_DIR = "export_graph"


def _upstream_ops(tensors) -> Set[tf.Operation]:
    seen: Set[tf.Operation] = set()
    stack = [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op in seen or op.type == "IteratorGetNext":
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
    return seen


def _reads_iterator(op: tf.Operation) -> bool:
    stack, seen = [op], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.type == "IteratorGetNext":
            return True
        stack.extend(t.op for t in current.inputs)
    return False


def check_string_ops(graph: tf.Graph) -> Set[tf.Operation]:
    """The string ops of `graph` that read an iterator, each checked to be ID preprocessing
    of a modify_graph lookup (which the graph modifier runs in the pipeline).

    Raises:
        NotImplementedError: such an op that feeds no modify_graph lookup, naming it.
    """
    pushed = _upstream_ops([record.ids for record in modify_graph_lookups(graph)])
    found = set()
    for op in graph.get_operations():
        if op.type not in PUSHED_OP_TYPES or not _reads_iterator(op):
            continue
        if op not in pushed:
            raise NotImplementedError(
                f"ACGPushOpsToDatasetHook: {op.type} op {op.name!r} reads the iterator but feeds "
                "no sparse_lookup(..., modify_graph=True); mxrec moves string parsing into the "
                "input pipeline only as the ID preprocessing of modify_graph lookups. Parse it "
                "in dataset.map, or look its IDs up with modify_graph=True")
        found.add(op)
    return found


class ACGPushOpsToDatasetHook(tf.compat.v1.train.SessionRunHook):
    """Checks that the iterator-reading string ops run in the input pipeline (see module).

    Args:
        dump_graph: write the graph as built to export_graph/before_push_graph.pbtxt.
    """

    def __init__(self, dump_graph: bool = False):
        if not isinstance(dump_graph, bool):
            raise TypeError(f"ACGPushOpsToDatasetHook: dump_graph must be a bool, got "
                            f"{dump_graph!r}")
        self._dump_graph = dump_graph
        self.pushed_ops: Set[tf.Operation] = set()

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        if self._dump_graph:
            os.makedirs(DUMP_DIR, exist_ok=True)
            tf.io.write_graph(graph.as_graph_def(), DUMP_DIR, "before_push_graph.pbtxt")
        self.pushed_ops = check_string_ops(graph)

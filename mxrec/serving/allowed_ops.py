"""The op types a served graph may contain: what mxrec's exports write, and nothing that
reaches a file, a process or the network.

mxrec's exports (`mxrec.export.saved_model.export_saved_model` and `apply_delta`, the
streaming trainer's versions, `mxrec.keras.export_serving`) write core TensorFlow compute
ops, resource variables, hash tables and the SavedModel saver's checkpoint ops. A version
whose graph (or a function of its library) holds any other op type is refused, naming it:
a graph that reads or writes files (ReadFile, WriteFile, MatchingFiles), runs Python
(PyFunc), prints to a stream (PrintV2) or maps memory (ImmutableConst) is not an export.

The checkpoint ops (RestoreV2, SaveV2, MergeV2Checkpoints) are in every SavedModel, for
the loader to restore the variables: they may not be reached from a signature's tensors
(a request never touches a file), and the restore op may reach no SaveV2.

Example:
    >>> check_graph(meta_graph_def, "/serving/ctr/12")      # raises ForbiddenOpError
    >>> allowed(extra=["Erfc"])                               # a custom model's op
"""

import re
from typing import FrozenSet, Iterable, Mapping

import tensorflow as tf

from mxrec.serving.versions import DamagedVersionError

# Checkpoint file I/O: the loader's restore path only, never a request's.
CHECKPOINT_IO_OPS = frozenset({"RestoreV2", "SaveV2", "MergeV2Checkpoints"})

_PLUMBING = {"Const", "Placeholder", "PlaceholderWithDefault", "Identity", "IdentityN",
             "NoOp", "StopGradient", "EnsureShape", "Assert", "CheckNumerics"}
_VARIABLES = {"VarHandleOp", "ReadVariableOp", "AssignVariableOp", "VarIsInitializedOp",
              "ResourceGather", "ResourceGatherNd", "DestroyResourceOp"}
_TABLES = {"HashTableV2", "MutableHashTableV2", "LookupTableFindV2", "LookupTableImportV2",
           "LookupTableSizeV2"}
_SAVER = CHECKPOINT_IO_OPS | {"ShardedFilename", "StringJoin", "StaticRegexFullMatch"}
# Variable initialisers the export keeps in the graph (never run by a predictor).
_INITIALIZERS = {"RandomUniform", "RandomUniformInt", "RandomStandardNormal",
                 "TruncatedNormal"}
_MATH = {"Abs", "Add", "AddV2", "AddN", "Sub", "Mul", "Div", "DivNoNan", "RealDiv",
         "FloorDiv", "FloorMod", "Mod", "TruncateDiv", "Maximum", "Minimum", "Neg",
         "Reciprocal", "Square", "Sqrt", "Rsqrt", "Exp", "Expm1", "Log", "Log1p", "Pow",
         "Sign", "Floor", "Ceil", "Round", "Rint", "Cast", "ClipByValue",
         "SquaredDifference", "Erf", "IsFinite", "IsNan", "IsInf", "BitwiseAnd", "BitwiseOr",
         "BitwiseXor", "LeftShift", "RightShift", "Equal", "NotEqual", "Less", "LessEqual",
         "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "Select",
         "SelectV2", "Sum", "Mean", "Max", "Min", "Prod", "Any", "All", "ArgMax", "ArgMin",
         "Cumsum", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"}
_NN = {"BiasAdd", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus", "Softsign",
       "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "FusedBatchNormV3", "TopKV2"}
_ARRAY = {"Reshape", "Shape", "ShapeN", "Size", "Rank", "ExpandDims", "Squeeze", "ConcatV2",
          "Pack", "Unpack", "Split", "SplitV", "Slice", "StridedSlice", "Gather", "GatherV2",
          "GatherNd", "Tile", "Fill", "ZerosLike", "OnesLike", "BroadcastTo",
          "BroadcastArgs", "Range", "Transpose", "Pad", "PadV2", "OneHot", "ReverseV2",
          "Where", "Unique", "Bucketize", "UnsortedSegmentSum", "UnsortedSegmentMax",
          "UnsortedSegmentMin", "UnsortedSegmentProd", "SegmentSum", "SegmentMean",
          "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN"}
# The raw signature's hashing of strings (mxrec.streaming.parsers).
_STRINGS = {"StringToHashBucketFast", "Fingerprint", "StringToNumber", "AsString",
            "StringLength", "Substr", "RegexFullMatch", "StringStrip"}

ALLOWED_OPS: FrozenSet[str] = frozenset(
    _PLUMBING | _VARIABLES | _TABLES | _SAVER | _INITIALIZERS | _MATH | _NN | _ARRAY
    | _STRINGS)

# Op types `allowed(extra=...)` refuses whatever the caller says: file, process, stream,
# network and summary I/O, datasets and readers.
_NEVER = re.compile(r"File|Reader|Dataset|Iterator|Summary|Py|Print|Debug|Save|Restore|"
                    r"Checkpoint|Send|Recv|Remote|Rpc|ImmutableConst|Remap|Audio|Image|"
                    r"Record|Shell|Socket|Call")


class ForbiddenOpError(DamagedVersionError):
    """A version whose graph holds an op type outside the allowlist (or a checkpoint op a
    request would run)."""


def allowed(extra: Iterable[str] = ()) -> FrozenSet[str]:
    """ALLOWED_OPS plus `extra`, op types a custom model needs (`--allow-op`).

    Raises:
        ValueError: an extra name that is no TensorFlow op, or one that does I/O.
    """
    extra = list(extra)
    for name in extra:
        if not isinstance(name, str) or not hasattr(tf.raw_ops, name):
            raise ValueError(f"allow_ops: {name!r} is not a TensorFlow op type")
        if _NEVER.search(name):
            raise ValueError(f"allow_ops: {name!r} reads or writes outside the process "
                             "(files, streams, Python, the network); a served graph may "
                             "not hold it")
    return ALLOWED_OPS | frozenset(extra)


def _inputs(node) -> list:
    return [name.lstrip("^").split(":")[0] for name in node.input]


def _reached(nodes: Mapping, roots: Iterable[str]) -> set:
    seen, stack = set(), [r for r in roots if r in nodes]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(n for n in _inputs(nodes[name]) if n in nodes)
    return seen


def _first_of(nodes: Mapping, names: Iterable[str], ops: FrozenSet[str]):
    return next((nodes[n] for n in sorted(names) if nodes[n].op in ops), None)


def check_graph(meta_graph, where: str, ops: FrozenSet[str] = ALLOWED_OPS) -> None:
    """Refuses a meta graph with an op type outside `ops`, or whose signatures or restore
    op reach checkpoint ops they must not.

    Raises:
        ForbiddenOpError: naming the op type, the node and `where`.
    """
    graph = meta_graph.graph_def
    for node in graph.node:
        if node.op not in ops:
            raise ForbiddenOpError(f"{where}: op {node.op!r} (node {node.name!r}) is not one "
                                   "an mxrec export writes; a served graph holds only "
                                   "mxrec.serving.allowed_ops (or python -m mxrec.serving "
                                   "--allow-op)")
    for function in graph.library.function:
        for node in function.node_def:
            if node.op not in ops:
                raise ForbiddenOpError(f"{where}: op {node.op!r} (in function "
                                       f"{function.signature.name!r}) is not one an mxrec "
                                       "export writes")
    nodes = {n.name: n for n in graph.node}
    for name, signature in meta_graph.signature_def.items():
        roots = [t.name.split(":")[0] for t in
                 list(signature.inputs.values()) + list(signature.outputs.values())]
        node = _first_of(nodes, _reached(nodes, roots), CHECKPOINT_IO_OPS)
        if node is not None:
            raise ForbiddenOpError(f"{where}: signature {name!r} reaches op {node.op!r} "
                                   f"(node {node.name!r}): a request would read or write "
                                   "a checkpoint file")
    restore = meta_graph.saver_def.restore_op_name.split(":")[0]
    node = _first_of(nodes, _reached(nodes, [restore]), CHECKPOINT_IO_OPS - {"RestoreV2"})
    if node is not None:
        raise ForbiddenOpError(f"{where}: the restore op {restore!r} reaches op {node.op!r} "
                               f"(node {node.name!r}): loading would write files")


__all__ = ["ALLOWED_OPS", "CHECKPOINT_IO_OPS", "ForbiddenOpError", "allowed", "check_graph"]

"""How a lookup gets its plan: one planner per plan source, and the one helper that runs
the key stage.

`sparse_lookup` checks its arguments, builds a `LookupRequest` and picks one planner, once:

- `direct_lookup`: the key stage on the lookup's IDs in the step (also the graph
  modifier's source: with modify_graph=True it records a `LookupRecord` that
  `mxrec.graph.modifier` moves into the input pipeline);
- `feature_spec_lookup`: IDs that `get_asc_insert_func` planned in the dataset (on several
  ranks it only checks them there, and the wing's planner plans them in the step);
- on several ranks, the wing's planners (`mxrec.distributed.sharded_lookup`: sharded and
  replicated tables), through `mxrec.core.wing.current().lookup_planner`;
- multi-hot IDs (`mxrec.core.multi_hot`) sit on top: flattened, looked up by one of these.

Each planner orders its own key stages through `run_key_stage`: a table's key stages in one
graph run in creation order (one mutex per table serialises batches; a later stage sees the
earlier ones' rows).
"""

import dataclasses
from typing import List, Optional

import tensorflow as tf

from mxrec.constants.constants import TIMESTAMP_COLLECTION
from mxrec.core import wing
from mxrec.core.asc.helper import planned_tensors, ranks_checked
from mxrec.core.graph_state import graph_state, shared_tensor
from mxrec.core.table import DIRECT, FEATURE_SPEC, MODIFY_GRAPH, default_values
from mxrec.util import ops as mxrec_ops


@dataclasses.dataclass
class LookupRequest:
    """One sparse_lookup of tensor IDs, its arguments checked.

    Attributes:
        send_count: the caller's send_count (the graph modifier pads to it).
        pad_to: the padded unique-row count of this lookup's own plan, or None (dynamic
            shapes, and modify_graph lookups, which the pipeline pads).
        feature_spec: the FeatureSpec of a FeatureSpec lookup on several ranks, or None.
        feature_time: its batch's time (int64 scalar, from the spec list's timestamp
            feature), or None.
    """

    table: object
    ids: tf.Tensor
    is_train: bool
    send_count: Optional[int]
    pad_to: Optional[int]
    scope: str
    modify_graph: bool
    serving_default_value: object
    is_grad: bool
    feature_spec: Optional[object] = None
    feature_time: Optional[tf.Tensor] = None

    @property
    def mode(self) -> str:
        if self.feature_spec is not None:
            return FEATURE_SPEC
        return MODIFY_GRAPH if self.modify_graph else DIRECT

    def local_time(self) -> Optional[tf.Tensor]:
        """This rank's batch time: the FeatureSpec batch's, else the declared time
        feature's (`batch_timestamp`)."""
        if self.feature_spec is not None:
            return self.feature_time
        return batch_timestamp(self.is_train)


class LookupRecord:
    """A lookup built with modify_graph=True.

    The graph modifier moves the key stage (`rows.op`) into the input pipeline:
    it computes `ids` from the dataset's elements there and rewires every
    consumer of `rows`, `restore` and `reused` (the forward lookup, its
    gradient, the re-initialisation of reused rows and the optimizers' slot
    resets) to the planned values that arrive with the batch.

    On several ranks (`sharded` set) the key stage runs on the owner of the IDs, after
    collectives; the modifier then moves the rank-local routing into the input pipeline and
    the exchange and key stage into a planning subgraph of the step
    (mxrec.distributed.sharded_pipeline): the wing's planner sets `trace_from` (the tensors
    the modifier traces back to the iterator) and `rebuild` (how the pipeline is rebuilt).
    """

    def __init__(self, table, ids, rows, restore, reused, is_train, send_count,
                 sharded=None, trace_from: Optional[List[tf.Tensor]] = None, rebuild=None):
        self.table = table
        self.ids = ids
        self.rows = rows
        self.restore = restore
        self.reused = reused
        self.is_train = is_train
        self.send_count = send_count
        self.sharded = sharded
        self.trace_from = trace_from
        self.rebuild = rebuild

    @property
    def traced(self) -> List[tf.Tensor]:
        """The tensors the graph modifier traces back to the lookup's iterator."""
        if self.trace_from is not None:
            return list(self.trace_from)
        return list(self.rows.op.inputs)


def record_lookup(graph, record: LookupRecord) -> None:
    graph_state(graph).modify_graph_lookups.append(record)


def modify_graph_lookups(graph) -> List[LookupRecord]:
    """The lookups of `graph` made with modify_graph=True, in creation order."""
    return list(graph_state(graph).modify_graph_lookups)


def batch_timestamp(is_train: bool = True) -> Optional[tf.Tensor]:
    """The batch time of a training lookup (the max of the latest declared time feature), or
    None. Evaluation lookups count nothing and make no one older, so they take none: the
    collection holds the training batch's time (mx_rec's scripts add
    train_batch["timestamp"]), which would tie an evaluation lookup to the training iterator
    (and the graph modifier refuses IDs from two iterators)."""
    stamps = tf.compat.v1.get_collection(TIMESTAMP_COLLECTION)
    if not stamps or not is_train:
        return None
    # One tensor for every lookup of the same time feature: on several ranks the lookups
    # then share one agreed batch time (one all-reduce, or one slot of the fused agreement).
    latest = stamps[-1]
    return shared_tensor(tf.compat.v1.get_default_graph(), ("batch_timestamp", latest.name),
                         lambda: tf.cast(tf.reduce_max(latest), tf.int64))


def run_key_stage(table, ids: tf.Tensor, is_train: bool, timestamp, weights=None):
    """The key stage of `table` on flat `ids`: (rows, restore, reused), ordered after the
    table's previous key stage of this graph and mode. `weights`: None, or (training) the
    occurrences each ID stands for (mxrec.util.ops.key_stage)."""
    (rows,), (restore,), (reused,), _ = mxrec_ops.key_stage(
        [ids], [table.table_key], is_train, timestamp=timestamp,
        weights=None if weights is None else [weights])
    previous = table.key_stage_dependency(tf.compat.v1.get_default_graph(), is_train, rows.op)
    if previous is not None:
        rows.op._add_control_input(previous)  # noqa: SLF001 (no public API adds one)
    return rows, restore, reused


def direct_lookup(request: LookupRequest) -> tf.Tensor:
    """The key stage on the lookup's own IDs, in the step (recorded for the graph modifier
    with modify_graph=True)."""
    table = request.table
    with tf.name_scope(request.scope):
        default = default_values(table, request.serving_default_value)
        rows, restore, reused = run_key_stage(table, tf.reshape(request.ids, [-1]),
                                              request.is_train, batch_timestamp(request.is_train))
        table.check_lookup(request.mode)
        out = table.lookup_planned(request.ids, rows, restore, reused, request.is_train,
                                   default=default, is_grad=request.is_grad,
                                   send_count=request.pad_to, scope=request.scope)
    if request.modify_graph:
        record_lookup(tf.compat.v1.get_default_graph(), LookupRecord(
            table, request.ids, rows, restore, reused, request.is_train, request.send_count))
    return out


def feature_spec_lookup(table, spec, batch, ids: tf.Tensor, is_train: bool, scope: str,
                        send_count, serving_default_value, is_grad: bool) -> tf.Tensor:
    """Lookup of IDs that get_asc_insert_func already planned in the dataset; on several
    ranks (the wing has a planner), of IDs it checked there, planned by the wing's planner
    in the step."""
    table.lookup_names.add(scope)
    if table.pad_row is not None and send_count is None:
        raise ValueError(f"sparse_lookup {scope!r} (FeatureSpec {spec.name!r}): "
                         "init(use_dynamic=False) pads each batch's unique rows to send_count, "
                         "so the lookup needs send_count > 0")
    table.check_lookup(FEATURE_SPEC)
    pad_to = None if table.pad_row is None else int(send_count)
    plan = wing.current().lookup_planner(table, False)
    if plan is not None:
        features = batch[0] if isinstance(batch, (tuple, list)) else batch
        return plan(LookupRequest(
            table, ids, is_train, send_count, pad_to, scope, False, serving_default_value,
            is_grad, feature_spec=spec, feature_time=ranks_checked(features, spec, is_train)))
    rows, restore, reused = planned_tensors(batch, spec)
    with tf.name_scope(scope):
        return table.lookup_planned(
            ids, rows, restore, reused, is_train,
            default=default_values(table, serving_default_value), is_grad=is_grad,
            send_count=pad_to, scope=scope)

"""The FeatureSpec path's dataset stage: `get_asc_insert_func` and `start_asc_pipeline`.

The insert function runs the host key stage inside `dataset.map`, so it runs
ahead of the step with the dataset's prefetch; the planned rows travel with the
batch under `spec.rows_key`, `spec.restore_key` and `spec.reused_key`:

    batch {"user_ids": [B, k], ...} -> map(insert) -> batch + {"user_ids/mxrec_rows": [U],
                                                            "user_ids/mxrec_restore": [B*k],
                                                            "user_ids/mxrec_reused": [R]}

On several ranks the key stage of an ID runs on its owner, after an exchange between the
ranks, which cannot run inside a tf.data function: the insert function checks each spec's
IDs (dtype, batch_size, feat_count) and adds the batch's time (`spec.time_key`) and a mark
of its mode (`spec.checked_key(is_training)`); `sparse_lookup(table, spec, batch=...)` then
plans the IDs in the step as a lookup of tensor IDs does (mxrec.distributed.sharded_lookup: route,
exchange, the owner's key stage, send back).

Example:
    >>> specs = [FeatureSpec("user_ids", table_name="user_table")]
    >>> dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs)).prefetch(2)
    >>> batch = iterator.get_next()
    >>> rows, restore, reused = planned_tensors(batch, specs[0])
"""

import os
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.util import ops as mxrec_ops
from mxrec.util import ranks
from mxrec.util.config import get_config_initializer


def _check_specs(specs) -> Tuple[FeatureSpec, ...]:
    if isinstance(specs, FeatureSpec):
        specs = [specs]
    specs = tuple(specs)
    if not specs or not all(isinstance(s, FeatureSpec) for s in specs):
        raise TypeError("get_asc_insert_func: tgt_key_specs must be a non-empty list of "
                        "FeatureSpec")
    if sum(bool(s.is_timestamp) for s in specs) > 1:
        raise ValueError("get_asc_insert_func: at most one FeatureSpec may be is_timestamp")
    if len({id(s) for s in specs}) != len(specs):
        raise ValueError("get_asc_insert_func: a FeatureSpec instance is listed twice; to look "
                         "a feature up several times, make one FeatureSpec per lookup")
    return specs


# mx_rec's older form of the insert function, without FeatureSpecs.
_MX_REC_LEGACY_ARGS = ("args_index_list", "feature_numbers", "table_names")
DUMP_DIR = "export_graph"


def _check_shape(spec: FeatureSpec, ids: tf.Tensor) -> list:
    """Asserts that a batch has the spec's batch_size and feat_count, where given."""
    checks = []
    shape = tf.shape(ids, out_type=tf.int64)
    if spec.batch_size is not None:
        checks.append(tf.debugging.assert_equal(
            shape[0], tf.constant(spec.batch_size, tf.int64),
            message=f"FeatureSpec {spec.name!r}: batch_size={spec.batch_size}, but a batch of "
                    f"{spec.ids_key!r} has another number of rows"))
    if spec.feat_count is not None:
        checks.append(tf.debugging.assert_equal(
            tf.reduce_prod(shape[1:]), tf.constant(spec.feat_count, tf.int64),
            message=f"FeatureSpec {spec.name!r}: feat_count={spec.feat_count}, but a batch of "
                    f"{spec.ids_key!r} has another number of IDs per row"))
    return checks


def _check_legacy_args(kwargs) -> None:
    unknown = sorted(set(kwargs) - set(_MX_REC_LEGACY_ARGS))
    if unknown:
        raise TypeError(f"get_asc_insert_func() got unexpected keyword argument(s) {unknown}")
    legacy = sorted(k for k, v in kwargs.items() if v is not None)
    if legacy:
        raise NotImplementedError(
            f"get_asc_insert_func({', '.join(legacy)}=...): mx_rec's form without FeatureSpecs "
            "is not available; pass tgt_key_specs=[FeatureSpec(...), ...]")


def get_asc_insert_func(tgt_key_specs: Sequence[FeatureSpec] = None, is_training: bool = True,
                        dump_graph: bool = False, **kwargs):
    """A function for `dataset.map` that plans each spec's IDs in the host key stage.

    Args:
        tgt_key_specs: the FeatureSpecs of the batch (and at most one timestamp spec). Several
            specs may name one feature and table: each is one lookup (mx_rec's multi-lookup).
        is_training: count and insert IDs (True), or only look them up (False).
        dump_graph: write the insert function's graph, as traced, to
            `export_graph/asc_insert_func_{train,eval}.pbtxt` under the working directory.
        **kwargs: mx_rec's older arguments args_index_list, feature_numbers and table_names
            (the form without FeatureSpecs) raise NotImplementedError; others TypeError.

    Returns:
        fn(batch) -> batch with the planned tensors added; `batch` is a dict of
        features, or a tuple whose first item is that dict.
    """
    _check_legacy_args(kwargs)
    if tgt_key_specs is None:
        raise TypeError("get_asc_insert_func: tgt_key_specs (a list of FeatureSpec) is required")
    if not isinstance(is_training, bool) or not isinstance(dump_graph, bool):
        raise TypeError("get_asc_insert_func: is_training and dump_graph must be bools")
    specs = _check_specs(tgt_key_specs)
    runtime = get_config_initializer()
    several_ranks = ranks.get_rank_size() > 1

    def insert(*element):
        features = _element_features(element, specs)
        timestamp = None
        for spec in specs:
            if spec.is_timestamp:
                timestamp = tf.cast(tf.reduce_max(features[spec.ids_key]), tf.int64)
        rounds = _PackedRounds(runtime, is_training, timestamp)
        for spec in specs:
            if spec.is_timestamp:
                continue
            ids = features[spec.ids_key]
            if ids.dtype not in (tf.int32, tf.int64):
                raise TypeError(f"FeatureSpec {spec.name!r}: IDs must be int32 or int64, got "
                                f"{ids.dtype.name}")
            if several_ranks:  # checked here, planned in the step (sparse_lookup)
                mark = tf.constant(True)
                with tf.control_dependencies(_check_shape(spec, ids)):
                    rounds.added[spec.checked_key(is_training)] = tf.identity(mark)
                if timestamp is not None:
                    rounds.added[spec.time_key] = timestamp
                continue
            rounds.add(spec, ids)
        rounds.plan()
        features = dict(features, **rounds.added)
        if dump_graph:
            os.makedirs(DUMP_DIR, exist_ok=True)
            tf.io.write_graph(tf.compat.v1.get_default_graph().as_graph_def(), DUMP_DIR,
                              f"asc_insert_func_{'train' if is_training else 'eval'}.pbtxt")
        if len(element) == 1:
            return features
        return (features,) + tuple(element[1:])

    return insert


def _element_features(element: tuple, specs: Sequence[FeatureSpec]) -> Dict[str, tf.Tensor]:
    """The dict of features of a dataset element (the element, or its first item), checked
    to hold every spec's feature."""
    features = element[0]
    if not isinstance(features, dict):
        raise TypeError("get_asc_insert_func: the dataset's element must be a dict of "
                        "features, or a tuple starting with one")
    missing = [s.ids_key for s in specs if s.ids_key not in features]
    if missing:
        raise ValueError(f"get_asc_insert_func: the batch has no feature(s) {missing}; "
                         f"it has {sorted(features)}")
    return features


class _PackedRounds:
    """The specs to plan, in rounds of one packed key-stage call: consecutive specs, a table
    at most once per round (one table's specs plan in order; the engine would race them in
    one call) and one ID dtype, so the order of the tables' batches is the specs' order.
    Each round runs after the one before; `added` collects the planned tensors by key."""

    def __init__(self, runtime, is_training: bool, timestamp: Optional[tf.Tensor]):
        self.runtime, self.is_training, self.timestamp = runtime, is_training, timestamp
        self.added: Dict[str, tf.Tensor] = {}
        self.previous: List[tf.Operation] = []
        self.specs: List[FeatureSpec] = []
        self.ids: List[tf.Tensor] = []
        self.checks: List[tf.Operation] = []

    def add(self, spec: FeatureSpec, ids: tf.Tensor) -> None:
        if (any(s.table_name == spec.table_name for s in self.specs)
                or (self.ids and self.ids[0].dtype != ids.dtype)):
            self.plan()
        self.specs.append(spec)
        self.ids.append(tf.reshape(ids, [-1]))
        self.checks.extend(_check_shape(spec, ids))

    def plan(self) -> None:
        """One packed key-stage call for the round gathered so far (none when empty)."""
        if not self.specs:
            return
        with tf.control_dependencies(self.previous + self.checks):
            stage = mxrec_ops.key_stage_packed(
                self.ids, [self.runtime.table_key(s.table_name) for s in self.specs],
                self.is_training, timestamp=self.timestamp, deferred=True)
        self.previous = [stage.op]
        for slot, s in enumerate(self.specs):
            self.added.update({s.rows_key: stage.unique_rows[slot],
                               s.restore_key: stage.restore[slot],
                               s.reused_key: stage.reused_rows[slot],
                               s.batch_id_key: stage.batch_ids[slot:slot + 1]})
        self.specs, self.ids, self.checks = [], [], []


def planned_tensors(batch, spec: FeatureSpec) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(unique_rows, restore, reused_rows) of `spec` from a batch the insert function made.

    The rows come with the batch's commit: the step that reads them trains the
    batch, which stops being pending in the table (see mxrec.graph.pipeline).
    """
    features = batch[0] if isinstance(batch, (tuple, list)) else batch
    if any(spec.checked_key(mode) in features for mode in (True, False)):
        raise ValueError(f"FeatureSpec {spec.name!r}: on {ranks.get_rank_size()} ranks "
                         "get_asc_insert_func does not plan the batch in the dataset (the "
                         "key stage runs on each ID's owner, after an exchange); look it up "
                         "with sparse_lookup(table, spec, batch=...), which plans it")
    try:
        planned = [features[spec.rows_key], features[spec.reused_key]]
        rows, reused = mxrec_ops.after_commit(
            planned, features[spec.batch_id_key],
            [get_config_initializer().table_key(spec.table_name)])
        return rows, features[spec.restore_key], reused
    except KeyError:
        raise ValueError(f"FeatureSpec {spec.name!r}: the batch has no planned rows; map the "
                         "dataset with get_asc_insert_func(tgt_key_specs=[...]) including this "
                         "spec") from None


def ranks_checked(features: Dict, spec: FeatureSpec, is_train: bool):
    """Several ranks: checks that an insert function with is_training=is_train checked
    `spec`'s IDs in this batch; returns the batch's time (int64 scalar) or None."""
    modes = [mode for mode in (True, False) if spec.checked_key(mode) in features]
    if not modes:
        raise ValueError(f"FeatureSpec {spec.name!r}: the batch was not mapped by "
                         "get_asc_insert_func(tgt_key_specs=[...]) including this spec")
    if is_train not in modes:
        raise ValueError(
            f"FeatureSpec {spec.name!r}: the batch was mapped by "
            f"get_asc_insert_func(is_training={modes[0]}), but the lookup has "
            f"is_train={is_train}; on {ranks.get_rank_size()} ranks the lookup plans the "
            "batch in its mode, so both must agree")
    return features.get(spec.time_key)


def start_asc_pipeline() -> None:
    """Starts the FeatureSpec path's host stage (mx_rec compatibility).

    The key stage runs inside the dataset's map, on the dataset's own threads,
    so there is nothing to start; this checks that `init()` was called.
    """
    get_config_initializer()

"""Python wrappers of mxrec's single-process TensorFlow ops (the key stage, its commit, mx_rec's
host ops object); the sharded lookup's ops are wrapped in mxrec.distributed.sharded_ops."""

import os
from typing import List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from mxrec._lib import loader
from mxrec.constants.constants import (
    EVAL_CHANNEL_ID,
    LIBASC_OPS_SO,
    LIBREC_EOS_OPS_SO,
    TRAIN_CHANNEL_ID,
)
from mxrec.util import registry


def key_stage(
    ids: Sequence[tf.Tensor], table_keys: Sequence[str], is_train: bool, timestamp=None,
    deferred: bool = False, weights: Optional[Sequence[tf.Tensor]] = None,
) -> Tuple[List[tf.Tensor], List[tf.Tensor], List[tf.Tensor], tf.Tensor]:
    """Runs the host key stage on one 1-D ID tensor per table.

    Args:
        deferred: the batch is planned ahead of its step (in the input pipeline);
            a training batch then stays pending in each table until
            `commit_batches` runs with its batch id in the step.
        weights: None, or (training only) one int64 tensor per ID tensor, its shape:
            how many occurrences each position stands for (>= 1), as if its ID were
            repeated that many times in place. The owner of a sharded table plans the
            unique IDs it received with their occurrence counts over the global batch.

    Returns:
        (unique_rows, restore, reused_rows, batch_ids): one int32 tensor per
        table for each of the first three; batch_ids is int64 [len(table_keys)]
        (zeros unless deferred and training).
    """
    if timestamp is None:
        timestamp = tf.constant(-1, tf.int64)
    with tf.device("/device:CPU:0"):
        return loader.op_library().mxrec_key_stage(
            ids=list(ids), timestamp=timestamp, weights=list(weights or []),
            table_keys=list(table_keys), is_train=is_train, deferred=deferred)


class PackedKeyStage(NamedTuple):
    """The outputs of one MxrecKeyStagePacked call, split per table (see key_stage_packed).

    Attributes:
        op: the key-stage op (what a later key stage of the same tables orders after).
    """

    unique_rows: List[tf.Tensor]
    restore: List[tf.Tensor]
    reused_rows: List[tf.Tensor]
    batch_ids: tf.Tensor
    op: tf.Operation


def key_stage_packed(
    ids: Sequence[tf.Tensor], table_keys: Sequence[str], is_train: bool, timestamp=None,
    deferred: bool = False,
) -> PackedKeyStage:
    """`key_stage` for several tables in one call on packed tensors: the tables' 1-D IDs
    go in as one vector with row splits and the outputs come back as one tensor each, so
    the call's fixed costs (tensors in and out, output buffers) are paid once per step,
    not once per table. Plans, rows and restore indices are those of `key_stage`.

    Args:
        ids: one 1-D ID tensor per table, all int32 or all int64.
        table_keys: the tables, each at most once (one call plans one batch per table).

    Raises:
        ValueError: no tables, a different number of ID tensors, a table named twice, or
            IDs of mixed dtypes or not 1-D.
    """
    ids = [tf.convert_to_tensor(t) for t in ids]
    table_keys = list(table_keys)
    if not table_keys or len(ids) != len(table_keys):
        raise ValueError(f"key_stage_packed: got {len(ids)} ID tensors for "
                         f"{len(table_keys)} tables; give one per table, at least one")
    seen = set()
    for key in table_keys:
        if key in seen:
            raise ValueError(f"key_stage_packed: table {key!r} is named twice in table_keys; "
                             "a call plans one batch per table, so two lookups of one table "
                             "go into successive calls")
        seen.add(key)
    dtypes = {t.dtype for t in ids}
    if len(dtypes) != 1 or not dtypes <= {tf.int32, tf.int64}:
        raise ValueError(f"key_stage_packed: the IDs of tables {table_keys} must all be int32 "
                         f"or all int64, got {[t.dtype.name for t in ids]}")
    for key, t in zip(table_keys, ids):
        if t.shape.rank is not None and t.shape.rank != 1:
            raise ValueError(f"key_stage_packed: the IDs of table {key!r} must be 1-D, got "
                             f"shape {t.shape}")
    if timestamp is None:
        timestamp = tf.constant(-1, tf.int64)
    with tf.device("/device:CPU:0"):
        if len(ids) == 1:
            packed = ids[0]
            splits = tf.stack([tf.constant(0, tf.int64), tf.size(packed, out_type=tf.int64)])
        else:
            packed = tf.concat(ids, 0)
            sizes = tf.stack([tf.size(t, out_type=tf.int64) for t in ids])
            splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(sizes)], 0)
        out = loader.op_library().mxrec_key_stage_packed(
            ids=packed, splits=splits, timestamp=timestamp, table_keys=table_keys,
            is_train=is_train, deferred=deferred)
        restore = _unpack(out.restore, splits, len(ids))
        for r, t in zip(restore, ids):
            r.set_shape(t.shape)
        return PackedKeyStage(_unpack(out.unique_rows, out.unique_splits, len(ids)), restore,
                              _unpack(out.reused_rows, out.reused_splits, len(ids)),
                              out.batch_ids, out.unique_rows.op)


def _unpack(values: tf.Tensor, splits: tf.Tensor, n: int) -> List[tf.Tensor]:
    """values[splits[i]:splits[i+1]] for each of the n tables."""
    if n == 1:
        return [values]
    return tf.split(values, splits[1:] - splits[:-1], num=n)


def commit_batches(batch_ids: tf.Tensor, table_keys: Sequence[str]) -> tf.Operation:
    """The step of deferred batches runs: they stop being pending in their tables."""
    with tf.device("/device:CPU:0"):
        return loader.op_library().mxrec_commit_batches(
            batch_ids=batch_ids, table_keys=list(table_keys)).op


def after_commit(tensors: Sequence[tf.Tensor], batch_ids: tf.Tensor,
                 table_keys: Sequence[str]) -> List[tf.Tensor]:
    """`tensors` (planned rows) made to run the batch's commit: whatever step reads
    them trains the batch, so it stops being pending then."""
    commit = commit_batches(batch_ids, table_keys)
    with tf.device("/device:CPU:0"), tf.control_dependencies([commit]):
        return [tf.identity(t) for t in tensors]


class HostPipelineOps:
    """mx_rec's `import_host_pipeline_ops()` object.

    Attributes:
        library: the mx_rec library it stands for (LIBASC_OPS_SO, or LIBREC_EOS_OPS_SO
            for Dataset.eos_map); every op runs from mxrec's own library.
    """

    def __init__(self, library: str = LIBASC_OPS_SO):
        self.library = library

    def set_threshold(self, threshold, emb_name: str, ids_name: Optional[str] = None,
                      name=None):
        """Changes the admission threshold of table `emb_name` when run.

        A threshold of 0 stops counting: the table keeps its threshold and
        admits on the counts gathered so far.

        Args:
            threshold: scalar int32/int64/float tensor.
            emb_name: the table's name.
            ids_name: one of the table's lookups (sparse_lookup's `name`, by default
                "<table>_lookup", or a FeatureSpec's name), checked to be one. A table has
                one admission policy, so the threshold is the table's, for all its lookups.
            name: name of the op.

        Raises:
            ValueError: no table `emb_name`, or no lookup `ids_name` of it.
        """
        # The configuration in force, which mxrec.util.config provides (it imports this
        # module, so this one does not import it).
        get_config_initializer = registry.provided(registry.CONFIG)
        if get_config_initializer is None:
            raise RuntimeError("set_threshold: call mxrec.util.initialize.init() first")
        runtime = get_config_initializer()
        if emb_name not in runtime.tables:
            raise ValueError(f"set_threshold: no table named {emb_name!r} was created")
        if ids_name is not None:
            lookups = runtime.tables[emb_name].lookup_names
            if ids_name not in lookups:
                raise ValueError(f"set_threshold: table {emb_name!r} has no lookup named "
                                 f"{ids_name!r}; its lookups: {sorted(lookups)}")
        with tf.device("/device:CPU:0"):
            return loader.op_library().mxrec_set_threshold(
                threshold=threshold, table_key=runtime.table_key(emb_name), name=name
            )


    def return_timestamp(self, tensor, name=None) -> tf.Tensor:
        """The wall clock in whole seconds (int64 scalar) when `tensor` has been computed,
        as mx_rec's op: a dataset map stamps each batch with it (`batch["timestamp"]`).

        Example:
            >>> dataset = dataset.map(lambda b: dict(b, timestamp=ops.return_timestamp(
            ...     tf.cast(b["label"], tf.int64))))
        """
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype != tf.int64:
            raise TypeError(f"return_timestamp: the input must be int64, got {tensor.dtype.name}")
        with tf.device("/device:CPU:0"), tf.control_dependencies([tensor]):
            return tf.cast(tf.floor(tf.timestamp()), tf.int64, name=name or "return_timestamp")

    def clear_channel(self, channel_id: int, name=None) -> tf.Operation:
        """mx_rec's reset of a channel's batch counter before a new round of it. mxrec keeps
        no counter per channel (training batches are matched to their step by the batch id
        that travels with them, evaluation batches need none), so a new round needs no reset:
        the op checks `channel_id` and does nothing else.

        Raises:
            ValueError: channel_id is not 0 (training) or 1 (evaluation).
        """
        if channel_id not in (TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID) or isinstance(channel_id, bool):
            raise ValueError(f"clear_channel: channel_id must be {TRAIN_CHANNEL_ID} (training) "
                             f"or {EVAL_CHANNEL_ID} (evaluation), got {channel_id!r}")
        return tf.no_op(name=name or f"clear_channel_{channel_id}")


def import_host_pipeline_ops(so_path: Optional[str] = None) -> HostPipelineOps:
    """mx_rec's host ops object (set_threshold, return_timestamp, clear_channel).

    Args:
        so_path: mx_rec's library to load, by name or path: None or LIBASC_OPS_SO
            ("libasc_ops.so"), or LIBREC_EOS_OPS_SO ("librec_eos_ops.so", the object
            `Dataset.eos_map` takes). mxrec has both in its own op library; the name picks
            which mx_rec library the object stands for.

    Raises:
        TypeError: so_path is not a string.
        ValueError: a library mx_rec does not have.
    """
    library = LIBASC_OPS_SO
    if so_path is not None:
        if not isinstance(so_path, str):
            raise TypeError(f"import_host_pipeline_ops: so_path must be a string, got "
                            f"{so_path!r}")
        library = os.path.basename(so_path)
        if library not in (LIBASC_OPS_SO, LIBREC_EOS_OPS_SO):
            raise ValueError(
                f"import_host_pipeline_ops({so_path!r}): mx_rec's host-op libraries are "
                f"{LIBASC_OPS_SO!r} and {LIBREC_EOS_OPS_SO!r} (mx_rec.constants.constants."
                "LIBASC_OPS_SO, LIBREC_EOS_OPS_SO); mxrec's ops are in mxrec/_lib")
    loader.op_library()
    return HostPipelineOps(library)

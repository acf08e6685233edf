"""The host state of a table as a SaveableObject: what any tf.compat.v1.train.Saver saves.

The table registers it at creation (create_table's is_save), so the graph's own
Saver, CheckpointSaverHook and Estimator checkpoints carry the host state with
the device rows.

Each save also writes mx_rec's sparse checkpoint folder next to the TF checkpoint:
a save to `<dir>/<name>` (`saver.save(sess, "saved-model/model-0", global_step=100)`
saves to `saved-model/model-0-100`) writes `<dir>/sparse-<name>/<table>/keys`, the
table's IDs at the save (a serialized int64 tensor). mx_rec scripts look for that
folder (`glob("./saved-model/sparse-model-0-*")`) to decide whether a checkpoint
exists; everything a restore needs is in the TF checkpoint itself, which
`saver.restore(sess, "saved-model/model-0-100")` reads. TF's Saver deletes old
checkpoints beyond max_to_keep; their sparse folders stay.

TF's saveable interface takes whole tensors: a save exports the table's host state (every
ID's record and, with a host tier, every host-tier row) as tensors held in memory at once,
and a restore reads them back whole. A table whose export would exceed
`MXREC_TF_SAVER_MAX_MB` (default 4096 MiB) is refused when the save runs, before anything is
exported, with an error naming the table, the estimate and the limit: mxrec's own Saver
(`mxrec.saver.checkpoint.Saver`) streams such a table in bounded chunks.
"""

import os
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from mxrec._lib import loader
from mxrec.util import ranks

_FIELDS = (
    ("keys", tf.int64),
    ("rows", tf.int32),
    ("counts", tf.float32),
    ("last_seen", tf.int64),
    ("free_rows", tf.int32),
    ("meta", tf.int64),
    ("threshold", tf.float64),
)
# The fields of a device-only table's snapshot, in the ops' order (mxrec.keras saves them too).
FIELDS = _FIELDS
# Tables with a host (and SSD) tier also save where each ID's row lives, the device
# cache's recency order, and the host-tier rows (embedding and optimizer slots).
_TIER_FIELDS = (
    ("in_host", tf.int32),
    ("lru_rows", tf.int32),
    ("lru_ages", tf.int64),
    ("tier_components", tf.string),
    ("tier_present", tf.int64),
    ("tier_values", tf.float32),
)
TIER_FIELDS = _TIER_FIELDS  # mxrec.keras saves them too
# The device cache's recency order, which batches planned ahead of their steps change.
_RECENCY_FIELDS = ("lru_rows", "lru_ages")


# The limit on what one TF-Saver save of a table holds in memory (see the module docstring).
TF_SAVER_LIMIT_ENV = "MXREC_TF_SAVER_MAX_MB"
DEFAULT_TF_SAVER_MAX_MB = 4096.0
# Bytes the export holds per ID: its record (key and last seen int64, row int32, count
# float32), with a host tier also in_host (int32), and per host-tier ID its presence bits
# (int64) besides its values.
RECORD_BYTES = 24
TIER_RECORD_BYTES = 4
TIER_PRESENT_BYTES = 8

def tf_saver_limit_mb() -> float:
    """`MXREC_TF_SAVER_MAX_MB`: MiB one TF-Saver save of a table may hold ("inf": no limit).

    Raises:
        ValueError: a value that is not a number > 0, naming the variable.
    """
    raw = os.environ.get(TF_SAVER_LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_TF_SAVER_MAX_MB
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:  # NaN too
        raise ValueError(f"{TF_SAVER_LIMIT_ENV} must be a number of MiB > 0 (or inf), got "
                         f"{raw!r}")
    return value


def over_limit_message(table_name: str, what: str, estimate: Optional[int],
                       limit_mb: float) -> str:
    """The refusal of a TF-Saver save too large for memory: the table, the bytes (None: known
    only when the save runs, given after the message), the limit, the setting, the way out."""
    size = (f"about {estimate / 2**20:.0f} MiB ({estimate} bytes), over" if estimate is not None
            else "more than")
    return (f"table {table_name!r}: TF's Saver would hold {what} in memory at once, {size} "
            f"the limit of {limit_mb:g} MiB ({TF_SAVER_LIMIT_ENV}); save the table with "
            "mxrec's Saver (mxrec.saver.checkpoint.Saver; mxrec.keras.KerasSaver for a "
            "Keras model), which streams it in chunks of "
            f"checkpoint_memory_mb, or raise {TF_SAVER_LIMIT_ENV} if the memory is there")


def export_bytes(table_key: str, dim: int, tiered: bool) -> int:
    """The bytes of the per-ID arrays that exporting a table's host state holds now: every
    tracked ID's record and, with a host tier, each host-tier ID's presence bits and values
    (embedding and slots). The table-wide arrays (free rows, the device cache's order) are
    bounded by device_vocabulary_size and left out."""
    engine = loader.engine()
    stats = engine.stats(table_key)
    total = int(stats["ids_tracked"]) * (RECORD_BYTES + (TIER_RECORD_BYTES if tiered else 0))
    if tiered:
        components = max(len(engine.tier_components(table_key)), 1)
        total += int(stats.get("tier_ids", 0)) * (TIER_PRESENT_BYTES + components * dim * 4)
    return total


def size_guard(table_name: str, table_key: str, dim: int, tiered: bool) -> tf.Tensor:
    """An op that refuses (InvalidArgumentError) a save whose export would hold more than
    the limit; the limit is read when the save is built."""
    limit_mb = tf_saver_limit_mb()

    def check():
        estimate = export_bytes(table_key, dim, tiered)
        if estimate > limit_mb * 2**20:
            raise ValueError(over_limit_message(
                table_name, "its host state (every ID's record and the host tier's rows)",
                estimate, limit_mb))
        return np.int64(estimate)

    return tf.numpy_function(check, [], tf.int64, stateful=True,
                             name=f"{table_name}_tf_saver_size_guard")


class HostStateSaveable(saveable_object.SaveableObject):
    """Saves a table's host state under `<table>/mxrec_host/<field>`.

    A table with a host (or SSD) tier also saves `in_host`, `lru_rows`, `lru_ages`,
    `tier_components`, `tier_present` and `tier_values` (the host-tier rows of the
    embedding and of each optimizer slot); device rows are in the variables as usual.
    With batches planned but not yet trained (the graph modifier's prefetched
    batches), the saved residency is where the values are: as before those plans.

    A save whose export would hold more than `MXREC_TF_SAVER_MAX_MB` is refused before
    anything is exported (see the module docstring).

    Restoring replaces the host state; a snapshot that does not fit the table
    (rows beyond device_vocabulary_size, an ID twice, a row used twice) is
    refused with an error naming the table, and the table is left as it was.
    """

    def __init__(self, table_name: str, table_key: str, dim: int):
        self._table_key = table_key
        self._tiered = bool(loader.engine().is_tiered(table_key))
        with tf.device("/device:CPU:0"):
            guard = size_guard(table_name, table_key, dim, self._tiered)
            with tf.control_dependencies([guard]):
                tensors = loader.op_library().mxrec_export_table(
                    table_key=table_key, name=f"{table_name}_export_host_state")
        if ranks.get_rank_size() > 1:
            tensors = [_refused(table_name, t) for t in tensors]
        fields = _FIELDS + (_TIER_FIELDS if self._tiered else ())
        specs = [
            saveable_object.SaveSpec(tensor, "", f"{table_name}/mxrec_host/{field}")
            for tensor, (field, _) in zip(tensors[1:], fields[1:])
        ]
        keys = tensors[0]
        specs.insert(0, saveable_object.SaveSpec(
            lambda: _keys_with_sparse_folder(keys, table_name), "",
            f"{table_name}/mxrec_host/keys", dtype=tf.int64, device="/device:CPU:0"))
        super().__init__(keys, specs, f"{table_name}/mxrec_host")

    def restore(self, restored_tensors, restored_shapes):
        """Imports the snapshot, unless it equals the table's state at the step boundary.

        An Estimator's evaluation during train_and_evaluate restores, in its own graph, the
        checkpoint training has just written, while training keeps batches planned ahead
        of their steps in the same host tables. That snapshot is the tables' state at the
        step boundary already, so importing it would change nothing but drop the planned
        batches, and training would then stop at the next one. Any other snapshot replaces
        the state (and drops the planned batches: their plans refer to the old state).

        The device cache's recency order (lru_rows, lru_ages) is left out of the comparison:
        it is the one part of the export that batches planned ahead keep (their IDs became
        the most recent when they were planned), so it differs from the checkpoint by as many
        batches as the pipeline planned since the save. A snapshot equal in everything else
        is the state at the step boundary, and the planned batches' order is the one to keep.
        """
        del restored_shapes
        fields = _FIELDS + (_TIER_FIELDS if self._tiered else ())
        if ranks.get_rank_size() > 1:
            restored_tensors = [_refused(self.name.split("/")[0], t) for t in restored_tensors]
        with tf.device("/device:CPU:0"):
            inputs = [tf.cast(t, dtype) if dtype != tf.string else t
                      for t, (_, dtype) in zip(restored_tensors, fields)]
            current = loader.op_library().mxrec_export_table(
                table_key=self._table_key, name="current_host_state")[:len(fields)]
            same = tf.reduce_all(tf.stack([
                _same(a, b) for a, b, (name, _) in zip(inputs, current, fields)
                if name not in _RECENCY_FIELDS]))
            return tf.cond(same, tf.no_op, lambda: self._import_host(inputs),
                           name="restore_unless_current")

    def _import_host(self, inputs):
        with tf.device("/device:CPU:0"):
            if not self._tiered:  # device-only tables save no tier fields
                op = loader.op_library().mxrec_import_table(*inputs, table_key=self._table_key)
            else:
                op = loader.op_library().mxrec_import_table_tiered(*inputs,
                                                                   table_key=self._table_key)
            with tf.control_dependencies([op]):
                return tf.no_op()


def _same(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Whether two tensors have the same shape and values (a scalar bool)."""
    a, b = tf.reshape(a, [-1]), tf.reshape(b, [-1])
    return tf.cond(tf.equal(tf.size(a), tf.size(b)),
                   lambda: tf.reduce_all(tf.equal(a, b)), lambda: tf.constant(False))


def _keys_with_sparse_folder(keys: tf.Tensor, table_name: str) -> tf.Tensor:
    """The keys to save, once they are also written to the save's sparse folder.

    Called while a tf.compat.v1.train.Saver builds its save ops, in its name scope, where
    `<scope>/Const` is the checkpoint path the Saver feeds at each save (the name TF keeps
    "for backwards compatibility"). Built elsewhere, there is no path: keys only.
    """
    graph = keys.graph
    try:
        path = graph.get_tensor_by_name(f"{graph.get_name_scope()}/Const:0")
    except (KeyError, ValueError):
        return tf.identity(keys)
    if path.dtype != tf.string:
        return tf.identity(keys)
    with tf.device("/device:CPU:0"):
        folder = tf.strings.join([tf.strings.regex_replace(path, "[^/]*$", ""), "sparse-",
                                  tf.strings.regex_replace(path, "^.*/", "")])
        write = tf.io.write_file(tf.strings.join([folder, f"/{table_name}/keys"]),
                                 tf.io.serialize_tensor(keys))
        with tf.control_dependencies([write]):
            return tf.identity(keys)


def _refused(table_name: str, tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` behind an assert that always fails: a table with a host tier, or a replicated
    (is_dp=True) table, on several ranks has no TF-Saver form yet (ShardedTableSaveable holds
    device rows only, and would gather a replicated table N times over)."""
    check = tf.debugging.Assert(False, [
        f"table {table_name!r} has a host tier (host_vocabulary_size > 0) or is replicated "
        f"(is_dp=True) on {ranks.get_rank_size()} ranks: TF's Saver (and "
        "CheckpointSaverHook, Estimator checkpoints) cannot save or restore it; use "
        "mxrec.saver.checkpoint.Saver, which writes every rank's shard into one version and "
        "restores it on any number of ranks"])
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def register(table_name: str, table_key: str, dim: int) -> HostStateSaveable:
    """Adds the table's host state to the graph's SAVEABLE_OBJECTS collection."""
    saveable = HostStateSaveable(table_name, table_key, dim)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return saveable

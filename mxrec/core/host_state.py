"""The host state of a table as a SaveableObject: what any tf.compat.v1.train.Saver saves.

The table registers it at creation (create_table's is_save), so the graph's own
Saver, CheckpointSaverHook and Estimator checkpoints carry the host state with
the device rows. Its old import path, mxrec.saver.host_state, re-exports it.
"""

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from mxrec._lib import loader
from mxrec.util import communication

_FIELDS = (
    ("keys", tf.int64),
    ("rows", tf.int32),
    ("counts", tf.float32),
    ("last_seen", tf.int64),
    ("free_rows", tf.int32),
    ("meta", tf.int64),
    ("threshold", tf.float64),
)
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


class HostStateSaveable(saveable_object.SaveableObject):
    """Saves a table's host state under `<table>/mxrec_host/<field>`.

    A table with a host (or SSD) tier also saves `in_host`, `lru_rows`, `lru_ages`,
    `tier_components`, `tier_present` and `tier_values` (the host-tier rows of the
    embedding and of each optimizer slot); device rows are in the variables as usual.
    With batches planned but not yet trained (the graph modifier's prefetched
    batches), the saved residency is where the values are: as before those plans.

    Restoring replaces the host state; a snapshot that does not fit the table
    (rows beyond device_vocabulary_size, an ID twice, a row used twice) is
    refused with an error naming the table, and the table is left as it was.
    """

    def __init__(self, table_name: str, table_key: str):
        self._table_key = table_key
        self._tiered = bool(loader.engine().is_tiered(table_key))
        with tf.device("/device:CPU:0"):
            tensors = loader.op_library().mxrec_export_table(
                table_key=table_key, name=f"{table_name}_export_host_state")
        if communication.get_rank_size() > 1:
            tensors = [_refused(table_name, t) for t in tensors]
        fields = _FIELDS + (_TIER_FIELDS if self._tiered else ())
        specs = [
            saveable_object.SaveSpec(tensor, "", f"{table_name}/mxrec_host/{field}")
            for tensor, (field, _) in zip(tensors, fields)
        ]
        super().__init__(tensors[0], specs, f"{table_name}/mxrec_host")

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        if communication.get_rank_size() > 1:
            restored_tensors = [_refused(self.name.split("/")[0], t) for t in restored_tensors]
        with tf.device("/device:CPU:0"):
            inputs = [tf.cast(t, dtype) if dtype != tf.string else t
                      for t, (_, dtype) in zip(restored_tensors, _FIELDS + _TIER_FIELDS)]
            if not self._tiered:  # device-only tables save no tier fields
                return loader.op_library().mxrec_import_table(*inputs,
                                                              table_key=self._table_key)
            return loader.op_library().mxrec_import_table_tiered(*inputs,
                                                                 table_key=self._table_key)

def _refused(table_name: str, tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` behind an assert that always fails: TF's Saver on several ranks would save
    (or restore) one rank's shard under the others' names."""
    check = tf.debugging.Assert(False, [
        f"table {table_name!r} is sharded across {communication.get_rank_size()} ranks: TF's "
        "Saver (and CheckpointSaverHook, Estimator checkpoints) cannot save or restore it; "
        "use mxrec.saver.checkpoint.Saver, which writes every rank's shard into one version "
        "and restores it on any number of ranks"])
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def register(table_name: str, table_key: str) -> HostStateSaveable:
    """Adds the table's host state to the graph's SAVEABLE_OBJECTS collection."""
    saveable = HostStateSaveable(table_name, table_key)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return saveable

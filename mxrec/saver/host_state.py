"""The host state of a table as a SaveableObject."""

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from mxrec._lib import loader

_FIELDS = (
    ("keys", tf.int64),
    ("rows", tf.int32),
    ("counts", tf.float32),
    ("last_seen", tf.int64),
    ("free_rows", tf.int32),
    ("meta", tf.int64),
    ("threshold", tf.float64),
)


class HostStateSaveable(saveable_object.SaveableObject):
    """Saves a table's host state under `<table>/mxrec_host/<field>`.

    Restoring replaces the host state; a snapshot that does not fit the table
    (rows beyond device_vocabulary_size, an ID twice, a row used twice) is
    refused with an error naming the table, and the table is left as it was.
    """

    def __init__(self, table_name: str, table_key: str):
        self._table_key = table_key
        with tf.device("/device:CPU:0"):
            tensors = loader.op_library().mxrec_export_table(
                table_key=table_key, name=f"{table_name}_export_host_state")
        specs = [
            saveable_object.SaveSpec(tensor, "", f"{table_name}/mxrec_host/{field}")
            for tensor, (field, _) in zip(tensors, _FIELDS)
        ]
        super().__init__(tensors[0], specs, f"{table_name}/mxrec_host")

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        with tf.device("/device:CPU:0"):
            return loader.op_library().mxrec_import_table(
                *[tf.cast(t, dtype) for t, (_, dtype) in zip(restored_tensors, _FIELDS)],
                table_key=self._table_key)


def register(table_name: str, table_key: str) -> HostStateSaveable:
    """Adds the table's host state to the graph's SAVEABLE_OBJECTS collection."""
    saveable = HostStateSaveable(table_name, table_key)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return saveable

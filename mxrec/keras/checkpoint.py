"""The host state of an mxrec.keras table in TF2 object-based checkpoints.

`HostState` is the Trackable an `Embedding` holds as `layer.host_state`: `tf.train.Checkpoint`
(and Keras' `save_weights` in the TF format) save the table's host state (IDs, rows, counts,
batch times, free rows, admission threshold: the fields of the Session path's
`HostStateSaveable`, by the same ops `MxrecExportTable` / `MxrecImportTable`, and the tier
fields and `MxrecImportTableTiered` for a table with a host tier) with the rows
in the layer's weight, and restore it into the engine. A snapshot that does not fit the table
is refused by the import op with an error naming the table, the table left as it was.

The Session path's checkpoints are name-based (`<table>/mxrec_host/<field>`), these are
object-based: the two formats do not read each other yet.
"""

import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import host_state


class HostState(tf.__internal__.tracking.Trackable):
    """The checkpointed host state of one table; a table with a host (and SSD) tier also
    saves where each ID's row lives, the device cache's order and the host-tier rows of the
    embedding and of each optimizer slot (the Session path's tier fields)."""

    def __init__(self, table_key: str, table_name: str):
        self._table_key = table_key
        self._table_name = table_name
        self._tiered = bool(loader.engine().is_tiered(table_key))
        self._fields = host_state.FIELDS + (host_state.TIER_FIELDS if self._tiered else ())

    def _serialize_to_tensors(self):
        with tf.device("/device:CPU:0"):
            tensors = loader.op_library().mxrec_export_table(table_key=self._table_key)
        return {field: tensor for (field, _), tensor in zip(self._fields, tensors)}

    def _restore_from_tensors(self, restored_tensors):
        inputs = [restored_tensors[field] if dtype == tf.string
                  else tf.cast(restored_tensors[field], dtype) for field, dtype in self._fields]
        with tf.device("/device:CPU:0"):
            if self._tiered:
                return loader.op_library().mxrec_import_table_tiered(
                    *inputs, table_key=self._table_key)
            return loader.op_library().mxrec_import_table(*inputs, table_key=self._table_key)


class TableSlots(tf.__internal__.tracking.AutoTrackable):
    """An optimizer's table slots (and LazyAdam's table beta powers) as attributes, so that
    checkpoints find them by name (`<table>__<slot>`), also when they are created after a
    restore (deferred restoration)."""

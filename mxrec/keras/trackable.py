"""The host state of an mxrec.keras table in TF2 object-based checkpoints.

`HostState` is the Trackable an `Embedding` holds as `layer.host_state`: `tf.train.Checkpoint`
(and Keras' `save_weights` in the TF format) save the table's host state (IDs, rows, counts,
batch times, free rows, admission threshold: the fields of the Session path's
`HostStateSaveable`, by the same ops `MxrecExportTable` / `MxrecImportTable`, and the tier
fields and `MxrecImportTableTiered` for a table with a host tier) with the rows
in the layer's weight, and restore it into the engine. A snapshot that does not fit the table
is refused by the import op with an error naming the table, the table left as it was.
These formats take whole tensors: a table whose export would exceed `MXREC_TF_SAVER_MAX_MB`
is refused before anything is exported (`mxrec.core.host_state`; mxrec.keras' `KerasSaver`
streams such a table).

The Session path's checkpoints are name-based (`<table>/mxrec_host/<field>`), these are
object-based: the two formats do not read each other yet.
"""

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import host_state
from mxrec.distributed import communication


class HostState(tf.__internal__.tracking.Trackable):
    """The checkpointed host state of one table; a table with a host (and SSD) tier also
    saves where each ID's row lives, the device cache's order and the host-tier rows of the
    embedding and of each optimizer slot (the Session path's tier fields)."""

    def __init__(self, table_key: str, table_name: str, dim: int):
        self._table_key = table_key
        self._table_name = table_name
        self._dim = dim
        self._tiered = bool(loader.engine().is_tiered(table_key))
        self._fields = host_state.FIELDS + (host_state.TIER_FIELDS if self._tiered else ())

    def _serialize_to_tensors(self):
        refuse_on_ranks(self._table_name, "tf.train.Checkpoint / model.save_weights")
        with tf.device("/device:CPU:0"):
            guard = host_state.size_guard(self._table_name, self._table_key, self._dim,
                                          self._tiered)
            with tf.control_dependencies([guard]):
                tensors = loader.op_library().mxrec_export_table(table_key=self._table_key)
        return {field: tensor for (field, _), tensor in zip(self._fields, tensors)}

    def _restore_from_tensors(self, restored_tensors):
        refuse_on_ranks(self._table_name, "tf.train.Checkpoint / model.load_weights")
        inputs = [restored_tensors[field] if dtype == tf.string
                  else tf.cast(restored_tensors[field], dtype) for field, dtype in self._fields]
        with tf.device("/device:CPU:0"):
            if self._tiered:
                return loader.op_library().mxrec_import_table_tiered(
                    *inputs, table_key=self._table_key)
            return loader.op_library().mxrec_import_table(*inputs, table_key=self._table_key)

    # Keras 3's weights files (`model.save_weights("x.weights.h5")`) hold NumPy arrays by
    # name: the layer's save_own_variables / load_own_variables store these.
    def arrays(self) -> dict:
        """{"mxrec_host_<field>": NumPy array} of the host state now (eagerly); string
        fields (a tiered table's component names) as one uint8 array of their
        newline-joined UTF-8 bytes."""
        out = {}
        for field, tensor in self._serialize_to_tensors().items():
            value = tensor.numpy()
            if value.dtype == object:
                value = np.frombuffer("\n".join(v.decode() for v in value.reshape(-1))
                                      .encode(), np.uint8)
            out[ARRAY_PREFIX + field] = value
        return out

    def import_tensors(self, restored) -> None:
        """Imports the host state `tensors_of` read (the import op's errors for a snapshot
        that does not fit the table, the table left as it was)."""
        self._restore_from_tensors(restored)

    def tensors_of(self, arrays) -> dict:
        """{field: tensor} of what `arrays` saved, checked for every field.

        Raises:
            ValueError: a field missing (a weights file of a table without a host tier for
                one with it, or of another mxrec); the import op's errors for a snapshot
                that does not fit the table.
        """
        restored = {}
        for field, dtype in self._fields:
            name = ARRAY_PREFIX + field
            if name not in arrays:
                raise ValueError(
                    f"mxrec.keras.Embedding {self._table_name!r}: the weights file has no "
                    f"{name!r} (the table's host state{' with its host tier' * self._tiered})"
                    "; was it saved from another model?")
            value = np.asarray(arrays[name])
            if dtype == tf.string:
                text = value.astype(np.uint8).tobytes().decode()
                value = np.array(text.split("\n") if text else [], dtype=object)
            restored[field] = tf.constant(value, dtype if dtype == tf.string else None)
        return restored


ARRAY_PREFIX = "mxrec_host_"


def refuse_on_ranks(table_name: str, what: str) -> None:
    """Raises NotImplementedError on several ranks: TF2's object-based checkpoints and Keras
    weights files would hold one rank's shard under names every rank writes."""
    size = communication.get_rank_size()
    if size > 1:
        raise NotImplementedError(
            f"mxrec.keras.Embedding {table_name!r}: {what} on several ranks (rank_size={size}) "
            "is not available yet (each rank holds its shard of the table); use "
            "mk.callbacks.Checkpoint or mk.KerasSaver, which write the Session path's sharded "
            "format and restore on any rank count")


_BFLOAT16 = np.dtype(tf.bfloat16.as_numpy_dtype)


def to_store(value) -> np.ndarray:
    """A weight's value as a Keras weights file holds it: a bfloat16 array as its 16 bits
    (uint16, as mxrec's table files hold it: HDF5 has no bfloat16 type, and h5py could not
    read back the opaque type it would write)."""
    value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    return value.view(np.uint16) if value.dtype == _BFLOAT16 else value


def from_store(value) -> np.ndarray:
    """An array of a Keras weights file as the weight's value (`to_store` undone: no weight
    of mxrec.keras rests in uint16, so uint16 is bfloat16's bits)."""
    value = np.asarray(value)  # an h5py dataset read whole
    return value.view(_BFLOAT16) if value.dtype == np.uint16 else value


class BitsStore:
    """A Keras weights store that the layer's base-class saving writes through: each value
    as `to_store` gives it."""

    def __init__(self, store):
        self._store = store

    def __setitem__(self, key, value):
        self._store[key] = to_store(value)

    def __getitem__(self, key):
        return from_store(self._store[key])

    def keys(self):
        return list(self._store.keys())

    def __len__(self):
        return len(self.keys())


class StoreSubset:
    """Some keys of a Keras weights store, as a store (`keys()` and `[key]`, arrays read
    whole), for a base class's loading, which expects exactly its own variables' keys (the
    layer's and the optimizers' save_own_variables add mxrec's beside them)."""

    def __init__(self, store, keys):
        self._store, self._keys = store, list(keys)

    def keys(self):
        return list(self._keys)

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return from_store(self._store[key])

    def __len__(self):
        return len(self._keys)


class TableSlots(tf.__internal__.tracking.AutoTrackable):
    """An optimizer's table slots (and LazyAdam's table beta powers) as attributes, so that
    checkpoints find them by name (`<table>__<slot>`), also when they are created after a
    restore (deferred restoration)."""

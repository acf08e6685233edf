"""Dynamic expansion: tables whose storage grows with them (init(use_dynamic_expansion=True)).

A table of this mode has no fixed-size tf.Variable. Its rows live in an
engine-side store that grows in chunks as IDs are admitted
(`cc_ops/engine/dynamic_store.h`), addressed by int64 addresses: the row the
host key stage gave each ID. A lookup returns the embeddings as usual and
also publishes, per lookup, the unique rows it read and their addresses:

    ids [*S] -> key stage -> unique_rows [U], restore [N]
             -> addresses = int64(unique_rows)                         [U]
             -> local_emb = MxrecDynamicGather(addresses)             [U, dim]
             -> local_emb[restore] -> [*S, dim]

`local_emb` goes to the collections ASCEND_SPARSE_LOOKUP_LOCAL_EMB and
mxrec_sparse_lookup_local_emb, `addresses` to ASCEND_SPARSE_LOOKUP_ID_OFFSET
and mxrec_sparse_lookup_id_offset. Training differentiates the loss with
respect to `local_emb` and hands (gradient, address) pairs to a by-address
optimizer (`mxrec.optimizers.{gradient_descent,adagrad,lazy_adam}_by_addr`),
which updates the store's rows and its own slots there.

Rows are never reused (eviction is refused in this mode, as in mx_rec), so
the addresses a batch sees for the first time are exactly the new rows; the
lookup writes the table's initializer values into them before reading.

The store and its ops run on the CPU; there are no GPU kernels.

Example:
    >>> init(use_dynamic_expansion=True)
    >>> table = create_table(tf.int64, 8, "user", tf.constant_initializer(0.1),
    ...                      device_vocabulary_size=10_000)  # a chunk size hint only
    >>> emb = sparse_lookup(table, ids)                       # ids [B, 3] -> [B, 3, 8]
    >>> local_emb = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)  # [[U, 8]]
    >>> addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)  # [[U]]
    >>> grads = tf.gradients(loss, local_emb)
    >>> train = lazy_adam_by_addr.create_hash_optimizer_by_address(0.01).apply_gradients(
    ...     list(zip(grads, addresses)))
"""

import io
from typing import Dict, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from mxrec._lib import loader
from mxrec.constants.constants import (  # noqa: F401 (re-exported: their old import path)
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
    ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS,
    ID_OFFSET_COLLECTION,
    LOCAL_EMB_COLLECTION,
)
from mxrec.core.host_state import HostStateSaveable, over_limit_message, tf_saver_limit_mb
from mxrec.core.table import SparseEmbedding, pad_to_send_count, restore_rows

# The host table of a dynamic table never runs out of rows: its rows are the
# store's addresses, and the store grows to hold them.
HOST_CAPACITY = 2**31 - 1
MIN_CHUNK_ROWS = 256
# One chunk of the embedding (or of one slot) holds at most 2^24 floats (64 MiB).
MAX_CHUNK_FLOATS = 2**24
_CPU = "/device:CPU:0"

for _op in ("MxrecDynamicEnsureRows", "MxrecDynamicGather", "MxrecDynamicAssign",
            "MxrecDynamicApplySgd", "MxrecDynamicApplyAdagrad", "MxrecDynamicApplyLazyAdam"):
    tf.no_gradient(_op)


def chunk_rows_for(size_hint: int, dim: int) -> int:
    """Rows per chunk: the size hint, within [256, 2^24 / dim] rows."""
    return int(max(MIN_CHUNK_ROWS, min(size_hint, MAX_CHUNK_FLOATS // dim)))


class DynamicTable(SparseEmbedding):
    """A table of init(use_dynamic_expansion=True). Create it with `create_table`.

    Everything of SparseEmbedding, and no device variable: the rows live in the
    engine's dynamic store under `table_key`, made here. `device_vocabulary_size`
    is only the size hint that sets the chunk size.

    Attributes:
        chunk_rows: rows the store adds each time it grows.
        graph: the graph the table was created in.
    """

    is_dynamic = True

    def __init__(self, name, key_dtype, dim, initializer, size_hint, padding_keys, value_dtype,
                 table_key, key_stage_chain=None, static_shapes=False):
        super().__init__(name, key_dtype, dim, initializer, size_hint, padding_keys,
                         value_dtype, table_key, key_stage_chain)
        # init(use_dynamic=False): unique rows padded to send_count with address -1, which
        # no ID gets: its local_emb rows are zeros and the by-address optimizers skip it.
        self.pad_row = PAD_ADDRESS if static_shapes else None
        self.graph = tf.compat.v1.get_default_graph()
        self.chunk_rows = chunk_rows_for(size_hint, dim)
        loader.engine().create_dynamic_store(key=table_key, name=name, dim=dim,
                                             chunk_rows=self.chunk_rows)

    @property
    def variable(self):
        raise TypeError(
            f"table {self.table_name!r} was created with init(use_dynamic_expansion=True): its "
            "rows live in a dynamic store, not in a tf.Variable. Look it up with "
            "sparse_lookup (tensor IDs, modify_graph=True or a FeatureSpec), train it with "
            "create_hash_optimizer_by_address on the pairs of "
            "ASCEND_SPARSE_LOOKUP_LOCAL_EMB gradients and ASCEND_SPARSE_LOOKUP_ID_OFFSET "
            "addresses, and read it with mxrec.core.dynamic.export_values")

    def check_can_evict(self):
        raise ValueError(f"table {self.table_name!r}: {EVICTION_REFUSED}")

    def store_stats(self) -> Dict[str, int]:
        """The dynamic store: rows in use, rows allocated, chunks, chunk_rows, slots."""
        return dict(loader.engine().dynamic_store_stats(self.table_key))

    def capacity(self) -> int:
        """Rows the store has allocated so far (it grows by chunk_rows when full)."""
        return int(self.store_stats()["capacity"])

    def lookup_planned(self, ids, rows, restore, reused, is_train, default=None, is_grad=True,
                       send_count=None, scope=""):
        """The lookup from the key stage's plan. is_grad=False also keeps the lookup's rows
        and addresses out of the collections the by-address optimizers train from; reused
        rows and send_count do not occur in this mode (rows are never reused, shapes are
        dynamic)."""
        del reused
        planned_rows, planned_restore = rows, restore
        if send_count is not None:
            rows, restore = pad_to_send_count(self, rows, restore, send_count, scope)
        padded = None
        if self.pad_row is not None:
            # Padding is the tail of the rows (here, or the graph modifier's pipeline).
            padded = rows
            rows = rows[:tf.reduce_sum(tf.cast(rows >= 0, tf.int32))]
        with tf.device(_CPU):
            addresses = tf.cast(rows, tf.int64, name="addresses")
            deps = []
            if is_train:
                graph = tf.compat.v1.get_default_graph()
                # Training lookups of one table in a step share rows: a row an earlier
                # lookup made is initialised before a later lookup claims or reads it.
                deps = self.refills(graph)
                with tf.control_dependencies(deps):
                    fresh = _ops().mxrec_dynamic_ensure_rows(addresses,
                                                             table_key=self.table_key)
                values = self.reused_values(ids, planned_rows, planned_restore, fresh)
                if values is None:
                    values = self.initial_rows(
                        tf.size(fresh), required_for="with init(use_dynamic_expansion=True) "
                        "new rows are initialised as they are admitted")
                assign = _ops().mxrec_dynamic_assign(fresh, tf.cast(values, tf.float32),
                                                     table_key=self.table_key, dim=self.dim)
                self.register_refill(graph, assign)
                deps = deps + [assign]
            with tf.control_dependencies(deps):
                local_emb = _ops().mxrec_dynamic_gather(addresses, table_key=self.table_key,
                                                        dim=self.dim, name="local_emb")
            if padded is not None:
                pads = tf.zeros(tf.stack([tf.size(padded) - tf.size(rows), self.dim]))
                local_emb = tf.concat([local_emb, pads], axis=0, name="local_emb_padded")
                local_emb.set_shape(padded.shape.concatenate([self.dim]))
                addresses = tf.cast(padded, tf.int64, name="addresses_padded")
        out = self._finish(ids, restore_rows(local_emb, restore, default), default, is_grad)
        if is_train and is_grad:
            addresses._mxrec_dynamic_table = self  # lets the by-address optimizers find it
            for collection in (ASCEND_SPARSE_LOOKUP_LOCAL_EMB, LOCAL_EMB_COLLECTION):
                tf.compat.v1.add_to_collection(collection, local_emb)
            for collection in (ASCEND_SPARSE_LOOKUP_ID_OFFSET, ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS,
                               ID_OFFSET_COLLECTION):
                tf.compat.v1.add_to_collection(collection, addresses)
        return out


# What mx_rec documents (its user guide, appendix "training features", section on the
# "on-chip memory dynamic expansion mode"): the mode grows device (on-chip) tables, and
# "in on-chip memory dynamic expansion mode, feature eviction is not supported"; its code
# refuses DDR mode (a host tier) together with dynamic expansion.
EVICTION_REFUSED = (
    "eviction is not available with init(use_dynamic_expansion=True): mx_rec's user guide "
    "states that its on-chip memory dynamic expansion mode does not support feature eviction")
TIERS_REFUSED = (
    "host_vocabulary_size and ssd_vocabulary_size must be 0 with "
    "init(use_dynamic_expansion=True): mx_rec's user guide describes the mode as dynamic "
    "expansion of on-chip (device) memory, and mx_rec refuses DDR mode with it; the store "
    "grows in device memory and has no host or SSD tier")


# The address of static shapes' padding (init(use_dynamic=False)); no ID gets it.
PAD_ADDRESS = -1


def check_settings(name: str, host_vocabulary_size: int, ssd_vocabulary_size: int,
                   use_dynamic: bool) -> None:
    """create_table's checks of a table of this mode: no tiers. Static shapes
    (use_dynamic=False) work: local_emb and the addresses are padded to send_count."""
    del use_dynamic
    if host_vocabulary_size or ssd_vocabulary_size:
        raise ValueError(f"create_table {name!r}: {TIERS_REFUSED}")


def _ops():
    return loader.op_library()


def table_of_address(address, optimizer: str) -> DynamicTable:
    """The table whose training lookup made `address`; TypeError for any other tensor."""
    table = getattr(address, "_mxrec_dynamic_table", None)
    if table is not None:
        return table
    if getattr(address, "_mxrec_table", None) is not None:
        raise TypeError(
            f"{optimizer} updates tables of init(use_dynamic_expansion=True) by address; got "
            f"the variable of table {address._mxrec_table.table_name!r}. Train tables with a "
            "variable with create_hash_optimizer")
    label = getattr(address, "name", None) or type(address).__name__
    raise TypeError(
        f"{optimizer}: {label} is not an address tensor of a training lookup. Pass the tensors "
        "of tf.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET) themselves (not copies, slices "
        "or tf.identity of them)")


def export_values(table: DynamicTable, slot: str = "") -> Tuple[np.ndarray, np.ndarray]:
    """(ids [K] int64, values [K, dim] float32) of every admitted ID, ordered by address,
    as trained steps left them: batches planned ahead and not yet stepped (graph-modifier
    prefetch, an Estimator's input) are not part of the export, as in a checkpoint.

    slot: "" for the embedding, or an optimizer slot as store_stats()["slot_names"]
        lists them ("<optimizer name>/<slot>", e.g. "LazyAdamByAddress/m").
    """
    ids, rows = loader.engine().export_rows(table.table_key, at_boundary=True)
    values = loader.engine().dynamic_store_read(table.table_key, rows.astype(np.int64), slot)
    return ids, values


def write_rows(table: DynamicTable, addresses, values, slot: str = "",
               initial: float = 0.0) -> None:
    """Writes rows at addresses (marking them in use), e.g. when restoring a checkpoint
    after the host state: export_rows() gives each ID's address. A new slot starts
    every row at `initial`."""
    loader.engine().dynamic_store_write(table.table_key, np.asarray(addresses, np.int64),
                                        np.asarray(values, np.float32), slot, float(initial))


def _slot_initials(table: DynamicTable) -> Dict[str, float]:
    """{store slot name: initial value} of the by-address optimizers that train `table`."""
    out = {}
    for optimizer in table.optimizers:
        for slot in optimizer.get_slot_names():
            out[optimizer.store_slot(slot)] = optimizer.slot_initial_value(slot)
    return out


class StoreSaveable(HostStateSaveable):
    """A dynamic table's host state and the rows and slots of its store, for any TF Saver.

    A dynamic table has no variable, so the host state alone (ID -> address) would lose
    its rows in a tf.compat.v1.train.Saver (or Estimator) checkpoint. One more string
    tensor, `<table>/mxrec_host/dynamic_store`, holds as an .npz the addresses of the IDs
    admitted at the step boundary and their embedding and slot rows. Restoring imports
    the host state first (it hands out the addresses), then writes the rows back.

    That string holds the whole store (and is built from arrays of it): a store whose rows
    and slots would exceed `MXREC_TF_SAVER_MAX_MB` twice over is refused before any row is
    read, naming the table (mxrec's Saver streams such a table).
    """

    def __init__(self, table: DynamicTable):
        super().__init__(table.table_name, table.table_key, table.dim)
        self._table = table
        self._limit_mb = tf_saver_limit_mb()
        with tf.device(_CPU):
            blob = tf.py_function(self._export, [], tf.string,
                                  name=f"{table.table_name}_export_store")
        blob.set_shape([])
        self.specs.append(saveable_object.SaveSpec(
            blob, "", f"{table.table_name}/mxrec_host/dynamic_store"))

    def _export(self):
        table = self._table
        engine = loader.engine()
        host = engine.export_state(table.table_key, 0, False)
        addresses = host["rows"][host["rows"] >= 0].astype(np.int64)
        slots = _slot_initials(table)
        # The arrays and the .npz made of them are held at once.
        estimate = 2 * len(addresses) * (1 + len(slots)) * table.dim * 4
        if estimate > self._limit_mb * 2**20:
            raise ValueError(over_limit_message(
                table.table_name, "its dynamic store's rows and slots twice (arrays and .npz)",
                estimate, self._limit_mb))
        existing = set(engine.dynamic_store_stats(table.table_key)["slot_names"])
        arrays = {"addresses": addresses,
                  "embedding": engine.dynamic_store_read(table.table_key, addresses, "")}
        for slot, initial in slots.items():
            arrays[f"slot/{slot}"] = (
                engine.dynamic_store_read(table.table_key, addresses, slot) if slot in existing
                else np.full((len(addresses), table.dim), initial, np.float32))
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    def _import(self, blob):
        table = self._table
        arrays = np.load(io.BytesIO(blob.numpy()))
        addresses = arrays["addresses"]
        write_rows(table, addresses, arrays["embedding"])
        for slot, initial in _slot_initials(table).items():
            key = f"slot/{slot}"
            if key in arrays.files:
                write_rows(table, addresses, arrays[key], slot=slot, initial=initial)
        return np.int64(len(addresses))

    def restore(self, restored_tensors, restored_shapes):
        host = super().restore(restored_tensors[:-1], restored_shapes)
        with tf.device(_CPU), tf.control_dependencies([host]):
            blob = tf.reshape(restored_tensors[-1], [])
            return tf.py_function(self._import, [blob], tf.int64,
                                  name=f"{self._table.table_name}_import_store").op


def register_saveable(table: DynamicTable) -> StoreSaveable:
    """Adds the table's host state and store to the graph's SAVEABLE_OBJECTS collection."""
    saveable = StoreSaveable(table)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return saveable

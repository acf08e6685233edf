"""One table type per lookup mode, behind one lookup interface.

    SparseEmbedding   what every table has: its host state in the engine (ID map,
                      admission, eviction, statistics) and the lookup interface
      DeviceTable     device-only: a tf.Variable of device_vocabulary_size rows
        TieredTable   (mxrec.core.tiers) the variable caches a host-memory and SSD tier
      DynamicTable    (mxrec.core.dynamic) rows in a store that grows, by address

`create_table` (mxrec.core.embedding) picks the type once, from init() and the
table's settings. `sparse_lookup` gets a plan for the batch (the key stage in
the step, in the input pipeline, or from a FeatureSpec dataset) and hands it to
`table.lookup_planned`, which builds the device side:

    plan: unique_rows [U], restore [N], reused [R]
      -> the table's rows [U, dim] (new owners' rows refilled first, in training)
      -> rows[restore], the default row where restore == U -> [*S, dim]

and `table.slot_refills` gives a hash optimizer what to do to the slots of the
rows that changed owner before it updates.
"""

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.constants.constants import SPARSE_TABLE_COLLECTION
from mxrec.core import gather, initial_values, row_initializer, storage_dtype, wing
from mxrec.core.graph_state import existing_state, graph_state
from mxrec.util import registry

# The ways a lookup gets its plan (SparseEmbedding.check_lookup).
DIRECT, FEATURE_SPEC, MODIFY_GRAPH = "direct", "feature_spec", "modify_graph"

# A graph's tables live in its GraphState (mxrec.core.graph_state).
# init()'s `tables` holds the latest table of each name, which an Estimator's or Paddle's
# next graph replaces.


def register_in_graph(graph, table: "SparseEmbedding") -> None:
    graph_state(graph).tables[table.table_name] = table


def graph_tables(graph) -> Dict[str, "SparseEmbedding"]:
    """The tables created in `graph`, by name (the latest of a name, under any init())."""
    state = existing_state(graph)
    return {} if state is None else dict(state.tables)


def lookup_override(graph) -> Optional[Callable]:
    """What builds `graph`'s lookups instead of the key stage, or None: the serving
    export's core-op lookup (table, ids, scope, default) -> embeddings, which the export
    puts in the registry for its own graph (the core does not know about serving). The
    tables created in such a graph register no host-state saveable: their rows come from
    wherever the override reads them."""
    return registry.provided(registry.LOOKUP_OVERRIDE, graph=graph)


class SparseEmbedding:
    """One sparse table in one graph; the base of every table type. Create tables with
    `create_table`.

    Attributes:
        table_name: the user's name for the table.
        dim: row width.
        key_dtype: tf.int32 or tf.int64.
        device_vocabulary_size: rows in the device table (a chunk-size hint for dynamic
            tables).
        table_key: the engine's key of the host state.
        pad_row: the row static-shape padding points at (init(use_dynamic=False)), or None.
        host_vocabulary_size, ssd_vocabulary_size: the off-device tiers' sizes (0 here).
        is_dp: replicated on every rank (create_table(is_dp=True)) instead of sharded.
        by_id: create_table(init_by_id=True)'s draw (row_initializer.ByIdSpec): new IDs'
            first values come from the ID, not from their row; None otherwise.
        storage_dtype, slot_dtype, rounding: how rows and optimizer slots rest
            (mxrec.core.storage_dtype); float32 unless create_table says otherwise.
    """

    is_dp = False
    storage_dtype = tf.float32
    slot_dtype = tf.float32
    rounding = "nearest"
    rounding_seed = 0

    def __init__(self, name: str, key_dtype: tf.DType, dim: int, initializer,
                 device_vocabulary_size: int, padding_keys: Sequence[int],
                 value_dtype: tf.DType, table_key: str, key_stage_chain: Optional[Dict] = None):
        self.table_name = name
        self.key_dtype = key_dtype
        self.dim = dim
        self.initializer = initializer
        self.device_vocabulary_size = device_vocabulary_size
        self.padding_keys = list(padding_keys)
        self.value_dtype = value_dtype
        self.table_key = table_key
        self.access_and_evict_config: Optional[Dict] = None
        self.eviction_threshold: Optional[int] = None
        self.optimizers: List[tf.compat.v1.train.Optimizer] = []
        # Names of this table's lookups (name scopes and FeatureSpec names): set_threshold's
        # ids_name must be one of them.
        self.lookup_names = set()
        # The chain this table's key stages join (the graph's last op of a chain is in its
        # GraphState); shared by all tables when they share admission counts, so that every
        # table plans in lookup order.
        self._key_stage_chain = self if key_stage_chain is None else key_stage_chain
        self._reused_rows = {}
        self._refills = {}
        self.initializer_error: Optional[Exception] = None
        self.pad_row: Optional[int] = None
        self.host_vocabulary_size = 0
        self.ssd_vocabulary_size = 0
        self.by_id: Optional[row_initializer.ByIdSpec] = None

    # ------------------------------------------------------------ lookup interface

    def check_lookup(self, source: str) -> None:
        """Raises if this table type cannot serve lookups planned by `source`
        (DIRECT, FEATURE_SPEC or MODIFY_GRAPH)."""
        del source

    def lookup_planned(self, ids: tf.Tensor, rows: tf.Tensor, restore: tf.Tensor,
                       reused: tf.Tensor, is_train: bool, default: Optional[tf.Tensor] = None,
                       is_grad: bool = True, send_count: Optional[int] = None,
                       scope: str = "") -> tf.Tensor:
        """The device side of a lookup, from the plan of its batch.

        Args:
            ids: the lookup's IDs [*S].
            rows, restore, reused: the plan (unique rows [U], the position of each ID
                among them [N] with U for "no row", rows that change owner [R]).
            is_train: a training lookup (rows change owner, gradients flow).
            default: [dim] values of IDs without a row; zeros when None.
            is_grad: False stops the gradient at the lookup.
            send_count: pad the unique rows to this many (static shapes), or None.
            scope: the lookup's name, for messages.

        Returns:
            [*S, dim] float32.
        """
        raise NotImplementedError

    def slot_refills(self, optimizer, variable, graph) -> List[tf.Operation]:
        """What a hash optimizer runs before its update: the slots of the rows that the
        lookups of `graph` hand to new owners. Nothing by default."""
        del optimizer, variable, graph
        return []

    def _finish(self, ids: tf.Tensor, emb: tf.Tensor, default, is_grad: bool) -> tf.Tensor:
        """emb [N, dim] -> [*S, dim]; padding keys back to zeros where a default value
        filled them; the gradient stopped for is_grad=False."""
        if ids.shape.rank == 1:
            out = emb  # already [N, dim]: no reshape op (the owner's IDs on several ranks)
            out.set_shape(ids.shape.concatenate([self.dim]))
        else:
            out_shape = tf.concat([tf.shape(ids, out_type=tf.int32), [self.dim]], axis=0)
            out = tf.reshape(emb, out_shape)
            out.set_shape(ids.shape.concatenate([self.dim]))
        if default is not None:
            out = mask_padding_keys(self, ids, out)
        if not is_grad:
            out = tf.stop_gradient(out)
        return out

    # ------------------------------------------------------------------ host side

    @property
    def name(self) -> str:
        return self.table_name

    def stats(self) -> Dict[str, int]:
        """Host statistics: rows in use, IDs seen, admitted, rejected, evicted, ..."""
        return dict(loader.engine().stats(self.table_key))

    def size(self) -> int:
        """IDs that hold a row now, in every tier (mx_rec's `table.size()`)."""
        stats = self.stats()
        return int(stats["rows_in_use"] + stats.get("tier_ids", 0))

    def capacity(self) -> int:
        """Rows the table can hold: device + host + SSD rows (mx_rec's `table.capacity()`);
        a dynamic-expansion table answers with the rows its store has allocated."""
        return int(self.device_vocabulary_size + self.host_vocabulary_size
                   + self.ssd_vocabulary_size)

    def export_rows(self):
        """(ids, rows): the device row of every admitted ID, ordered by row."""
        return loader.engine().export_rows(self.table_key)

    def configure_admission(self, access_threshold=0.0, faae_coefficient=1.0, probability=1.0,
                            seed=0):
        """Sets the host's admission policy (count threshold, weight, probability)."""
        loader.engine().configure_admission(
            self.table_key, access_threshold=float(access_threshold),
            faae_coefficient=float(faae_coefficient), probability=float(probability),
            seed=int(seed))

    def evict(self, max_age_seconds: int) -> int:
        """Removes IDs unseen for more than max_age_seconds of batch time; returns how many.

        Batches planned ahead of their step (prefetch) count neither for the newest
        time nor for removal: their IDs stay until their step has run.
        """
        self.check_can_evict()
        return loader.engine().evict(self.table_key, int(max_age_seconds))

    def shrink(self, threshold: int) -> int:
        """PaddlePaddle's shrink: removes IDs unseen for `threshold` shrink calls (never an
        ID of a batch planned ahead of its step)."""
        self.check_can_evict()
        return loader.engine().shrink(self.table_key, int(threshold))

    def initial_rows(self, count: tf.Tensor, required_for: Optional[str] = None
                     ) -> Optional[tf.Tensor]:
        """Fresh initializer values for `count` rows, [count, dim] (by position; an
        init_by_id table's rows for new IDs come from `reused_values`).

        Some initializers cannot make rows for a count known only when the step
        runs (Keras' Glorot and Orthogonal need a static shape). Then the error
        is kept in `initializer_error` (eviction reports it) and this returns
        None, or, with `required_for` (what needs the rows), raises a ValueError
        that shows it.
        """
        shape = tf.stack([count, self.dim])
        value = getattr(self.initializer, "value", None)
        if value is not None and np.isscalar(value):
            return tf.fill(shape, tf.constant(value, self.value_dtype))
        # Variance scaling (mx_rec's examples use it): drawn with the whole table's spread.
        rows = row_initializer.rows_like_table(self.initializer, self.initial_shape(), count,
                                               self.value_dtype)
        if rows is not None:
            return rows
        try:
            return self.initializer(shape, dtype=self.value_dtype)
        except (TypeError, ValueError, NotImplementedError) as err:
            self.initializer_error = err
            if required_for is None:
                return None
            raise ValueError(f"table {self.table_name!r}: {required_for}, which "
                             f"{self._initializer_failure()}") from err

    def initial_shape(self) -> List[int]:
        """The shape the initializer filled at the start: the table variable's (its device
        rows), the size hint's for a table without one."""
        variable = self.__dict__.get("variable")
        if variable is not None and variable.shape.is_fully_defined():
            return variable.shape.as_list()
        return [int(self.device_vocabulary_size), int(self.dim)]

    def _initializer_failure(self) -> str:
        err = self.initializer_error
        return (f"its initializer ({type(self.initializer).__name__}) cannot do for a row "
                f"count known only when the step runs: it failed with {type(err).__name__}: "
                f"{err}. Use an initializer that takes a dynamic shape, such as "
                "tf.compat.v1.truncated_normal_initializer or constant_initializer")

    @property
    def can_reinitialize(self) -> bool:
        """Whether the initializer can refill evicted rows (False once it failed to)."""
        return self.initializer_error is None

    def check_can_evict(self):
        if self.initializer_error is not None:
            raise ValueError(
                f"table {self.table_name!r} cannot evict: re-initialising evicted rows needs "
                f"fresh rows, which {self._initializer_failure()}") from self.initializer_error

    def reused_values(self, ids, rows, restore, reused) -> Optional[tf.Tensor]:
        """With init_by_id, the first values [R, dim] of the IDs the plan (before any
        padding of rows and restore) hands the rows `reused`; None otherwise."""
        if self.by_id is None:
            return None
        return row_initializer.plan_rows_by_id(self.by_id, ids, rows, restore, reused,
                                               self.dim, self.value_dtype)

    def register_refill(self, graph, op):
        self._refills.setdefault(graph, []).append(op)

    def refills(self, graph) -> List:
        """This graph's ops so far that rewrite reused rows before a lookup reads them."""
        return list(self._refills.get(graph, ()))

    def register_reused_rows(self, graph, reused: tf.Tensor):
        self._reused_rows.setdefault(graph, []).append(reused)

    def reused_rows(self, graph) -> Optional[tf.Tensor]:
        """Rows that this graph's lookups hand to new IDs after eviction, in one tensor."""
        tensors = self._reused_rows.get(graph)
        if not tensors:
            return None
        return tensors[0] if len(tensors) == 1 else tf.concat(tensors, axis=0)

    def key_stage_dependency(self, graph, is_train: bool, op):
        """Chains this table's key stages in creation order.

        Two lookups of one table in one step must plan in a fixed order, or
        the rows new IDs receive (and so their initial values) would depend on
        scheduling.
        """
        chains = graph_state(graph).last_key_stage
        key = (id(self._key_stage_chain), is_train)
        previous = chains.get(key)
        chains[key] = (self._key_stage_chain, op)
        return previous[1] if previous is not None and previous[0] is self._key_stage_chain \
            else None

    def forget_key_stage(self, graph, op) -> None:
        """Later key stages of this table's chain no longer run after `op` (the graph
        modifier retired it)."""
        chains = graph_state(graph).last_key_stage
        for key in [k for k, (chain, last) in chains.items()
                    if chain is self._key_stage_chain and last is op]:
            del chains[key]


class DeviceTable(SparseEmbedding):
    """A device-only table ("HBM mode"): a resource variable of device_vocabulary_size rows.

    Args:
        device: where the variable lives (create_table picks the accelerator).
        static_shapes: init(use_dynamic=False): one more row, the padding row.
        storage: what holds storage_dtype, slot_dtype and rounding (a TableConfig), or None
            for float32 rows and slots.

    Attributes:
        variable: the device table [device_vocabulary_size, dim] in the storage dtype (one
            row more under init(use_dynamic=False): the padding row).
    """

    def __init__(self, name: str, key_dtype: tf.DType, dim: int, initializer,
                 device_vocabulary_size: int, padding_keys: Sequence[int],
                 value_dtype: tf.DType, table_key: str, device: str,
                 static_shapes: bool = False, key_stage_chain: Optional[Dict] = None,
                 storage=None):
        super().__init__(name, key_dtype, dim, initializer, device_vocabulary_size,
                         padding_keys, value_dtype, table_key, key_stage_chain)
        if storage is not None:
            self.storage_dtype = storage.storage_dtype
            self.slot_dtype = storage.slot_dtype
            self.rounding = storage.rounding
            self.rounding_seed = storage.rounding_seed
        # With static shapes the planned rows are padded to send_count; the
        # padding points at one extra row that no ID ever gets.
        self.pad_row = device_vocabulary_size if static_shapes else None
        rows = device_vocabulary_size + (1 if static_shapes else 0)
        # a constant fill stays a Fill op (its buffer the variable's alone)
        fill = initial_values.unfolded_initializer(initializer)
        if self.storage_dtype != value_dtype:
            fill = storage_dtype.StorageInitializer(fill, self.storage_dtype)
        with tf.device(device):
            self.variable = tf.compat.v1.get_variable(
                name,
                shape=[rows, dim],
                dtype=self.storage_dtype,
                initializer=fill,
                trainable=False,
                use_resource=True,
                collections=[wing.current().variables_collection(), SPARSE_TABLE_COLLECTION],
            )
        self.variable._mxrec_table = self  # lets the optimizers find the table
        wing.current().table_variable_created(self.variable)

    def lookup_planned(self, ids, rows, restore, reused, is_train, default=None, is_grad=True,
                       send_count=None, scope=""):
        by_id = self.reused_values(ids, rows, restore, reused) if is_train else None
        if send_count is not None:
            rows, restore = pad_to_send_count(self, rows, restore, send_count, scope)
        deps = self._refills_before_gather(reused, by_id) if is_train else []
        with tf.control_dependencies(deps):
            unique_emb = storage_dtype.upcast(tf.gather(self.variable, rows))
        if send_count is None:
            # The key stage gives each distinct ID one row: the gradient's rows are
            # distinct, and the optimizer need not sum duplicates (padding repeats a row).
            graph_state(rows.graph).distinct_rows.add(rows.name)
        emb = restore_rows(unique_emb, restore, default, device=self.variable.device)
        if not is_train:
            emb = self._rows_off_the_device(ids, emb)
        return self._finish(ids, emb, default, is_grad)

    def _refills_before_gather(self, reused: tf.Tensor,
                               by_id: Optional[tf.Tensor] = None) -> List[tf.Operation]:
        """This lookup's refill of the rows changing owner, and the earlier lookups' of the
        step: an earlier lookup may have refilled a row that holds one of this lookup's IDs
        too, so the gather reads after every such refill."""
        graph = tf.compat.v1.get_default_graph()
        self.register_reused_rows(graph, reused)
        refill = self._refill(reused, by_id)
        deps = self.refills(graph)
        if refill is not None:
            deps = deps + [refill]
            self.register_refill(graph, refill)
        return deps

    def _refill(self, reused: tf.Tensor, by_id: Optional[tf.Tensor] = None
                ) -> Optional[tf.Operation]:
        """Rows freed by eviction and handed to new IDs start again from the initializer
        (the hash optimizers reset their slots, see slot_refills); with init_by_id every
        new ID's row, with the values drawn from its ID (by_id, [R, dim])."""
        required = None
        if self.eviction_threshold is not None:
            required = "eviction (eviction_threshold) re-initialises evicted rows"
        fresh = by_id if by_id is not None else self.initial_rows(tf.size(reused),
                                                                  required_for=required)
        if fresh is None:
            return None
        fresh = storage_dtype.store(fresh, self)
        return self.variable.scatter_update(tf.IndexedSlices(fresh, reused))

    def _rows_off_the_device(self, ids: tf.Tensor, emb: tf.Tensor) -> tf.Tensor:
        """Evaluation: emb [N, dim] with the rows of IDs kept off the device; none here."""
        del ids
        return emb

    def slot_refills(self, optimizer, variable, graph) -> List[tf.Operation]:
        """Each slot's rows of the reused rows back to the slot's initial value."""
        reused = self.reused_rows(graph)
        if reused is None:
            return []
        resets = []
        for slot_name, value in optimizer._slot_initial_values().items():  # noqa: SLF001
            slot = optimizer.get_slot(variable, slot_name)
            fresh = tf.fill(tf.stack([tf.size(reused), self.dim]),
                            tf.constant(value, slot.dtype.base_dtype))
            resets.append(slot.scatter_update(tf.IndexedSlices(fresh, reused)))
        return resets


def restore_rows(unique_emb, restore, default_row=None, device=None):
    """unique_emb [U, dim] gathered at restore [N] (U means the default row), with a dense
    gradient. default_row: [dim] for positions without a row; zeros when None. device:
    where the table's rows live; on the CPU one fused op (mxrec.core.gather)."""
    return gather.restore_rows(unique_emb, restore, default_row, device)


def pad_to_send_count(table: SparseEmbedding, rows, restore, send_count: int, scope: str):
    """Static shapes (init(use_dynamic=False)): unique rows padded to send_count.

    The padding points at the table's extra row, which no ID ever gets; the
    default index (len(rows)) moves to send_count.
    """
    num_unique = tf.size(rows)
    check = tf.debugging.assert_less_equal(
        num_unique, send_count,
        message=(f"sparse_lookup {scope!r} on table {table.table_name!r}: a batch has more "
                 f"unique IDs than send_count={send_count}; raise send_count or use "
                 "init(use_dynamic=True)"))
    with tf.control_dependencies([check]):
        padded = tf.concat([rows, tf.fill([send_count - num_unique],
                                          tf.constant(table.pad_row, tf.int32))], axis=0)
    padded.set_shape([send_count])
    restore = tf.where(restore >= num_unique, tf.fill(tf.shape(restore), send_count), restore)
    return padded, restore


def default_values(table: SparseEmbedding, serving_default_value) -> Optional[tf.Tensor]:
    """serving_default_value as a [dim] float32 tensor (None stays None)."""
    if serving_default_value is None:
        return None
    value = tf.convert_to_tensor(serving_default_value, tf.float32)
    if value.shape.rank not in (0, 1) or (value.shape.rank == 1
                                          and value.shape[0] not in (None, table.dim)):
        raise ValueError(f"sparse_lookup on table {table.table_name!r}: serving_default_value "
                         f"must be a scalar or a [{table.dim}] vector, got shape {value.shape}")
    return tf.broadcast_to(value, [table.dim])


def mask_padding_keys(table: SparseEmbedding, ids: tf.Tensor, emb: tf.Tensor) -> tf.Tensor:
    """emb [*S, dim] with zeros where ids are padding keys (which a default value skips)."""
    if not table.padding_keys:
        return emb
    pads = tf.constant(table.padding_keys, tf.int64)
    is_pad = tf.reduce_any(tf.equal(tf.expand_dims(tf.cast(ids, tf.int64), -1), pads), axis=-1)
    return tf.where(tf.expand_dims(is_pad, -1), tf.zeros_like(emb), emb)

"""`Embedding`: a Keras layer over an mxrec table, for eager code, tf.function and Model.fit.

The layer owns one table: its host state in the C++ engine (made as create_table makes it,
with create_table's checks) and its device rows as the layer's weight. A call runs the
same step as the Session path's direct lookup (mxrec.core.planners.direct_lookup):

    ids [*S] -> MxrecKeyStage (the engine's stateful op, on the CPU)
             -> unique_rows [U], restore [N], reused [R]
             -> rows handed to new owners refilled from the initializer (training)
             -> gather(weight, unique_rows) -> restore_rows(.., restore) -> [*S, dim]

Eagerly each op runs at once; inside a tf.function (Model.fit's train step among them) the
op is traced like any stateful op, and TensorFlow runs the stateful ops of a function in
program order, so a table's lookups of one step plan in call order as the Session path's
key-stage chain makes them. No tf.py_function on this path.

The gradient of the weight is IndexedSlices over the unique rows; mxrec.keras.optimizers
apply it to those rows only (and reset the slots of the rows in `reused` first).

A table with a host (and SSD) tier (host_vocabulary_size, ssd_vocabulary_size) swaps
instead of refilling, as the Session path's TieredTable does (mxrec.core.tiers): each
training lookup applies its plan to the weight (`tiers.apply_swap`: the rows in `reused`
go to the host tier, their new owners' rows come from it, or from the initializer), the
optimizer applies the same plans to its slots before its update, and evaluation reads the
rows of IDs in the host tier in place (`tiers.read_host_rows`).

On several ranks (the MPI engine) the same owner's part runs on the IDs this rank owns, inside
the Session path's sharded lookup (mxrec.distributed: `routing.route` or `replicated.route`,
`id_exchange.exchange`, `send_back.send_back` or `replicated.send_back`); several tables
share one exchange through mxrec.keras.group.EmbeddingGroup. docs/KERAS_RANKS.md.

With mxrec.keras.data.plan_ahead the key stage (one rank) or the routing (several ranks) has
run in the tf.data pipeline: the lookup takes its plan from mxrec.keras.planning instead.
"""

import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import embedding, gather, multi_hot, storage_dtype, tiers
from mxrec.core.arguments import table_config, validate_ids
from mxrec.core.table import SparseEmbedding, default_values
from mxrec.distributed import communication, id_exchange, replicated, routing, send_back
from mxrec.keras import _compat, planning, trackable
from mxrec.util import ops as mxrec_ops
from mxrec.util.config import get_config_initializer


class KerasTable(SparseEmbedding):
    """The table of one `Embedding` layer: SparseEmbedding's host side (stats, admission,
    evict, initial rows), the layer's weight as `variable`, and the rows each lookup hands to
    new owners, kept for the optimizer of the same step (`note_lookup` / `reused_for_update`).
    """

    def __init__(self, config, table_key: str):
        super().__init__(config.name, config.key_dtype, config.dim, config.initializer,
                         config.device_vocabulary_size, config.padding_keys, config.value_dtype,
                         table_key)
        self.variable: Optional[tf.Variable] = None
        self.host_vocabulary_size = config.host_vocabulary_size
        self.ssd_vocabulary_size = config.ssd_vocabulary_size
        self.is_dp = config.is_dp
        # Each rank's loss is the mean over its slice: the owner divides the ranks' summed
        # gradients of an ID by the rank count (the Session path's name for that rule).
        self.all2all_gradients_op = config.all2all_gradients_op
        # The training lookups not yet applied, (reused rows, the embedding's swap or None):
        # eagerly a list the optimizer empties; in a traced function one list per FuncGraph
        # (one step's trace).
        self._lookups_eager: List[Tuple[tf.Tensor, Optional[tf.Operation]]] = []
        self._lookups_traced = weakref.WeakKeyDictionary()
        self._swap_protect = 1  # the engine's default: one batch's rows are never victims
        self.storage_dtype, self.slot_dtype = config.storage_dtype, config.slot_dtype
        self.rounding, self.rounding_seed = config.rounding, config.rounding_seed
        # rounding="stochastic": the layer's weight counting the table's updates (the
        # Session path's `<table>/mxrec_rounding_updates`), read by the optimizers' seeds.
        self.rounding_updates: Optional[tf.Variable] = None

    @property
    def tiered(self) -> bool:
        """Whether the weight caches a host (and SSD) tier."""
        return self.host_vocabulary_size > 0

    def _lookups_now(self) -> list:
        if tf.executing_eagerly():
            return self._lookups_eager
        return self._lookups_traced.setdefault(tf.compat.v1.get_default_graph(), [])

    def before_training_lookup(self) -> None:
        """A tiered table: none of the step's lookups may take another's rows as swap
        victims (their gradients are still to come), so the engine protects the rows of as
        many batches as the step has lookups, counted before this one's key stage plans."""
        count = len(self._lookups_now()) + 1
        if self.tiered and count > self._swap_protect:
            loader.engine().set_swap_protect(self.table_key, count)
            self._swap_protect = count

    def note_lookup(self, reused: tf.Tensor, swap: Optional[tf.Operation] = None) -> None:
        """A training lookup of this step handed `reused` rows to new owners (by `swap`,
        the embedding's swap, in a tiered table)."""
        self._lookups_now().append((reused, swap))

    def lookups_for_update(self, optimizer_name: str
                           ) -> List[Tuple[tf.Tensor, Optional[tf.Operation]]]:
        """This step's training lookups, (reused [R] int32, the embedding's swap), in
        order, for the optimizer's slot resets or swaps. Eagerly the list empties; traced,
        it is the lookups of this function.

        Raises:
            RuntimeError: in a tf.function without a training lookup of this table (the
                lookup ran in another function or eagerly: its reused rows cannot reach this
                update).
        """
        if tf.executing_eagerly():
            lookups, self._lookups_eager = self._lookups_eager, []
            return lookups
        lookups = None
        graph = tf.compat.v1.get_default_graph()
        while graph is not None and lookups is None:
            lookups = self._lookups_traced.get(graph)
            graph = getattr(graph, "outer_graph", None)
        if lookups is None:
            raise RuntimeError(
                f"{optimizer_name}: the gradient of table {self.table_name!r} is applied in "
                "a tf.function that made no training lookup of it; call the layer (with "
                "training=True) and apply the gradients in the same tf.function, or both "
                "eagerly, so that the rows the lookup handed to new IDs get fresh slots")
        return lookups

    def reused_for_update(self, optimizer_name: str) -> tf.Tensor:
        """The rows this step's lookups handed to new owners, [R] int32 (for the optimizer's
        slot resets); see lookups_for_update."""
        tensors = [reused for reused, _ in self.lookups_for_update(optimizer_name)]
        if not tensors:
            return tf.zeros([0], tf.int32)
        return tensors[0] if len(tensors) == 1 else tf.concat(tensors, axis=0)


class Embedding(tf.keras.layers.Layer):
    """A Keras layer over an mxrec table addressed by raw int32/int64 IDs.

    Args:
        dim: row width.
        name: the table's name (also the layer's), unique among this init()'s tables.
        device_vocabulary_size: rows of the device table.
        embeddings_initializer: initial value of every row (a Keras or TF initializer);
            uniform in [-0.05, 0.05] as Keras' Embedding by default. Rows handed to new IDs
            after eviction are drawn from it again (it must take a shape known only when the
            step runs; constant and random initializers do).
        key_dtype: tf.int64 (default) or tf.int32.
        access_threshold: an ID gets a row once its weighted count reaches this (admission);
            until then it looks up as the default value and gets no gradient.
        eviction_threshold: seconds of batch time after which an unseen ID is removed by
            `evict()` (needs access_threshold, as in sparse_lookup); batch time comes from
            the call's `timestamp`.
        faae_coefficient: the weight of one occurrence in the admission count.
        padding_keys: an ID or IDs that look up as zeros and are never counted or updated.
        serving_default_value: a scalar or [dim] value for IDs without a row instead of
            zeros.
        init_param: scale applied to the initializer's values, in [-10, 10].
        is_grad: False stops the gradient at the lookup (IDs still count and get rows).
        combiner: None, "sum", "mean" or "sqrtn": multi-hot IDs combined per row as
            sparse_lookup(combiner=...) does (mxrec.core.multi_hot): tf.SparseTensor [B, K]
            (needs a combiner) -> [B, dim]; tf.RaggedTensor [B, (k)] -> [B, dim], or
            [B, (k), dim] with None; dense [*S, K] -> [*S, dim].
        host_vocabulary_size, ssd_vocabulary_size, ssd_data_path: the host and SSD tiers,
            as create_table's: the weight caches the rows of up to host_vocabulary_size
            (+ ssd_vocabulary_size) more IDs, optimizer slots included (mxrec.core.tiers).
        is_dp: on several ranks, the table replicated on every rank (every rank holds
            every ID's row and plans the global batch) instead of sharded by ID; the same
            as False on one rank.
        storage_dtype: the dtype the rows rest in (the weight, host and SSD tiers,
            checkpoints): tf.float32 (default), tf.bfloat16 or tf.float16 (or a name:
            "bfloat16", "bf16", "float16", "fp16", "half"), as create_table's. Lookups
            return float32, the mxrec.keras optimizers compute in float32 and store the
            updated rows rounded (mxrec.core.storage_dtype, docs/TIERS.md).
        slot_dtype: the dtype the optimizers' table slots rest in (default float32).
        rounding: "nearest" (round-to-nearest-even, default), "stochastic" or
            ("stochastic", seed): how updated rows and slots are rounded, as create_table's;
            stochastic rounding counts updates in the layer's weight
            `mxrec_rounding_updates` (saved with the model), so runs repeat.
        **kwargs: Keras Layer arguments (trainable, dtype must stay float32).

    Call:
        layer(ids, training=None, timestamp=None, weights=None): ids [*S] int32/int64 ->
        [*S, dim] (multi-hot IDs: see combiner; weights: per-ID combiner weights with the
        structure of ids).
        training=None trains (inserts and counts IDs) as sparse_lookup's is_train=True;
        Model.predict / evaluate pass training=False (unseen IDs look up as the default).
        timestamp: the batch's time in seconds (its max is taken), for eviction.

    Raises:
        NotImplementedError: a setting mxrec.keras does not offer yet (several ranks on
            the gRPC engine, init(use_dynamic=False), init(use_dynamic_expansion=True)).
    """

    def __init__(self, dim, name: str, device_vocabulary_size: int,
                 embeddings_initializer=None, key_dtype=tf.int64, access_threshold=None,
                 eviction_threshold=None, faae_coefficient=None, padding_keys=None,
                 serving_default_value=None, init_param: float = 1.0, is_grad: bool = True,
                 combiner: Optional[str] = None,
                 host_vocabulary_size: int = 0, ssd_vocabulary_size: int = 0,
                 ssd_data_path=(), is_dp: bool = False, storage_dtype=tf.float32,
                 slot_dtype=None, rounding="nearest", **kwargs):
        _compat.require_eager("mxrec.keras.Embedding")
        if kwargs.get("dtype") not in (None, "float32", tf.float32):
            raise TypeError(f"mxrec.keras.Embedding {name!r}: the layer computes in float32 "
                            f"(its lookups return float32), got dtype={kwargs['dtype']!r}; "
                            "storage_dtype= sets how the rows rest")
        for label, flag in (("is_grad", is_grad), ("is_dp", is_dp)):
            if not isinstance(flag, bool):
                raise TypeError(f"mxrec.keras.Embedding {name!r}: {label} must be a bool, got "
                                f"{flag!r}")
        super().__init__(name=name, **kwargs)
        # The key stage is a CPU op of mxrec's library, which XLA cannot compile: Keras 3
        # then leaves Model.fit's jit_compile="auto" off (Keras 2 never turns it on).
        self.supports_jit = False
        runtime = get_config_initializer()
        _refuse_unavailable(name, runtime)
        if embeddings_initializer is None:
            embeddings_initializer = tf.keras.initializers.RandomUniform(-0.05, 0.05)
        config = table_config(
            runtime, key_dtype, dim, name, embeddings_initializer, device_vocabulary_size,
            host_vocabulary_size, ssd_vocabulary_size, ssd_data_path, True, is_dp, init_param,
            "sum_gradients_and_div_by_ranksize", False, padding_keys, True, None, tf.float32, 1,
            True, 0, storage=dict(storage_dtype=storage_dtype, slot_dtype=slot_dtype,
                                  rounding=rounding))
        table_key = runtime.table_key(name)
        if name in runtime.tables and runtime.tables[name].table_key == table_key:
            raise ValueError(f"mxrec.keras.Embedding: a table named {name!r} already exists "
                             "under this init(); give each table its own name")
        if combiner is not None and combiner not in multi_hot.COMBINERS:
            raise ValueError(f"mxrec.keras.Embedding {name!r}: combiner must be None or one of "
                             f"{list(multi_hot.COMBINERS)}, got {combiner!r}")
        self.combiner = combiner
        self.dim = config.dim
        self.is_grad = is_grad
        policy = {key: value for key, value in (("access_threshold", access_threshold),
                                                ("eviction_threshold", eviction_threshold),
                                                ("faae_coefficient", faae_coefficient))
                  if value is not None}
        embedding.create_host_table(runtime, config, table_key)
        self.table = KerasTable(config, table_key)
        try:
            self._make_weight(config, policy, serving_default_value)
        except Exception:
            # Nothing of a refused layer stays: its name can be used again.
            if not any(runtime.table_key(other).startswith(table_key)
                       for other in runtime.tables if other != name):
                loader.engine().drop_prefix(table_key)  # the engine drops by prefix only
            runtime.tables.pop(name, None)
            runtime.admission_configs.pop(name, None)
            raise
        runtime.tables[name] = self.table

    def _make_weight(self, config, policy, serving_default_value) -> None:
        """The layer's weight (the device rows), its host-state trackable and its policy."""
        self._default = (None if serving_default_value is None
                         else default_values(self.table, serving_default_value))
        initializer = config.initializer
        if config.storage_dtype != tf.float32:
            initializer = _StorageInitializer(initializer, config.storage_dtype)
        self.embeddings = self.add_weight(
            name="embeddings", shape=[config.device_vocabulary_size, config.dim],
            dtype=config.storage_dtype, initializer=initializer, trainable=True)
        self.table.variable = _compat.tf_variable(self.embeddings)
        if config.rounding == "stochastic":
            self.table.rounding_updates = _compat.tf_variable(self.add_weight(
                name="mxrec_rounding_updates", shape=[], dtype=tf.int64,
                initializer="zeros", trainable=False))
        self.host_state = trackable.HostState(self.table.table_key, self.table.table_name,
                                             config.dim)
        for weight in {id(w): w for w in (self.embeddings, self.table.variable)}.values():
            weight._mxrec_keras_table = self.table  # noqa: SLF001 (the optimizers' marker)
        if policy:
            embedding.apply_access_and_evict_config(self.table, policy)

    # ------------------------------------------------------------------ the lookup

    _serving = None  # while mxrec.keras.export_serving traces: the table's core-op lookup

    def call(self, ids, training=None, timestamp=None, weights=None):
        where = f"mxrec.keras.Embedding {self.table.table_name!r}"
        if self._serving is not None:
            serving = self._serving

            def lookup(flat):
                return serving.lookup(flat, self._default, self.table.padding_keys)

            if (self.combiner is not None or weights is not None
                    or isinstance(ids, (tf.SparseTensor, tf.RaggedTensor))):
                multi_hot.check_combiner(where, ids, self.combiner, weights)
                return multi_hot.lookup(ids, self.combiner, weights, lookup, where)
            return lookup(ids)
        is_train = True if training is None else bool(training)
        stamp = None
        if timestamp is not None and is_train:
            stamp = tf.cast(tf.reduce_max(timestamp), tf.int64)
        if (self.combiner is not None or weights is not None
                or isinstance(ids, (tf.SparseTensor, tf.RaggedTensor))):
            multi_hot.check_combiner(where, ids, self.combiner, weights)
            return multi_hot.lookup(ids, self.combiner, weights,
                                    lambda flat: self._lookup(flat, is_train, stamp), where)
        return self._lookup(ids, is_train, stamp)

    def _lookup(self, ids, is_train: bool, stamp) -> tf.Tensor:
        """Dense IDs [*S] -> [*S, dim]: the key stage, the refill, the gather; on several
        ranks around the owner's part, the Session path's route, ID exchange and send-back
        (mxrec.distributed.sharded_lookup)."""
        ids = validate_ids(self.table, ids)
        if is_train:
            self.table.before_training_lookup()
        if communication.get_rank_size() == 1:
            return self._owned_lookup(ids, is_train, stamp)
        return self._sharded_lookup(ids, is_train, stamp)

    def _sharded_lookup(self, ids, is_train: bool, stamp) -> tf.Tensor:
        """Several ranks: this rank's unique IDs go to their owners (every rank for an
        is_dp=True table), each owner plans what it received with the occurrences as
        key-stage weights (admission counts the global batch) at the newest batch time of
        any rank, and the rows come back; backward, the owner sums the ranks' gradients of
        an ID, divided by the rank count (each rank's loss is the mean over its slice)."""
        size = communication.get_rank_size()
        router, back = ((replicated.route, replicated.send_back) if self.table.is_dp
                        else (routing.route, send_back.send_back))
        if stamp is not None:
            stamp = communication.allreduce(stamp, "max")
        scope = planning.current()
        routed = None if scope is None else scope.routed(self.table, ids, stamp, is_train)
        if routed is None:
            routed = router(tf.reshape(ids, [-1]), size)
        exchanged = id_exchange.exchange(self.table, routed, is_train, None)
        owned = self._owned_lookup(exchanged.owned, is_train, stamp, exchanged.weights)
        return back(self.table, owned, exchanged, routed, ids, 1.0 / size)

    def _owned_lookup(self, ids, is_train: bool, stamp, weights=None) -> tf.Tensor:
        """The lookup of IDs this rank owns ([*S] -> [*S, dim]); `weights`: the occurrences
        each ID stands for in the key stage (training on several ranks), or None."""
        planned = None
        # One rank: the key stage may have run in the input pipeline (mxrec.keras.data).
        # On several ranks this part plans what the exchange brought, in the step.
        scope = planning.current() if weights is None else None
        if scope is not None and communication.get_rank_size() == 1:
            planned = scope.owned(self.table, ids, stamp, is_train)
        if planned is None:
            (rows,), (restore,), (reused,), _ = mxrec_ops.key_stage(
                [tf.reshape(ids, [-1])], [self.table.table_key], is_train, timestamp=stamp,
                weights=None if weights is None else [weights])
        else:
            rows, restore, reused = planned
        variable = self.table.variable
        deps = []
        if is_train and self.table.tiered:
            deps = [self._swap(variable, reused)]
            self.table.note_lookup(reused, deps[0])
        elif is_train:
            self._refill(variable, reused)
            self.table.note_lookup(reused)
        with tf.control_dependencies(deps):
            unique_emb = storage_dtype.upcast_on_tape(tf.gather(variable, rows))
        emb = gather.restore_rows(unique_emb, restore, self._default, device=variable.device)
        if not is_train and self.table.tiered:
            emb = tiers.read_host_rows(self.table, ids, emb)
        return self.table._finish(ids, emb, self._default, self.is_grad)  # noqa: SLF001

    def _fresh_rows(self, count: tf.Tensor, required_for: Optional[str]):
        """[count, dim] rows from the initializer for IDs new to a row (Keras' random
        initializers drawn anew each time, others through SparseEmbedding.initial_rows),
        or None where the table needs none (initial_rows)."""
        fresh = _keras_random_rows(self.table.initializer, count, self.dim)
        if fresh is None:
            fresh = self.table.initial_rows(count, required_for=required_for)
        return fresh

    def _swap(self, variable: tf.Variable, reused: tf.Tensor) -> tf.Operation:
        """A tiered table: this lookup's plan applied to the weight before the gather reads
        it (TieredTable._refill), after the step's earlier lookups' swaps."""
        fresh = self._fresh_rows(tf.size(reused), "it has a host tier, so rows of new IDs "
                                 "are filled from its initializer as they arrive")
        earlier = [swap for _, swap in self.table._lookups_now()]  # noqa: SLF001
        return tiers.apply_swap(self.table.table_key, variable, reused, tiers.EMBEDDING,
                                fresh, after=earlier[-1:])

    def _refill(self, variable: tf.Variable, reused: tf.Tensor) -> None:
        """Rows handed to new IDs (after eviction) start again from the initializer, before
        the gather reads them (DeviceTable._refill)."""
        required = None
        if self.table.eviction_threshold is not None:
            required = "eviction (eviction_threshold) re-initialises evicted rows"
        fresh = self._fresh_rows(tf.size(reused), required)
        if fresh is not None:
            variable.scatter_update(tf.IndexedSlices(storage_dtype.store(fresh, self.table),
                                                     reused))

    def compute_output_shape(self, input_shape):
        shape = tf.TensorShape(input_shape)
        if self.combiner is not None:
            shape = shape[:-1]
        return shape.concatenate([self.dim])

    # ------------------------------------------------------------------ host side

    def evict(self, max_age_seconds: Optional[int] = None) -> int:
        """Removes IDs unseen for more than `max_age_seconds` (the layer's
        eviction_threshold by default) of batch time; returns how many. Call it between
        steps (eagerly), as EvictHook does in the Session path."""
        if max_age_seconds is None:
            if self.table.eviction_threshold is None:
                raise ValueError(f"mxrec.keras.Embedding {self.table.table_name!r}: evict() "
                                 "needs max_age_seconds, or eviction_threshold on the layer")
            max_age_seconds = self.table.eviction_threshold
        return self.table.evict(max_age_seconds)

    def stats(self):
        """The host table's statistics (rows in use, IDs seen, admitted, evicted, ...)."""
        return self.table.stats()

    def tier_stats(self):
        """A tiered table's rows per tier and swap traffic (mxrec.core.tiers.stats: tier_ids,
        host_rows, ssd_rows, swap_in_total, swap_out_total, fresh_total, ...).

        Raises:
            ValueError: the table has no host tier.
        """
        if not self.table.tiered:
            raise ValueError(f"mxrec.keras.Embedding {self.table.table_name!r} has no host "
                             "tier (host_vocabulary_size is 0): stats() has its statistics")
        return tiers.stats(self.table)

    def export_rows(self):
        """(ids, rows): the device row of every admitted ID, ordered by row (the IDs in the
        host and SSD tiers of a tiered table have no device row: see export_values)."""
        return self.table.export_rows()

    def export_values(self, optimizer=None) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
        """Every admitted ID's row, and with `optimizer` (an mxrec.keras optimizer) its table
        slots, wherever they live (device weight, host or SSD tier), as the Session path's
        tiers.export_values: {"embedding": (ids [n] int64 sorted, values [n, dim]),
        "<optimizer name>/<slot>": (ids, values), ...}. Call it between steps."""
        dense = {tiers.EMBEDDING: self.table.variable.numpy()}
        if optimizer is not None:
            for slot_name, slot in sorted(optimizer._slots_of(self.table).items()):  # noqa: SLF001
                dense[optimizer._tier_component(slot_name)] = slot.numpy()  # noqa: SLF001
        tiers.check_no_pending_plans(self.table, f"mxrec.keras.Embedding "
                                                 f"{self.table.table_name!r}.export_values")
        return tiers.collect_values(self.table.table_key, dense, self.table.tiered)

    # ------------------------------------------------------------------ weights files

    def save_own_variables(self, store):
        """Keras' weights files (`model.save_weights("x.weights.h5")`, Keras 3's only
        format): the layer's weight as Keras stores it, and the table's host state (the
        fields tf.train.Checkpoint saves, `trackable.HostState.arrays`) beside it."""
        trackable.refuse_on_ranks(self.table.table_name, "model.save_weights")
        super().save_own_variables(trackable.BitsStore(store))  # bfloat16 rows as bits
        for name, value in self.host_state.arrays().items():
            store[name] = value

    def load_own_variables(self, store):
        """Restores what save_own_variables stored: the weight, then the host state into
        the engine (refused, naming the table, when it does not fit; a file without the
        table's host-state fields is refused before the weight changes)."""
        trackable.refuse_on_ranks(self.table.table_name, "model.load_weights")
        keys = list(store.keys())
        host = self.host_state.tensors_of({k: store[k] for k in keys
                                           if k.startswith(trackable.ARRAY_PREFIX)})
        weights = trackable.StoreSubset(
            store, [k for k in keys if not k.startswith(trackable.ARRAY_PREFIX)])
        super().load_own_variables(weights)
        self.host_state.import_tensors(host)

    def get_config(self):
        raise NotImplementedError(
            f"mxrec.keras.Embedding {self.table.table_name!r}: serialising the layer "
            "(get_config, model.save, clone_model) is not available yet: its state is in the "
            "C++ engine")


class _StorageInitializer:
    """The weight's initial values in a half-precision storage dtype: `initializer`'s
    float32 values rounded to nearest (even), as create_table's StorageInitializer (whose
    call takes graph-mode arguments Keras initializers do not)."""

    def __init__(self, initializer, dtype: tf.DType):
        self.initializer, self.dtype = initializer, dtype

    def __call__(self, shape, dtype=None, **kwargs):
        del dtype, kwargs
        return tf.cast(self.initializer(shape, dtype=tf.float32), self.dtype)


def _keras_random_rows(initializer, count: tf.Tensor, dim: int) -> Optional[tf.Tensor]:
    """[count, dim] fresh rows of Keras' RandomUniform / RandomNormal / TruncatedNormal by
    TensorFlow's stateful random ops (new values at every step, as the Session path's refill
    draws), or None for other initializers. A Keras random initializer called again would
    warn and give the same values at every call."""
    name = type(initializer).__name__
    if name not in ("RandomUniform", "RandomNormal", "TruncatedNormal"):
        return None
    seed = getattr(initializer, "seed", None)
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    shape = tf.stack([count, dim])
    if name == "RandomUniform":
        return tf.random.uniform(shape, float(initializer.minval), float(initializer.maxval),
                                 tf.float32, seed=seed)
    draw = tf.random.normal if name == "RandomNormal" else tf.random.truncated_normal
    return draw(shape, float(initializer.mean), float(initializer.stddev), tf.float32, seed=seed)


def _refuse_unavailable(name, runtime) -> None:
    where = f"mxrec.keras.Embedding {name!r}"
    config = runtime.config
    cluster = communication.cluster()
    if config.rank_size > 1 and (cluster is None or cluster.engine != "mpi"):
        raise NotImplementedError(
            f"{where}: several ranks (rank_size={config.rank_size}) train in mxrec.keras on "
            "the MPI engine only (`python -m mxrec.launch -n N` where mxrec's MPI ops were "
            "built, or MXREC_EXCHANGE=mpi under mpirun); this job uses the gRPC engine, whose "
            "collectives need a Session: use the Session API there (docs/MULTIWORKER.md)")
    if not config.use_dynamic:
        raise NotImplementedError(
            f"{where}: init(use_dynamic=False) (unique rows padded to send_count) is not "
            "available in mxrec.keras yet; use init(use_dynamic=True), the default")
    if config.use_dynamic_expansion:
        raise NotImplementedError(
            f"{where}: init(use_dynamic_expansion=True) is not available in mxrec.keras yet; "
            "leave it out (a device table of device_vocabulary_size rows)")


def embedding_layers(model) -> List[Embedding]:
    """The mxrec.keras Embedding layers of `model`, nested models included, once each."""
    found, seen = [], set()

    def walk(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        if isinstance(layer, Embedding):
            found.append(layer)
        # A model's layers, and an EmbeddingGroup's members (mxrec.keras.group).
        for inner in [*(getattr(layer, "layers", ()) or ()),
                      *(getattr(layer, "members", ()) or ())]:
            walk(inner)

    walk(model)
    return found

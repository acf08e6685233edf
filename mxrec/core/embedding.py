"""Sparse tables addressed by raw IDs: `create_table` and `sparse_lookup`.

A table is a device variable of `device_vocabulary_size` rows plus a host
record per ID (kept by the C++ engine). A lookup runs the host key stage on
the IDs (dedupe, count, admit, give rows), gathers the batch's unique rows
from the device table and spreads them back to the input positions:

    ids [*S] -> key stage -> unique_rows [U], restore [N]
             -> gather(table, unique_rows) [U, dim] -> rows[restore] -> [*S, dim]

The gradient reaches the table as IndexedSlices over the unique rows, which
the hash optimizers in `mxrec.optimizers` apply to the touched rows only.
"""

import weakref
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import sharding, tiers
from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import planned_tensors
from mxrec.saver import host_state, serving
from mxrec.util import communication
from mxrec.util import ops as mxrec_ops
from mxrec.util.device import accelerator_device
from mxrec.util.initialize import get_config_initializer

SPARSE_TABLE_COLLECTION = "mxrec_sparse_tables"
# A tensor of batch times (seconds, any shape); the batch's time is its max.
# Without one, the host key stage stamps IDs with the wall clock.
TIMESTAMP_COLLECTION = "mxrec_batch_timestamp"
_EVICT_CONFIG_KEYS = ("access_threshold", "eviction_threshold", "faae_coefficient")
# Lookups made with modify_graph=True, per graph, for the graph modifier to
# rewire. Kept beside the graph rather than in a graph collection, which
# MetaGraph export would try (and fail) to serialise.
_MODIFY_GRAPH_LOOKUPS = weakref.WeakKeyDictionary()


def _modify_graph_lookups(graph) -> List["LookupRecord"]:
    return _MODIFY_GRAPH_LOOKUPS.setdefault(graph, [])


def modify_graph_lookups(graph) -> List["LookupRecord"]:
    """The lookups of `graph` made with modify_graph=True, in creation order."""
    return list(_MODIFY_GRAPH_LOOKUPS.get(graph, ()))


# graph -> {table name: the table created in that graph}. init()'s `tables` holds the
# latest table of each name, which an Estimator's or Paddle's second graph replaces.
_GRAPH_TABLES = weakref.WeakKeyDictionary()


def graph_tables(graph) -> Dict[str, "SparseEmbedding"]:
    """The tables created in `graph`, by name (the latest of a name, under any init())."""
    return dict(_GRAPH_TABLES.get(graph, {}))

_KEY_DTYPES = (tf.int32, tf.int64)


class SparseEmbedding:
    """One sparse table in one graph. Create it with `create_table`.

    Attributes:
        table_name: the user's name for the table.
        dim: row width.
        key_dtype: tf.int32 or tf.int64.
        device_vocabulary_size: rows in the device table.
        variable: the device table, a resource variable [device_vocabulary_size, dim]
            (one row more under init(use_dynamic=False): the padding row).
        table_key: the engine's key of the host state.
    """

    def __init__(
        self,
        name: str,
        key_dtype: tf.DType,
        dim: int,
        initializer,
        device_vocabulary_size: int,
        padding_keys: Sequence[int],
        value_dtype: tf.DType,
        table_key: str,
        static_shapes: bool = False,
        key_stage_chain: Optional[Dict] = None,
    ):
        self._init_host_side(name, key_dtype, dim, initializer, device_vocabulary_size,
                             padding_keys, value_dtype, table_key, key_stage_chain)
        # With static shapes the planned rows are padded to send_count; the
        # padding points at one extra row that no ID ever gets.
        self.pad_row = device_vocabulary_size if static_shapes else None
        rows = device_vocabulary_size + (1 if static_shapes else 0)
        with tf.device(accelerator_device()):
            self.variable = tf.compat.v1.get_variable(
                name,
                shape=[rows, dim],
                dtype=value_dtype,
                initializer=initializer,
                trainable=False,
                use_resource=True,
                collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, SPARSE_TABLE_COLLECTION],
            )
        self.variable._mxrec_table = self  # lets the optimizers find the table

    def _init_host_side(self, name, key_dtype, dim, initializer, device_vocabulary_size,
                        padding_keys, value_dtype, table_key, key_stage_chain):
        """Everything but the device storage (which dynamic tables keep elsewhere)."""
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
        # (graph, is_train) -> the last key-stage op; shared by all tables when
        # they share admission counts, so that every table plans in lookup order.
        self._last_key_stage = {} if key_stage_chain is None else key_stage_chain
        self._reused_rows = {}
        self._refills = {}
        self.initializer_error: Optional[Exception] = None
        self.host_vocabulary_size = 0
        self.ssd_vocabulary_size = 0

    @property
    def name(self) -> str:
        return self.table_name

    def stats(self) -> Dict[str, int]:
        """Host statistics: rows in use, IDs seen, admitted, rejected, evicted, ..."""
        return dict(loader.engine().stats(self.table_key))

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
        """Fresh initializer values for `count` rows, [count, dim].

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
        try:
            return self.initializer(shape, dtype=self.value_dtype)
        except (TypeError, ValueError, NotImplementedError) as err:
            self.initializer_error = err
            if required_for is None:
                return None
            raise ValueError(f"table {self.table_name!r}: {required_for}, which "
                             f"{self._initializer_failure()}") from err

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
        previous = self._last_key_stage.get((graph, is_train))
        self._last_key_stage[(graph, is_train)] = op
        return previous


class LookupRecord:
    """A lookup built with modify_graph=True.

    The graph modifier moves the key stage (`rows.op`) into the input pipeline:
    it computes `ids` from the dataset's elements there and rewires every
    consumer of `rows`, `restore` and `reused` (the forward lookup, its
    gradient, the re-initialisation of reused rows and the optimizers' slot
    resets) to the planned values that arrive with the batch.
    """

    def __init__(self, table, ids, rows, restore, reused, is_train, send_count):
        self.table = table
        self.ids = ids
        self.rows = rows
        self.restore = restore
        self.reused = reused
        self.is_train = is_train
        self.send_count = send_count


def _check_name(name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"create_table: name must be a non-empty string, got {name!r}")


_ALL2ALL_GRADIENTS_OPS = ("sum_gradients", "sum_gradients_and_div_by_ranksize")


def _check_mx_rec_table_options(name, is_dp, init_param, all2all_gradients_op, enable_merge,
                                padding_keys_mask, padding_keys_len, shard_num,
                                fusion_optimizer_var, hashtable_threshold):
    """Checks create_table's mx_rec parameters that steer distribution or storage layout.

    Each takes effect, is equivalent in mxrec's single process, or is refused: README.md's
    compatibility table says which.
    """
    where = f"create_table {name!r}"
    for label, value in (("is_dp", is_dp), ("enable_merge", enable_merge),
                         ("padding_keys_mask", padding_keys_mask),
                         ("fusion_optimizer_var", fusion_optimizer_var)):
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {label} must be a bool, got {value!r}")
    if (isinstance(init_param, bool) or not isinstance(init_param, (int, float, np.number))
            or not -10.0 <= init_param <= 10.0):
        raise ValueError(f"{where}: init_param must be a number in [-10, 10], got {init_param!r}")
    if all2all_gradients_op not in _ALL2ALL_GRADIENTS_OPS:
        raise ValueError(f"{where}: all2all_gradients_op must be one of "
                         f"{list(_ALL2ALL_GRADIENTS_OPS)}, got {all2all_gradients_op!r}")
    if padding_keys_len is not None and (
            isinstance(padding_keys_len, bool)
            or not isinstance(padding_keys_len, (int, np.integer)) or padding_keys_len <= 0):
        raise ValueError(f"{where}: padding_keys_len must be None or a positive int, got "
                         f"{padding_keys_len!r}")
    for label, value, lowest, highest in (("shard_num", shard_num, 1, 8192),
                                          ("hashtable_threshold", hashtable_threshold, 0,
                                           2**31 - 1)):
        if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                or not lowest <= value <= highest):
            raise ValueError(f"{where}: {label} must be an int in [{lowest}, {highest}], got "
                             f"{value!r}")
    if enable_merge:
        raise NotImplementedError(
            f"{where}: enable_merge=True (merging tables of equal settings into one) is not "
            "available; each table keeps its own storage. Leave enable_merge out")
    if shard_num != 1:
        raise NotImplementedError(
            f"{where}: shard_num={shard_num} (partitioning a table over devices) is not "
            "available; a table lives on one device. Leave shard_num out")
    if hashtable_threshold != 0:
        raise NotImplementedError(
            f"{where}: hashtable_threshold={hashtable_threshold} (a linear table for small "
            "vocabularies) is not available; every table maps IDs through a hash map. Leave "
            "hashtable_threshold out")


def create_table(
    key_dtype,
    dim,
    name: str,
    emb_initializer,
    device_vocabulary_size: int = 1,
    host_vocabulary_size: int = 0,
    ssd_vocabulary_size: int = 0,
    ssd_data_path=(),
    is_save: bool = True,
    is_dp: bool = False,
    init_param: float = 1.0,
    all2all_gradients_op: str = "sum_gradients",
    enable_merge: bool = False,
    padding_keys=None,
    padding_keys_mask: bool = True,
    padding_keys_len: Optional[int] = None,
    value_dtype=tf.float32,
    shard_num: int = 1,
    fusion_optimizer_var: bool = True,
    hashtable_threshold: int = 0,
) -> SparseEmbedding:
    """Creates a sparse table addressed by raw IDs.

    The parameters are mx_rec's, in its order. Those about several processes or
    devices (is_dp, all2all_gradients_op) are equivalent in mxrec's single
    process; storage choices mxrec does not have (enable_merge, shard_num > 1,
    hashtable_threshold > 0) raise NotImplementedError.

    Args:
        key_dtype: tf.int64 or tf.int32; every value of the type is a valid ID.
        dim: row width (int or TensorShape of rank 1).
        name: table name, unique among this init()'s tables.
        emb_initializer: any TF initializer; initial value of every row.
        device_vocabulary_size: rows the device table holds.
        host_vocabulary_size: rows kept in host memory for IDs outside the device table,
            which becomes a cache ("DDR mode", see mxrec.core.tiers); 0 = device-only.
        ssd_vocabulary_size: rows kept on disk once host memory is full ("SSD mode");
            needs host_vocabulary_size > 0 and ssd_data_path.
        ssd_data_path: a directory (or a one-element list of one) for the SSD tier's file.
        is_save: save and restore the table (device rows, slots and host state) with the
            graph's Saver.
        is_dp: data-parallel table; with one process the same table as is_dp=False.
        init_param: scale applied to the initializer's values, in [-10, 10].
        all2all_gradients_op: on several ranks, how the ranks' gradients of an ID combine
            at its owner: "sum_gradients" adds them, "sum_gradients_and_div_by_ranksize" adds
            and divides by the rank count (for a loss averaged over each rank's batch); the
            same with one process (rank size 1).
        enable_merge: only False (NotImplementedError otherwise).
        padding_keys: an ID or IDs that look up as zeros and are never counted or updated.
        padding_keys_mask: True (the default here; mx_rec's default is False) masks
            padding_keys; False makes them ordinary IDs, as in mx_rec.
        padding_keys_len: mx_rec's size of the masked feature; not needed (the host masks
            each ID), checked to be None or a positive int.
        value_dtype: tf.float32.
        shard_num: only 1 (NotImplementedError otherwise).
        fusion_optimizer_var: mx_rec's storage of optimizer slots beside the rows; mxrec
            keeps slots as their own variables whatever the value, with the same updates.
        hashtable_threshold: only 0, a hash map for every table (NotImplementedError
            otherwise).

    Returns:
        The SparseEmbedding.

    Raises:
        TypeError, ValueError: a parameter of the wrong type or out of range.
        NotImplementedError: enable_merge=True, shard_num > 1, hashtable_threshold > 0, or
            several ssd_data_path directories.

    Example:
        >>> table = create_table(tf.int64, 16, "user_table",
        ...                      tf.compat.v1.truncated_normal_initializer(stddev=0.05),
        ...                      device_vocabulary_size=100_000)
        >>> emb = sparse_lookup(table, ids)  # ids [B, 3] int64 -> emb [B, 3, 16]
    """
    runtime = get_config_initializer()
    _check_name(name)
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype not in _KEY_DTYPES:
        raise TypeError(f"create_table {name!r}: key_dtype must be tf.int64 or tf.int32, "
                        f"got {key_dtype.name}")
    if isinstance(dim, tf.TensorShape):
        if dim.rank != 1 or dim[0] is None:
            raise ValueError(f"create_table {name!r}: dim must be a rank-1 shape, got {dim}")
        dim = int(dim[0])
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
        raise ValueError(f"create_table {name!r}: dim must be a positive int, got {dim!r}")
    if (isinstance(device_vocabulary_size, bool)
            or not isinstance(device_vocabulary_size, (int, np.integer))
            or not 0 < device_vocabulary_size < 2**31):
        raise ValueError(f"create_table {name!r}: device_vocabulary_size must be in [1, 2^31), "
                         f"got {device_vocabulary_size!r}")
    host_size, ssd_size, ssd_path = tiers.check_settings(name, host_vocabulary_size,
                                                         ssd_vocabulary_size, ssd_data_path)
    value_dtype = tf.as_dtype(value_dtype)
    if value_dtype != tf.float32:
        raise TypeError(f"create_table {name!r}: value_dtype must be tf.float32, "
                        f"got {value_dtype.name}")
    if padding_keys is None:
        padding_keys = []
    elif isinstance(padding_keys, (int, np.integer)):
        padding_keys = [int(padding_keys)]
    padding_keys = [int(k) for k in padding_keys]
    _check_mx_rec_table_options(name, is_dp, init_param, all2all_gradients_op, enable_merge,
                                padding_keys_mask, padding_keys_len, shard_num,
                                fusion_optimizer_var, hashtable_threshold)
    if not padding_keys_mask:
        padding_keys = []  # mx_rec: without the mask, padding keys train like any ID
    if is_dp and communication.get_rank_size() > 1:
        raise NotImplementedError(
            f"create_table {name!r}: is_dp=True (a table replicated on every rank) is not "
            "available on several ranks; tables are sharded across the ranks (is_dp=False)")
    if emb_initializer is None:
        raise ValueError(f"create_table {name!r}: emb_initializer is required")
    initializer = emb_initializer
    if init_param != 1.0:
        def initializer(shape, dtype=tf.float32, partition_info=None):
            del partition_info
            return emb_initializer(shape, dtype) * init_param

    if runtime.config.use_dynamic_expansion:
        from mxrec.core import dynamic  # deferred: dynamic imports this module

        table = dynamic.create_table(runtime, name, key_dtype, int(dim), initializer,
                                     int(device_vocabulary_size), padding_keys, value_dtype,
                                     is_save, tiers=(host_vocabulary_size, ssd_vocabulary_size))
        table.all2all_gradients_op = all2all_gradients_op
        _GRAPH_TABLES.setdefault(tf.compat.v1.get_default_graph(), {})[name] = table
        return table
    table_key = runtime.table_key(name)
    previous = runtime.tables.get(name)
    if previous is not None and previous.variable.graph is tf.compat.v1.get_default_graph():
        raise ValueError(f"create_table: a table named {name!r} already exists in this graph")
    loader.engine().create_table(
        key=table_key, name=name, dim=int(dim), capacity=int(device_vocabulary_size),
        padding_keys=padding_keys, access_threshold=0.0, faae_coefficient=1.0,
        host_capacity=host_size, ssd_capacity=ssd_size, ssd_path=ssd_path)
    if runtime.config.use_combine_faae:
        # USE_COMBINE_FAAE: one admission count per ID over all tables.
        loader.engine().share_counts(table_key, runtime.table_key("__combined_faae__"))
    table = SparseEmbedding(name, key_dtype, int(dim), initializer, int(device_vocabulary_size),
                            padding_keys, value_dtype, table_key,
                            static_shapes=not runtime.config.use_dynamic,
                            key_stage_chain=(runtime.shared_key_stage_chain
                                             if runtime.config.use_combine_faae else None))
    table.host_vocabulary_size = host_size
    table.ssd_vocabulary_size = ssd_size
    if is_save and not serving.in_serving_export():
        host_state.register(name, table_key)
    table.all2all_gradients_op = all2all_gradients_op
    runtime.tables[name] = table
    _GRAPH_TABLES.setdefault(tf.compat.v1.get_default_graph(), {})[name] = table
    return table


def _apply_access_and_evict_config(table: SparseEmbedding, config: Dict):
    if not isinstance(config, dict):
        raise TypeError(f"table {table.table_name!r}: access_and_evict_config must be a dict, "
                        f"got {type(config).__name__}")
    unknown = sorted(set(config) - set(_EVICT_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"table {table.table_name!r}: unknown access_and_evict_config keys "
                         f"{unknown}; known: {list(_EVICT_CONFIG_KEYS)}")
    access = config.get("access_threshold")
    eviction = config.get("eviction_threshold")
    coefficient = config.get("faae_coefficient", 1)
    if eviction is not None and access is None:
        raise ValueError(f"table {table.table_name!r}: eviction_threshold needs "
                         "access_threshold in access_and_evict_config (as in mx_rec)")
    for label, value, lowest in (("access_threshold", access, 0),
                                 ("eviction_threshold", eviction, 0),
                                 ("faae_coefficient", coefficient, 1)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest:
            raise ValueError(f"table {table.table_name!r}: access_and_evict_config "
                             f"{label} must be an int >= {lowest}, got {value!r}")
    if eviction is not None and table.initializer_error is not None:
        raise ValueError(f"table {table.table_name!r}: eviction (eviction_threshold) "
                         "re-initialises evicted rows, which "
                         f"{table._initializer_failure()}") from table.initializer_error
    if eviction is not None and get_config_initializer().config.use_dynamic_expansion:
        raise ValueError(f"table {table.table_name!r}: eviction is not available with "
                         "init(use_dynamic_expansion=True), as in mx_rec")
    if table.access_and_evict_config not in (None, config):
        raise ValueError(f"table {table.table_name!r}: two lookups give different "
                         "access_and_evict_config; one table has one policy")
    table.access_and_evict_config = dict(config)
    table.eviction_threshold = None if eviction is None else int(eviction)
    # The host table outlives graphs: configure it once per policy, so that
    # rebuilding the model (an Estimator's next mode) keeps set_threshold changes.
    applied = get_config_initializer().admission_configs
    if applied.get(table.table_name) != config:
        table.configure_admission(access_threshold=access or 0, faae_coefficient=coefficient)
        applied[table.table_name] = dict(config)


def _batch_timestamp() -> Optional[tf.Tensor]:
    stamps = tf.compat.v1.get_collection(TIMESTAMP_COLLECTION)
    if not stamps:
        return None
    return tf.cast(tf.reduce_max(stamps[-1]), tf.int64)


def add_timestamp(timestamps: tf.Tensor) -> None:
    """Declares the batch's time feature (seconds); later lookups stamp IDs with its max."""
    tf.compat.v1.add_to_collection(TIMESTAMP_COLLECTION, timestamps)


def _restore_rows(unique_emb, restore, default_row=None):
    """unique_emb [U, dim] gathered at restore [N] (U means the default row), with a dense
    gradient. default_row: [dim] for positions without a row; zeros when None."""

    @tf.custom_gradient
    def restore_fn(emb):
        num_unique = tf.shape(emb)[0]
        if default_row is None:
            default = tf.zeros(tf.stack([1, tf.shape(emb)[1]]), emb.dtype)
        else:
            default = tf.reshape(tf.cast(default_row, emb.dtype), [1, -1])
        padded = tf.concat([emb, default], axis=0)
        out = tf.gather(padded, restore)

        def grad(dy):
            summed = tf.math.unsorted_segment_sum(dy, restore, num_unique + 1)
            return summed[:num_unique]

        return out, grad

    return restore_fn(unique_emb)


def _pad_to_send_count(table: SparseEmbedding, rows, restore, send_count: int, scope: str):
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


def _validate_ids(table: SparseEmbedding, ids) -> tf.Tensor:
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"sparse_lookup on table {table.table_name!r}: ids must be a dense "
                        f"tensor, got {type(ids).__name__}")
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in _KEY_DTYPES:
        raise TypeError(f"sparse_lookup on table {table.table_name!r}: ids must be int32 or "
                        f"int64, got {ids.dtype.name}")
    if ids.dtype.size > table.key_dtype.size:
        raise TypeError(f"sparse_lookup on table {table.table_name!r}: ids are {ids.dtype.name} "
                        f"but the table's key_dtype is {table.key_dtype.name}")
    if ids.shape.rank == 0:
        raise ValueError(f"sparse_lookup on table {table.table_name!r}: ids must have rank >= 1 "
                         "(a batch), got a scalar")
    return ids


# sparse_lookup's **kwargs that mx_rec documents as its own internal bookkeeping.
_MX_REC_INTERNAL_LOOKUP_ARGS = ("feature_spec_name_ids_dict", "multi_lookup", "lookup_ids")


def _check_lookup_args(table: SparseEmbedding, send_count, is_grad, dim, kwargs):
    where = f"sparse_lookup on table {table.table_name!r}"
    unknown = sorted(set(kwargs) - set(_MX_REC_INTERNAL_LOOKUP_ARGS))
    if unknown:
        raise TypeError(f"sparse_lookup() got unexpected keyword argument(s) {unknown}")
    if kwargs:
        raise NotImplementedError(
            f"{where}: {sorted(kwargs)} are mx_rec's internal arguments (its multi-lookup "
            "bookkeeping), which mxrec does not need: look a table up as often as needed")
    if send_count is not None and (isinstance(send_count, bool)
                                   or not isinstance(send_count, (int, np.integer))
                                   or not 0 < send_count < 2**31):
        raise ValueError(f"{where}: send_count must be None or an int in [1, 2^31), got "
                         f"{send_count!r}")
    if not isinstance(is_grad, bool):
        raise TypeError(f"{where}: is_grad must be a bool, got {is_grad!r}")
    if dim is not None:
        if isinstance(dim, tf.TensorShape):
            dim = dim[0] if dim.rank == 1 else None
        if dim != table.dim:
            raise ValueError(f"{where}: dim={dim!r}, but the table's rows have "
                             f"{table.dim} values; pass dim=None or the table's dim")


def sparse_lookup(
    hashtable: SparseEmbedding,
    ids,
    send_count: Optional[int] = None,
    is_train: bool = True,
    name: Optional[str] = None,
    modify_graph: bool = False,
    batch=None,
    access_and_evict_config: Optional[Dict] = None,
    is_grad: bool = True,
    serving_default_value=None,
    dim=None,
    **kwargs,
) -> tf.Tensor:
    """Looks up the rows of `ids` in `hashtable`.

    Args:
        hashtable: a table from `create_table`.
        ids: int32/int64 tensor of any rank >= 1 with raw IDs, or a FeatureSpec (with
            `batch`).
        send_count: with init(use_dynamic=False), the padded number of unique IDs (required
            there); with dynamic shapes it has no use, as in mx_rec.
        is_train: when False, no ID is inserted or counted and unseen IDs look up as zeros.
        name: name scope of the lookup; also the `ids_name` of set_threshold.
        modify_graph: let `modify_graph_and_start_emb_cache` move the key stage of this
            lookup into the input pipeline, ahead of the step.
        batch: the dataset element of a FeatureSpec lookup. With tensor IDs it is not
            needed (the graph modifier finds the batch from the IDs) and may be given.
        access_and_evict_config: dict with access_threshold (an ID gets a row once its
            weighted count reaches it), eviction_threshold (seconds of batch time after which
            an unseen ID is removed by EvictHook) and faae_coefficient (weight of one
            occurrence). eviction_threshold needs access_threshold.
        is_grad: False stops the gradient at this lookup: its IDs are counted and get rows
            (when training) but the table is not updated through it.
        serving_default_value: a scalar or [dim] value for IDs without a row (not admitted
            yet, or unseen in evaluation and serving) instead of zeros; padding keys stay
            zeros.
        dim: None or the table's dim (mx_rec passes it; another value is an error).
        **kwargs: mx_rec's internal feature_spec_name_ids_dict, multi_lookup and lookup_ids
            raise NotImplementedError; any other name is a TypeError.

    Returns:
        float32 tensor of shape ids.shape + [dim].

    Example:
        >>> emb = sparse_lookup(table, ids)  # ids [4096, 26] -> emb [4096, 26, dim]
    """
    if not isinstance(hashtable, SparseEmbedding):
        raise TypeError(f"sparse_lookup: hashtable must come from create_table, "
                        f"got {type(hashtable).__name__}")
    _check_lookup_args(hashtable, send_count, is_grad, dim, kwargs)
    if isinstance(ids, FeatureSpec):
        hashtable.lookup_names.add(ids.name)
        out = _feature_spec_lookup(hashtable, ids, batch, is_train, name, send_count,
                                   serving_default_value)
        return out if is_grad else tf.stop_gradient(out)
    if access_and_evict_config:
        _apply_access_and_evict_config(hashtable, access_and_evict_config)
    ids = _validate_ids(hashtable, ids)
    scope = name or f"{hashtable.table_name}_lookup"
    hashtable.lookup_names.add(scope)
    if serving.in_serving_export():
        return serving.serving_lookup(hashtable, ids, scope,
                                      default_value=default_values(hashtable,
                                                                   serving_default_value))
    static_shapes = hashtable.pad_row is not None and not modify_graph
    if static_shapes and send_count is None:
        raise ValueError(f"sparse_lookup {scope!r}: init(use_dynamic=False) pads each batch's "
                         "unique rows to send_count, so the lookup needs send_count > 0")
    if communication.get_rank_size() > 1:
        out = _sharded_lookup(hashtable, ids, is_train, send_count if static_shapes else None,
                              scope, modify_graph, serving_default_value)
        return out if is_grad else tf.stop_gradient(out)
    with tf.name_scope(scope):
        default = default_values(hashtable, serving_default_value)
        flat = tf.reshape(ids, [-1])
        graph = tf.compat.v1.get_default_graph()
        (rows,), (restore,), (reused,), _ = mxrec_ops.key_stage(
            [flat], [hashtable.table_key], is_train, timestamp=_batch_timestamp())
        previous = hashtable.key_stage_dependency(graph, is_train, rows.op)
        if previous is not None:
            rows.op._add_control_input(previous)
        if getattr(hashtable, "is_dynamic", False):
            from mxrec.core import dynamic  # deferred: dynamic imports this module

            out = dynamic.lookup(hashtable, ids, rows, restore, is_train, modify_graph,
                                 default=default, is_grad=is_grad)
            return mask_padding_keys(hashtable, ids, out) if default is not None else out
        planned_rows, planned_restore = rows, restore
        if static_shapes:
            planned_rows, planned_restore = _pad_to_send_count(hashtable, rows, restore,
                                                               int(send_count), scope)
        out = _lookup_planned(hashtable, ids, planned_rows, planned_restore, reused, is_train,
                              default)
        if default is not None:
            out = mask_padding_keys(hashtable, ids, out)
        if not is_grad:
            out = tf.stop_gradient(out)
    if modify_graph:
        _modify_graph_lookups(graph).append(
            LookupRecord(hashtable, ids, rows, restore, reused, is_train, send_count))
    return out


def _sharded_lookup(table: SparseEmbedding, ids, is_train: bool, send_count, scope: str,
                    modify_graph: bool, serving_default_value):
    """A lookup of a table sharded across the ranks (mxrec.core.sharding)."""
    if modify_graph:
        raise NotImplementedError(
            f"sparse_lookup {scope!r}: modify_graph=True on several ranks is not available yet "
            "(the IDs travel to their owners by collectives inside the step); build the lookup "
            "with modify_graph=False")
    if getattr(table, "is_dynamic", False):
        raise NotImplementedError(f"sparse_lookup {scope!r}: dynamic expansion on several ranks "
                                  "is not available yet")
    grad_scale = None
    if table.all2all_gradients_op == "sum_gradients_and_div_by_ranksize":
        grad_scale = 1.0 / communication.get_rank_size()
    graph = tf.compat.v1.get_default_graph()
    with tf.name_scope(scope):
        default = default_values(table, serving_default_value)
        timestamp = sharding.batch_time(_batch_timestamp())

        def lookup_owned(owned):
            (rows,), (restore,), (reused,), _ = mxrec_ops.key_stage(
                [owned], [table.table_key], is_train, timestamp=timestamp)
            previous = table.key_stage_dependency(graph, is_train, rows.op)
            if previous is not None:
                rows.op._add_control_input(previous)
            return _lookup_planned(table, owned, rows, restore, reused, is_train, default)

        out = sharding.lookup(table, ids, is_train, send_count, grad_scale, lookup_owned)
        if default is not None:
            out = mask_padding_keys(table, ids, out)
    return out


def _lookup_planned(table: SparseEmbedding, ids, rows, restore, reused, is_train: bool,
                    default=None):
    """The device side of a lookup, from the key stage's plan."""
    deps = []
    if is_train:
        graph = tf.compat.v1.get_default_graph()
        table.register_reused_rows(graph, reused)
        if tiers.is_tiered(table):
            # The rows change owner: old owners go to the host tier, new ones come from it.
            refill = tiers.swap_embedding(table, reused)
        else:
            # Rows freed by eviction and handed to new IDs start again from the
            # initializer; the hash optimizers reset their slots.
            required = None
            if table.eviction_threshold is not None:
                required = "eviction (eviction_threshold) re-initialises evicted rows"
            fresh = table.initial_rows(tf.size(reused), required_for=required)
            if fresh is None:
                refill = None
            else:
                refill = table.variable.scatter_update(tf.IndexedSlices(fresh, reused))
        # An earlier lookup of this table in the step may have refilled a row that
        # holds one of this lookup's IDs too: read only after every such refill.
        deps = table.refills(graph)
        if refill is not None:
            deps = deps + [refill]
            table.register_refill(graph, refill)
    with tf.control_dependencies(deps):
        unique_emb = tf.gather(table.variable, rows)
    emb = _restore_rows(unique_emb, restore, default)
    if not is_train and tiers.is_tiered(table):
        emb = tiers.read_host_rows(table, ids, emb)
    out_shape = tf.concat([tf.shape(ids, out_type=tf.int32), [table.dim]], axis=0)
    out = tf.reshape(emb, out_shape)
    out.set_shape(ids.shape.concatenate([table.dim]))
    return out


def _feature_spec_lookup(table: SparseEmbedding, spec, batch, is_train: bool, name, send_count,
                         serving_default_value):
    """Lookup of IDs that get_asc_insert_func already planned in the dataset."""
    if batch is None:
        raise ValueError(f"sparse_lookup on table {table.table_name!r} with FeatureSpec "
                         f"{spec.name!r}: pass batch=iterator.get_next() of the dataset mapped "
                         "by get_asc_insert_func")
    if spec.table_name != table.table_name:
        raise ValueError(f"FeatureSpec {spec.name!r} names table {spec.table_name!r}, not "
                         f"{table.table_name!r}")
    if spec.access_threshold is not None:
        config = {"access_threshold": spec.access_threshold,
                  "faae_coefficient": spec.faae_coefficient}
        if spec.eviction_threshold is not None:
            config["eviction_threshold"] = spec.eviction_threshold
        _apply_access_and_evict_config(table, config)
    features = batch[0] if isinstance(batch, (tuple, list)) else batch
    ids = _validate_ids(table, features[spec.ids_key])
    rows, restore, reused = planned_tensors(batch, spec)
    scope = name or f"{table.table_name}_lookup"
    table.lookup_names.add(scope)
    if table.pad_row is not None and send_count is None:
        raise ValueError(f"sparse_lookup {scope!r} (FeatureSpec {spec.name!r}): "
                         "init(use_dynamic=False) pads each batch's unique rows to send_count, "
                         "so the lookup needs send_count > 0")
    with tf.name_scope(scope):
        if table.pad_row is not None:
            rows, restore = _pad_to_send_count(table, rows, restore, int(send_count), scope)
        default = default_values(table, serving_default_value)
        out = _lookup_planned(table, ids, rows, restore, reused, is_train, default)
        return out if default is None else mask_padding_keys(table, ids, out)

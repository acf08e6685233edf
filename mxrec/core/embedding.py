"""Sparse tables addressed by raw IDs: `create_table` and `sparse_lookup`.

A table is device storage plus a host record per ID (kept by the C++
engine). A lookup runs the host key stage on the IDs (dedupe, count, admit,
give rows), reads the batch's unique rows and spreads them back to the input
positions:

    ids [*S] -> key stage -> unique_rows [U], restore [N]
             -> rows of the table [U, dim] -> rows[restore] -> [*S, dim]

`create_table` decides the table's type once (device-only, tiered or
dynamic; `mxrec.core.table`), and `sparse_lookup` hands each plan to the
table's `lookup_planned`. The gradient reaches the table as IndexedSlices over
the unique rows, which the hash optimizers in `mxrec.optimizers` apply to the
touched rows only.
"""

import weakref
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.constants.constants import (  # noqa: F401 (re-exported: their old import path)
    SPARSE_TABLE_COLLECTION,
    TIMESTAMP_COLLECTION,
)
from mxrec.core import dynamic, host_state, multi_hot, tiers
from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import planned_tensors
from mxrec.core.table import (  # noqa: F401 (SparseEmbedding, graph_tables: re-exported)
    DIRECT,
    FEATURE_SPEC,
    MODIFY_GRAPH,
    DeviceTable,
    SparseEmbedding,
    default_values,
    graph_tables,
    lookup_override,
    register_in_graph,
)
from mxrec.distributed import replicated, sharded_state, sharding
from mxrec.util import communication
from mxrec.util import ops as mxrec_ops
from mxrec.util.device import accelerator_device
from mxrec.util.initialize import get_config_initializer

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


_KEY_DTYPES = (tf.int32, tf.int64)


class LookupRecord:
    """A lookup built with modify_graph=True.

    The graph modifier moves the key stage (`rows.op`) into the input pipeline:
    it computes `ids` from the dataset's elements there and rewires every
    consumer of `rows`, `restore` and `reused` (the forward lookup, its
    gradient, the re-initialisation of reused rows and the optimizers' slot
    resets) to the planned values that arrive with the batch.

    On several ranks (`sharded` set) the key stage runs on the owner of the IDs, after
    collectives; the modifier then moves the rank-local routing into the input pipeline and
    the exchange and key stage into a planning subgraph of the step (mxrec.graph.sharded).
    """

    def __init__(self, table, ids, rows, restore, reused, is_train, send_count,
                 sharded: Optional["ShardedParts"] = None):
        self.table = table
        self.ids = ids
        self.rows = rows
        self.restore = restore
        self.reused = reused
        self.is_train = is_train
        self.send_count = send_count
        self.sharded = sharded


class ShardedParts:
    """The pieces of a sharded lookup (mxrec.core.sharding) the graph modifier rewires.

    Attributes:
        local_time: the rank's batch time before the all-reduce, or None.
        route: the rank-local routing (sharding.Route).
        exchange: what the owner received (sharding.Exchange); `exchange.owned` is the
            key stage's input.
    """

    def __init__(self, local_time, route, exchange):
        self.local_time = local_time
        self.route = route
        self.exchange = exchange


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
    *,
    optimizer_list=None,
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
            needs host_vocabulary_size > 0.
        ssd_data_path: a directory (or a one-element list of one) for the SSD tier's file;
            the working directory when not given, as mx_rec's default (os.getcwd(),).
        is_save: save and restore the table (device rows, slots and host state) with the
            graph's Saver.
        is_dp: data-parallel table: on several ranks replicated on every rank
            (mxrec.core.replicated) instead of sharded by ID; with one process the same
            table as is_dp=False. Needs init(use_dynamic=True) on several ranks.
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
        optimizer_list: (keyword only; mx_rec's older signature) the hash optimizers that
            will train the table. mxrec makes slots when an optimizer first applies, so the
            list is not needed; when given, an optimizer not in it that applies to the table
            is an error.

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
    if is_dp and communication.get_rank_size() > 1 and not runtime.config.use_dynamic:
        raise NotImplementedError(
            f"create_table {name!r}: is_dp=True (a table replicated on every rank) plans the "
            "whole global batch on every rank, whose unique rows init(use_dynamic=False) "
            "cannot pad to one send_count; use init(use_dynamic=True), or is_dp=False (the "
            "default: the table sharded by ID, which trains the same model)")
    if emb_initializer is None:
        raise ValueError(f"create_table {name!r}: emb_initializer is required")
    initializer = emb_initializer
    if init_param != 1.0:
        def initializer(shape, dtype=tf.float32, partition_info=None):
            del partition_info
            return emb_initializer(shape, dtype) * init_param

    graph = tf.compat.v1.get_default_graph()
    table_key = runtime.table_key(name)
    if runtime.config.use_dynamic_expansion:
        dynamic.check_settings(name, host_vocabulary_size, ssd_vocabulary_size,
                               runtime.config.use_dynamic)
    previous = graph_tables(graph).get(name)
    if previous is not None and previous.table_key == table_key:
        raise ValueError(f"create_table: a table named {name!r} already exists in this graph")
    engine = loader.engine()
    if runtime.config.use_dynamic_expansion:
        # The host table of a dynamic table never runs out of rows: its rows are the
        # store's addresses, and the store grows to hold them.
        engine.create_table(key=table_key, name=name, dim=int(dim),
                            capacity=dynamic.HOST_CAPACITY, padding_keys=padding_keys,
                            access_threshold=0.0, faae_coefficient=1.0)
    else:
        engine.create_table(
            key=table_key, name=name, dim=int(dim), capacity=int(device_vocabulary_size),
            padding_keys=padding_keys, access_threshold=0.0, faae_coefficient=1.0,
            host_capacity=host_size, ssd_capacity=ssd_size, ssd_path=ssd_path)
    if runtime.config.use_combine_faae:
        # USE_COMBINE_FAAE: one admission count per ID over all tables.
        engine.share_counts(table_key, runtime.table_key("__combined_faae__"))
    chain = runtime.shared_key_stage_chain if runtime.config.use_combine_faae else None
    args = (name, key_dtype, int(dim), initializer, int(device_vocabulary_size), padding_keys,
            value_dtype, table_key)
    if runtime.config.use_dynamic_expansion:
        table = dynamic.DynamicTable(*args, key_stage_chain=chain)
    elif host_size > 0:
        table = tiers.TieredTable(*args, device=accelerator_device(),
                                  static_shapes=not runtime.config.use_dynamic,
                                  key_stage_chain=chain, host_vocabulary_size=host_size,
                                  ssd_vocabulary_size=ssd_size)
    else:
        table = DeviceTable(*args, device=accelerator_device(),
                            static_shapes=not runtime.config.use_dynamic, key_stage_chain=chain)
    if is_save and lookup_override(graph) is None:
        # A dynamic table saves its host state (ID -> address) like any table, and its
        # store's rows and slots (no variable holds them) as one more saveable.
        if runtime.config.use_dynamic_expansion:
            dynamic.register_saveable(table)
        elif communication.get_rank_size() > 1 and host_size == 0 and not is_dp:
            sharded_state.register(table)  # the whole table, gathered from every rank
        else:
            host_state.register(name, table_key)
    table.all2all_gradients_op = all2all_gradients_op
    table.is_dp = bool(is_dp)
    table.declared_optimizers = _check_optimizer_list(name, optimizer_list)
    runtime.tables[name] = table
    register_in_graph(graph, table)
    return table


def _check_optimizer_list(name: str, optimizer_list):
    if optimizer_list is None:
        return None
    if not isinstance(optimizer_list, (list, tuple)):
        optimizer_list = [optimizer_list]
    for optimizer in optimizer_list:
        if not callable(getattr(optimizer, "apply_gradients", None)):
            raise TypeError(f"create_table {name!r}: optimizer_list must hold hash optimizers "
                            f"(create_hash_optimizer...), got {type(optimizer).__name__}")
    return list(optimizer_list)


def _normalized_policy(config: Dict) -> Dict:
    """access_and_evict_config with faae_coefficient's default (1) filled in and unset keys
    dropped, so that equal policies compare equal however they were written."""
    out = {key: config.get(key) for key in _EVICT_CONFIG_KEYS if config.get(key) is not None}
    out.setdefault("faae_coefficient", 1)
    return out


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
        raise ValueError(f"table {table.table_name!r}: {dynamic.EVICTION_REFUSED}")
    config = _normalized_policy(config)
    if table.access_and_evict_config not in (None, config):
        raise ValueError(f"table {table.table_name!r}: two lookups give different "
                         f"access_and_evict_config ({table.access_and_evict_config} and "
                         f"{config}); one table has one policy")
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
    combiner: Optional[str] = None,
    weights=None,
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
        combiner: (beyond mx_rec) None, "sum", "mean" or "sqrtn": combine the rows of each
            row's IDs into one, as tf.nn.safe_embedding_lookup_sparse (see
            mxrec.core.multi_hot). Needed for a tf.SparseTensor [B, K] (-> [B, dim]);
            optional for a tf.RaggedTensor [B, (k)] (None -> ragged [B, (k), dim]); a dense
            [*S, K] combines over its last axis (-> [*S, dim]).
        weights: per-ID combiner weights with the structure of `ids` (IDs of weight <= 0
            are dropped before the lookup).
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
    if not isinstance(is_train, bool):
        raise TypeError(f"sparse_lookup on table {hashtable.table_name!r}: is_train must be a "
                        f"bool, got {is_train!r}")
    get_config_initializer().lookup_modes.add(is_train)
    if (combiner is not None or weights is not None
            or isinstance(ids, (tf.SparseTensor, tf.RaggedTensor))):
        where = f"sparse_lookup on table {hashtable.table_name!r}"
        if isinstance(ids, FeatureSpec):
            raise NotImplementedError(f"{where}: combiner and weights are not available with "
                                      "a FeatureSpec; look up SparseTensor, RaggedTensor or "
                                      "dense IDs")
        multi_hot.check_combiner(where, ids, combiner, weights)

        def flat_lookup(values):
            return sparse_lookup(hashtable, values, send_count, is_train, name, modify_graph,
                                 batch, access_and_evict_config, is_grad, serving_default_value,
                                 dim)

        return multi_hot.lookup(ids, combiner, weights, flat_lookup, where)
    if isinstance(ids, FeatureSpec):
        hashtable.lookup_names.add(ids.name)
        if access_and_evict_config:
            _apply_access_and_evict_config(hashtable, access_and_evict_config)
        return _feature_spec_lookup(hashtable, ids, batch, is_train, name, send_count,
                                    serving_default_value, is_grad)
    if access_and_evict_config:
        _apply_access_and_evict_config(hashtable, access_and_evict_config)
    ids = _validate_ids(hashtable, ids)
    scope = name or f"{hashtable.table_name}_lookup"
    hashtable.lookup_names.add(scope)
    graph = tf.compat.v1.get_default_graph()
    override = lookup_override(graph)
    if override is not None:
        return override(hashtable, ids, scope, default_values(hashtable, serving_default_value))
    pad_to = None
    if hashtable.pad_row is not None and not modify_graph:
        if send_count is None:
            raise ValueError(f"sparse_lookup {scope!r}: init(use_dynamic=False) pads each "
                             "batch's unique rows to send_count, so the lookup needs "
                             "send_count > 0")
        pad_to = int(send_count)  # the graph modifier's pipeline pads modify_graph lookups
    if communication.get_rank_size() > 1:
        # A modify_graph lookup keeps send_count as its chunk when rewritten (the pipeline
        # pads it); until then it exchanges the IDs unpadded.
        return _sharded_lookup(hashtable, ids, is_train, pad_to, scope, modify_graph,
                               serving_default_value, is_grad)
    with tf.name_scope(scope):
        default = default_values(hashtable, serving_default_value)
        flat = tf.reshape(ids, [-1])
        (rows,), (restore,), (reused,), _ = mxrec_ops.key_stage(
            [flat], [hashtable.table_key], is_train, timestamp=_batch_timestamp())
        previous = hashtable.key_stage_dependency(graph, is_train, rows.op)
        if previous is not None:
            rows.op._add_control_input(previous)
        hashtable.check_lookup(MODIFY_GRAPH if modify_graph else DIRECT)
        out = hashtable.lookup_planned(ids, rows, restore, reused, is_train, default=default,
                                       is_grad=is_grad, send_count=pad_to, scope=scope)
    if modify_graph:
        _modify_graph_lookups(graph).append(
            LookupRecord(hashtable, ids, rows, restore, reused, is_train, send_count))
    return out


def _sharded_lookup(table: SparseEmbedding, ids, is_train: bool, send_count, scope: str,
                    modify_graph: bool, serving_default_value, is_grad: bool):
    """A lookup of a table sharded across the ranks (mxrec.core.sharding): the IDs go to
    their owners, each owner looks its IDs up in its shard like a one-process table; or, for
    a table replicated on every rank (is_dp=True, mxrec.core.replicated), every rank looks
    the global batch up in its replica.

    With modify_graph=True the same graph is built and recorded; the graph modifier moves
    its routing, exchange and key stage ahead of the step (mxrec.graph.sharded)."""
    if modify_graph and table.is_dp:
        raise NotImplementedError(
            f"sparse_lookup {scope!r}: modify_graph=True is not available for a replicated "
            f"table (is_dp=True) on several ranks; build the lookup of table "
            f"{table.table_name!r} with modify_graph=False, or create it with is_dp=False")
    table.check_lookup(MODIFY_GRAPH if modify_graph else DIRECT)
    grad_scale = None
    if table.all2all_gradients_op == "sum_gradients_and_div_by_ranksize":
        grad_scale = 1.0 / communication.get_rank_size()
    graph = tf.compat.v1.get_default_graph()
    if not modify_graph:  # the graph modifier's own initializers meet in their all-reduce
        sharding.fence_iterators(ids)
    with tf.name_scope(scope):
        default = default_values(table, serving_default_value)
        local_time = _batch_timestamp()
        timestamp = sharding.batch_time(local_time)
        if table.is_dp:  # every rank plans the global batch on its replica

            def lookup_owned(owned):
                (rows,), (restore,), (reused,), _ = mxrec_ops.key_stage(
                    [owned], [table.table_key], is_train, timestamp=timestamp)
                previous = table.key_stage_dependency(graph, is_train, rows.op)
                if previous is not None:
                    rows.op._add_control_input(previous)
                return table.lookup_planned(owned, rows, restore, reused, is_train,
                                            default=default, is_grad=is_grad, scope=scope)

            out = replicated.lookup(table, ids, is_train, grad_scale, lookup_owned)
            return out if is_grad else tf.stop_gradient(out)
        routed = sharding.route(ids, communication.get_rank_size())
        exchanged = sharding.exchange(table, routed, is_train, send_count)
        (rows,), (restore,), (reused,), _ = mxrec_ops.key_stage(
            [exchanged.owned], [table.table_key], is_train, timestamp=timestamp)
        previous = table.key_stage_dependency(graph, is_train, rows.op)
        if previous is not None:
            rows.op._add_control_input(previous)
        # is_grad reaches the owner: a dynamic table's lookup then leaves its rows out of the
        # by-address optimizers' collections.
        owned_emb = table.lookup_planned(exchanged.owned, rows, restore, reused, is_train,
                                         default=default, is_grad=is_grad, scope=scope)
        out = sharding.send_back(table, owned_emb, exchanged, routed, ids, grad_scale)
    if modify_graph:
        _modify_graph_lookups(graph).append(LookupRecord(
            table, ids, rows, restore, reused, is_train, send_count,
            sharded=ShardedParts(local_time, routed, exchanged)))
    return out if is_grad else tf.stop_gradient(out)


def _feature_spec_lookup(table: SparseEmbedding, spec, batch, is_train: bool, name, send_count,
                         serving_default_value, is_grad: bool):
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
    if communication.get_rank_size() > 1:
        raise NotImplementedError(
            f"sparse_lookup on table {table.table_name!r} with FeatureSpec {spec.name!r}: "
            "get_asc_insert_func plans a batch in the rank's own dataset, but on several ranks "
            "the key stage runs on the owner of each ID after an exchange between the ranks. "
            "Look up tensor IDs instead: sparse_lookup(table, ids, modify_graph=True) with "
            "modify_graph_and_start_emb_cache() (prefetched), or modify_graph=False")
    features = batch[0] if isinstance(batch, (tuple, list)) else batch
    ids = _validate_ids(table, features[spec.ids_key])
    rows, restore, reused = planned_tensors(batch, spec)
    scope = name or f"{table.table_name}_lookup"
    table.lookup_names.add(scope)
    if table.pad_row is not None and send_count is None:
        raise ValueError(f"sparse_lookup {scope!r} (FeatureSpec {spec.name!r}): "
                         "init(use_dynamic=False) pads each batch's unique rows to send_count, "
                         "so the lookup needs send_count > 0")
    table.check_lookup(FEATURE_SPEC)
    with tf.name_scope(scope):
        return table.lookup_planned(
            ids, rows, restore, reused, is_train,
            default=default_values(table, serving_default_value), is_grad=is_grad,
            send_count=None if table.pad_row is None else int(send_count), scope=scope)

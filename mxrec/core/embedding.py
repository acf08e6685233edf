"""Sparse tables addressed by raw IDs: `create_table` and `sparse_lookup`.

A table is device storage plus a host record per ID (kept by the C++
engine). A lookup runs the host key stage on the IDs (dedupe, count, admit,
give rows), reads the batch's unique rows and spreads them back to the input
positions:

    ids [*S] -> key stage -> unique_rows [U], restore [N]
             -> rows of the table [U, dim] -> rows[restore] -> [*S, dim]

`create_table` checks its arguments into a `TableConfig` (`mxrec.core.arguments`) and
decides the table's type once (device-only, tiered or dynamic; `mxrec.core.table`);
`sparse_lookup` checks its arguments and picks one planner once (`mxrec.core.planners`; on
several ranks the wing's, `mxrec.core.wing`), which hands the plan to the table's
`lookup_planned`. The gradient reaches the table as IndexedSlices over the unique rows, which
the hash optimizers in `mxrec.optimizers` apply to the touched rows only.
"""

from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.constants.constants import (  # noqa: F401 (re-exported: their old import path)
    SPARSE_TABLE_COLLECTION,
    TIMESTAMP_COLLECTION,
)
from mxrec.core import (
    arguments,
    dynamic,
    host_state,
    multi_hot,
    planners,
    target_batch,
    tiers,
    wing,
)
from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.planners import LookupRecord, modify_graph_lookups  # noqa: F401 (old path)
from mxrec.core.table import (  # noqa: F401 (SparseEmbedding, graph_tables: re-exported)
    DeviceTable,
    SparseEmbedding,
    default_values,
    graph_tables,
    lookup_override,
    register_in_graph,
)
from mxrec.util.config import get_config_initializer
from mxrec.util.device import accelerator_device

_EVICT_CONFIG_KEYS = ("access_threshold", "eviction_threshold", "faae_coefficient")


def create_table(key_dtype, dim, name: str, emb_initializer, device_vocabulary_size: int = 1,
                 host_vocabulary_size: int = 0, ssd_vocabulary_size: int = 0, ssd_data_path=(),
                 is_save: bool = True, is_dp: bool = False, init_param: float = 1.0,
                 all2all_gradients_op: str = "sum_gradients", enable_merge: bool = False,
                 padding_keys=None, padding_keys_mask: bool = True,
                 padding_keys_len: Optional[int] = None, value_dtype=tf.float32,
                 shard_num: int = 1, fusion_optimizer_var: bool = True,
                 hashtable_threshold: int = 0, *, optimizer_list=None, init_by_id: bool = False,
                 storage_dtype=tf.float32, slot_dtype=None, rounding="nearest") -> SparseEmbedding:
    """Creates a sparse table addressed by raw IDs (mx_rec's parameters: MX_REC_COMPAT.md).

    Args:
        key_dtype: tf.int64 or tf.int32; every value of the type is a valid ID.
        dim: row width (int or TensorShape of rank 1).
        name: table name, unique among this init()'s tables.
        emb_initializer: any TF initializer; initial value of every row.
        device_vocabulary_size: rows the device table holds (per rank on several ranks).
        host_vocabulary_size: host-memory rows; the device table is then a cache ("DDR mode").
        ssd_vocabulary_size: rows on disk once host memory is full ("SSD mode").
        ssd_data_path: the SSD tier's directory (or a list of one); default: the working directory.
        is_save: save and restore the table (rows, slots, host state) with TF's Saver.
        is_dp: on several ranks, replicated on each, not sharded by ID (needs use_dynamic=True).
        init_param: scale applied to the initializer's values, in [-10, 10].
        all2all_gradients_op: on several ranks "sum_gradients" adds the ranks' gradients of
            an ID, "sum_gradients_and_div_by_ranksize" also divides by the rank count.
        padding_keys: IDs that look up as zeros, never counted or updated; padding_keys_mask
            False (mx_rec's default; mxrec's is True) makes them ordinary IDs.
        padding_keys_len: None or a positive int (not needed). value_dtype: tf.float32.
        fusion_optimizer_var: accepted; slots are their own variables, with the same updates.
        enable_merge, shard_num, hashtable_threshold: only False, 1 and 0.
        optimizer_list: (keyword only) the hash optimizers that train the table; no other may.
        init_by_id: (keyword only, mxrec's) True: a new ID's first values are drawn from the
            ID, the same whatever its row (docs/CONFIGURATION.md); False: its row's, as mx_rec.
        storage_dtype, slot_dtype, rounding: (keyword only) rows and slots rest in tf.float32,
            tf.bfloat16 or tf.float16, computed on in float32 (docs/TIERS.md).

    Returns:
        The SparseEmbedding.

    Raises:
        TypeError, ValueError: a parameter of the wrong type or out of range.
        NotImplementedError: enable_merge, shard_num, hashtable_threshold or ssd_data_path
            beyond the values above (storage choices mxrec does not have).

    Example:
        >>> table = create_table(tf.int64, 16, "user_table",
        ...                      tf.compat.v1.truncated_normal_initializer(stddev=0.05),
        ...                      device_vocabulary_size=100_000)
        >>> emb = sparse_lookup(table, ids)  # ids [B, 3] int64 -> emb [B, 3, 16]
    """
    runtime = get_config_initializer()
    config = arguments.table_config(
        runtime, key_dtype, dim, name, emb_initializer, device_vocabulary_size,
        host_vocabulary_size, ssd_vocabulary_size, ssd_data_path, is_save, is_dp, init_param,
        all2all_gradients_op, enable_merge, padding_keys, padding_keys_mask, padding_keys_len,
        value_dtype, shard_num, fusion_optimizer_var, hashtable_threshold, init_by_id,
        dict(storage_dtype=storage_dtype, slot_dtype=slot_dtype, rounding=rounding))
    graph = tf.compat.v1.get_default_graph()
    table = _make_table(runtime, config, _new_table_key(runtime, graph, name))
    return _register_table(runtime, graph, config, table, optimizer_list)


def _new_table_key(runtime, graph: tf.Graph, name: str) -> str:
    """The engine's key of table `name`, refused where the graph has that table already."""
    table_key = runtime.table_key(name)
    previous = graph_tables(graph).get(name)
    if previous is not None and previous.table_key == table_key:
        raise ValueError(f"create_table: a table named {name!r} already exists in this graph")
    return table_key


def _register_table(runtime, graph: tf.Graph, config: arguments.TableConfig,
                    table: SparseEmbedding, optimizer_list) -> SparseEmbedding:
    """The new table with its settings, its saveable (unless a lookup override stands in
    for tables) and its places in the runtime and the graph."""
    table.by_id = config.by_id
    if config.is_save and lookup_override(graph) is None:
        _register_saveable(runtime, config, table)
    table.all2all_gradients_op = config.all2all_gradients_op
    table.is_dp = config.is_dp
    table.declared_optimizers = arguments.check_optimizer_list(config.name, optimizer_list)
    runtime.tables[config.name] = table
    register_in_graph(graph, table)
    return table


def create_host_table(runtime, config: arguments.TableConfig, table_key: str) -> None:
    """The table's host state in the engine (ID map, rows, tiers, admission counts), as
    create_table makes it; also used by mxrec.keras' Embedding."""
    engine = loader.engine()
    common = dict(key=table_key, name=config.name, dim=config.dim,
                  padding_keys=config.padding_keys, access_threshold=0.0,
                  faae_coefficient=1.0)
    if runtime.config.use_dynamic_expansion:
        # The host table of a dynamic table never runs out of rows: its rows are the
        # store's addresses, and the store grows to hold them.
        engine.create_table(capacity=dynamic.HOST_CAPACITY, **common)
    else:
        # init_by_id: every row handed to a new ID is refilled (from the ID) in the step;
        # a dynamic table initialises its new rows as it makes them anyway.
        engine.create_table(capacity=config.device_vocabulary_size,
                            host_capacity=config.host_vocabulary_size,
                            ssd_capacity=config.ssd_vocabulary_size, ssd_path=config.ssd_path,
                            refill_new_rows=config.by_id is not None,
                            storage_dtype=config.storage_dtype.name,
                            slot_dtype=config.slot_dtype.name, **common)
    if runtime.config.use_combine_faae:
        # USE_COMBINE_FAAE: one admission count per ID over all tables.
        engine.share_counts(table_key, runtime.table_key("__combined_faae__"))


def _make_table(runtime, config: arguments.TableConfig, table_key: str) -> SparseEmbedding:
    """The host table in the engine, then the table of the type its settings pick."""
    create_host_table(runtime, config, table_key)
    chain = runtime.shared_key_stage_chain if runtime.config.use_combine_faae else None
    args = (config.name, config.key_dtype, config.dim, config.initializer,
            config.device_vocabulary_size, config.padding_keys, config.value_dtype, table_key)
    static_shapes = not runtime.config.use_dynamic
    if runtime.config.use_dynamic_expansion:
        return dynamic.DynamicTable(*args, key_stage_chain=chain, static_shapes=static_shapes)
    if config.tiered:
        return tiers.TieredTable(*args, device=accelerator_device(), static_shapes=static_shapes,
                                 key_stage_chain=chain,
                                 host_vocabulary_size=config.host_vocabulary_size,
                                 ssd_vocabulary_size=config.ssd_vocabulary_size, storage=config)
    return DeviceTable(*args, device=accelerator_device(), static_shapes=static_shapes,
                       key_stage_chain=chain, storage=config)


def _register_saveable(runtime, config: arguments.TableConfig, table: SparseEmbedding) -> None:
    # A dynamic table saves its host state (ID -> address) like any table, and its
    # store's rows and slots (no variable holds them) as one more saveable.
    if runtime.config.use_dynamic_expansion:
        dynamic.register_saveable(table)
    elif not wing.current().register_saveable(table, tiered=config.tiered, is_dp=config.is_dp):
        host_state.register(config.name, table.table_key, table.dim)


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


def add_timestamp(timestamps: tf.Tensor) -> None:
    """Declares the batch's time feature (seconds); later lookups stamp IDs with its max."""
    tf.compat.v1.add_to_collection(TIMESTAMP_COLLECTION, timestamps)


def sparse_lookup(hashtable: SparseEmbedding, ids, send_count: Optional[int] = None,
                  is_train: bool = True, name: Optional[str] = None, modify_graph: bool = False,
                  batch=None, access_and_evict_config: Optional[Dict] = None,
                  is_grad: bool = True, serving_default_value=None, dim=None,
                  combiner: Optional[str] = None, weights=None, **kwargs) -> tf.Tensor:
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
        batch: the dataset element of a FeatureSpec lookup (tensor IDs do not need it).
        access_and_evict_config: dict with access_threshold (an ID gets a row once its
            weighted count reaches it), eviction_threshold (seconds of batch time after which
            an unseen ID is removed by EvictHook; needs access_threshold) and
            faae_coefficient (weight of one occurrence).
        is_grad: False stops the gradient at this lookup (its IDs still count and get rows).
        serving_default_value: a scalar or [dim] value for IDs without a row (not admitted
            yet, or unseen in evaluation and serving) instead of zeros; padding keys stay
            zeros.
        dim: None or the table's dim (mx_rec passes it; another value is an error).
        combiner: (beyond mx_rec) None, "sum", "mean" or "sqrtn": combine each row's IDs
            as tf.nn.safe_embedding_lookup_sparse (mxrec.core.multi_hot). Needed for a
            tf.SparseTensor [B, K] (-> [B, dim]); optional for a tf.RaggedTensor [B, (k)]
            (None -> ragged [B, (k), dim]); a dense [*S, K] combines its last axis.
        weights: per-ID combiner weights with the structure of `ids` (IDs of weight <= 0
            are dropped before the lookup).
        **kwargs: mx_rec's internal feature_spec_name_ids_dict, multi_lookup and lookup_ids
            raise NotImplementedError; any other name is a TypeError.

    Returns:
        float32 tensor of shape ids.shape + [dim].

    Example:
        >>> emb = sparse_lookup(table, ids)  # ids [4096, 26] -> emb [4096, 26, dim]
    """
    _check_lookup(hashtable, send_count, is_train, is_grad, dim, kwargs)
    if (combiner is not None or weights is not None
            or isinstance(ids, (tf.SparseTensor, tf.RaggedTensor))):
        return _multi_hot_lookup(hashtable, ids, combiner, weights, send_count, is_train, name,
                                 modify_graph, batch, access_and_evict_config, is_grad,
                                 serving_default_value, dim)
    if isinstance(ids, FeatureSpec):
        hashtable.lookup_names.add(ids.name)
        if access_and_evict_config:
            _apply_access_and_evict_config(hashtable, access_and_evict_config)
        return _feature_spec_lookup(hashtable, ids, batch, is_train, name, send_count,
                                    serving_default_value, is_grad)
    return _dense_lookup(hashtable, ids, send_count, is_train, name, modify_graph, batch,
                         access_and_evict_config, is_grad, serving_default_value)


def _dense_lookup(hashtable, ids, send_count, is_train, name, modify_graph, batch,
                  access_and_evict_config, is_grad, serving_default_value) -> tf.Tensor:
    """sparse_lookup of a dense tensor of IDs."""
    if access_and_evict_config:
        _apply_access_and_evict_config(hashtable, access_and_evict_config)
    if modify_graph:  # mx_rec's get_target_batch
        target_batch.remember(tf.compat.v1.get_default_graph(), is_train, batch)
    return _tensor_lookup(hashtable, arguments.validate_ids(hashtable, ids), send_count,
                          is_train, name or f"{hashtable.table_name}_lookup", modify_graph,
                          serving_default_value, is_grad)


def _check_lookup(hashtable, send_count, is_train, is_grad, dim, kwargs) -> None:
    if not isinstance(hashtable, SparseEmbedding):
        raise TypeError(f"sparse_lookup: hashtable must come from create_table, "
                        f"got {type(hashtable).__name__}")
    arguments.check_lookup_args(hashtable, send_count, is_grad, dim, kwargs)
    if not isinstance(is_train, bool):
        raise TypeError(f"sparse_lookup on table {hashtable.table_name!r}: is_train must be a "
                        f"bool, got {is_train!r}")
    get_config_initializer().lookup_modes.add(is_train)


def _multi_hot_lookup(hashtable, ids, combiner, weights, send_count, is_train, name,
                      modify_graph, batch, access_and_evict_config, is_grad,
                      serving_default_value, dim):
    """Multi-hot IDs on top of the other planners: flattened, looked up, combined."""
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


def _tensor_lookup(hashtable, ids, send_count, is_train, scope, modify_graph,
                   serving_default_value, is_grad) -> tf.Tensor:
    """Tensor IDs: the serving export's override, else the planner chosen once."""
    hashtable.lookup_names.add(scope)
    override = lookup_override(tf.compat.v1.get_default_graph())
    if override is not None:
        return override(hashtable, ids, scope, default_values(hashtable, serving_default_value))
    pad_to = None
    if hashtable.pad_row is not None and not modify_graph:
        if send_count is None:
            raise ValueError(f"sparse_lookup {scope!r}: init(use_dynamic=False) pads each "
                             "batch's unique rows to send_count, so the lookup needs "
                             "send_count > 0")
        pad_to = int(send_count)  # the graph modifier's pipeline pads modify_graph lookups
    request = planners.LookupRequest(hashtable, ids, is_train, send_count, pad_to, scope,
                                     modify_graph, serving_default_value, is_grad)
    # On several ranks a modify_graph lookup keeps send_count as its chunk when rewritten
    # (the pipeline pads it); until then it exchanges the IDs unpadded.
    plan = wing.current().lookup_planner(hashtable, modify_graph) or planners.direct_lookup
    return plan(request)


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
    features = batch[0] if isinstance(batch, (tuple, list)) else batch
    ids = arguments.validate_ids(table, features[spec.ids_key])
    scope = name or f"{table.table_name}_lookup"
    return planners.feature_spec_lookup(table, spec, batch, ids, is_train, scope, send_count,
                                        serving_default_value, is_grad)


# The admission and eviction policy of a table, checked and applied (the Keras layer's path to
# what sparse_lookup(access_and_evict_config=...) does).
apply_access_and_evict_config = _apply_access_and_evict_config

"""The argument checks of `create_table` and `sparse_lookup`, and `TableConfig`, the table
settings built from mx_rec's keyword arguments.

Each parameter takes effect, is equivalent in mxrec's single process, or is refused with an
error naming the table, the value and the setting (docs/MX_REC_COMPAT.md says which).
"""

import dataclasses
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from mxrec.core import dynamic, row_initializer, storage_dtype, tiers
from mxrec.util import ranks

KEY_DTYPES = (tf.int32, tf.int64)


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """A table's settings, checked, from create_table's (mx_rec's) keyword arguments.

    Attributes:
        name: unique among this init()'s tables.
        key_dtype: tf.int64 or tf.int32.
        dim: row width.
        initializer: the row initializer (emb_initializer scaled by init_param).
        device_vocabulary_size: rows of the device table.
        host_vocabulary_size, ssd_vocabulary_size, ssd_path: the host and SSD tiers (0: none).
        padding_keys: IDs that look up as zeros (empty when padding_keys_mask=False).
        value_dtype: tf.float32.
        is_save, is_dp, all2all_gradients_op: as create_table's.
        by_id: create_table(init_by_id=True)'s draw of new IDs' first values, or None.
        storage_dtype: the dtype rows rest in (tf.float32, tf.bfloat16, tf.float16).
        slot_dtype: the dtype the optimizer slots rest in.
        rounding: how updated rows are rounded to the storage dtype ("nearest" or
            "stochastic"); rounding_seed: the stochastic rounding's seed.
    """

    name: str
    key_dtype: tf.DType
    dim: int
    initializer: Callable
    device_vocabulary_size: int
    host_vocabulary_size: int
    ssd_vocabulary_size: int
    ssd_path: str
    padding_keys: List[int]
    value_dtype: tf.DType
    is_save: bool
    is_dp: bool
    all2all_gradients_op: str
    by_id: Optional[row_initializer.ByIdSpec] = None
    storage_dtype: tf.DType = tf.float32
    slot_dtype: tf.DType = tf.float32
    rounding: str = "nearest"
    rounding_seed: int = 0

    @property
    def tiered(self) -> bool:
        return self.host_vocabulary_size > 0


def table_config(runtime, key_dtype, dim, name, emb_initializer, device_vocabulary_size,
                 host_vocabulary_size, ssd_vocabulary_size, ssd_data_path, is_save, is_dp,
                 init_param, all2all_gradients_op, enable_merge, padding_keys,
                 padding_keys_mask, padding_keys_len, value_dtype, shard_num,
                 fusion_optimizer_var, hashtable_threshold, init_by_id=False,
                 storage=None) -> TableConfig:
    """create_table's arguments checked (in mx_rec's order of parameters) into a
    TableConfig; `runtime` is the ConfigInitializer in force; `storage`: create_table's
    {storage_dtype, slot_dtype, rounding} (None: float32 rows and slots)."""
    _check_name(name)
    key_dtype, dim = _check_key_dtype_and_dim(name, key_dtype, dim)
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
    padding_keys = _padding_keys(padding_keys)
    _check_mx_rec_table_options(name, is_dp, init_param, all2all_gradients_op, enable_merge,
                                padding_keys_mask, padding_keys_len, shard_num,
                                fusion_optimizer_var, hashtable_threshold)
    if not padding_keys_mask:
        padding_keys = []  # mx_rec: without the mask, padding keys train like any ID
    if is_dp and ranks.get_rank_size() > 1 and not runtime.config.use_dynamic:
        raise NotImplementedError(
            f"create_table {name!r}: is_dp=True (a table replicated on every rank) plans the "
            "whole global batch on every rank, whose unique rows init(use_dynamic=False) "
            "cannot pad to one send_count; use init(use_dynamic=True), or is_dp=False (the "
            "default: the table sharded by ID, which trains the same model)")
    initializer = _scaled_initializer(name, emb_initializer, init_param)
    if not isinstance(init_by_id, bool):
        raise TypeError(f"create_table {name!r}: init_by_id must be True or False, "
                        f"got {init_by_id!r}")
    by_id = (row_initializer.by_id_spec(name, emb_initializer, init_param,
                                        [int(device_vocabulary_size), int(dim)])
             if init_by_id else None)
    if runtime.config.use_dynamic_expansion:
        dynamic.check_settings(name, host_vocabulary_size, ssd_vocabulary_size,
                               runtime.config.use_dynamic)
    storage = _check_storage(name, storage or {}, runtime.config.use_dynamic_expansion)
    return TableConfig(name=name, key_dtype=key_dtype, dim=int(dim), initializer=initializer,
                       device_vocabulary_size=int(device_vocabulary_size),
                       host_vocabulary_size=host_size, ssd_vocabulary_size=ssd_size,
                       ssd_path=ssd_path, padding_keys=padding_keys, value_dtype=value_dtype,
                       is_save=is_save, is_dp=bool(is_dp),
                       all2all_gradients_op=all2all_gradients_op, by_id=by_id, **storage)


def _check_storage(name, storage, dynamic_expansion: bool):
    """create_table's storage_dtype, slot_dtype and rounding, checked (mxrec.core.storage_dtype)."""
    unknown = sorted(set(storage) - {"storage_dtype", "slot_dtype", "rounding"})
    if unknown:
        raise TypeError(f"create_table {name!r}: unknown storage settings {unknown}")
    out = dict(
        storage_dtype=storage_dtype.resolve(name, storage.get("storage_dtype", tf.float32)),
        slot_dtype=storage_dtype.resolve(name, storage.get("slot_dtype") or tf.float32,
                                         "slot_dtype"),
    )
    out["rounding"], out["rounding_seed"] = storage_dtype.check_rounding(
        name, storage.get("rounding", "nearest"))
    if out["storage_dtype"] == tf.float32 and out["slot_dtype"] == tf.float32:
        return out
    reduced = (f"storage_dtype={out['storage_dtype'].name}, "
               f"slot_dtype={out['slot_dtype'].name}")
    if dynamic_expansion:
        raise NotImplementedError(
            f"create_table {name!r}: {reduced} under init(use_dynamic_expansion=True) is not "
            "built yet: the dynamic store keeps float32 rows. Use float32 storage")
    return out


def _check_key_dtype_and_dim(name, key_dtype, dim):
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype not in KEY_DTYPES:
        raise TypeError(f"create_table {name!r}: key_dtype must be tf.int64 or tf.int32, "
                        f"got {key_dtype.name}")
    if isinstance(dim, tf.TensorShape):
        if dim.rank != 1 or dim[0] is None:
            raise ValueError(f"create_table {name!r}: dim must be a rank-1 shape, got {dim}")
        dim = int(dim[0])
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
        raise ValueError(f"create_table {name!r}: dim must be a positive int, got {dim!r}")
    return key_dtype, dim


def _padding_keys(padding_keys) -> List[int]:
    if padding_keys is None:
        padding_keys = []
    elif isinstance(padding_keys, (int, np.integer)):
        padding_keys = [int(padding_keys)]
    return [int(k) for k in padding_keys]


def _scaled_initializer(name, emb_initializer, init_param):
    if emb_initializer is None:
        raise ValueError(f"create_table {name!r}: emb_initializer is required")
    if init_param == 1.0:
        return emb_initializer

    def initializer(shape, dtype=tf.float32, partition_info=None):
        del partition_info
        return emb_initializer(shape, dtype) * init_param

    return initializer


def _check_name(name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"create_table: name must be a non-empty string, got {name!r}")


_ALL2ALL_GRADIENTS_OPS = ("sum_gradients", "sum_gradients_and_div_by_ranksize")


def _check_mx_rec_table_options(name, is_dp, init_param, all2all_gradients_op, enable_merge,
                                padding_keys_mask, padding_keys_len, shard_num,
                                fusion_optimizer_var, hashtable_threshold):
    """Checks create_table's mx_rec parameters that steer distribution or storage layout.

    Each takes effect, is equivalent in mxrec's single process, or is refused:
    docs/MX_REC_COMPAT.md says which.
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


def check_optimizer_list(name: str, optimizer_list):
    if optimizer_list is None:
        return None
    if not isinstance(optimizer_list, (list, tuple)):
        optimizer_list = [optimizer_list]
    for optimizer in optimizer_list:
        if not callable(getattr(optimizer, "apply_gradients", None)):
            raise TypeError(f"create_table {name!r}: optimizer_list must hold hash optimizers "
                            f"(create_hash_optimizer...), got {type(optimizer).__name__}")
    return list(optimizer_list)


def validate_ids(table, ids) -> tf.Tensor:
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"sparse_lookup on table {table.table_name!r}: ids must be a dense "
                        f"tensor, got {type(ids).__name__}")
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in KEY_DTYPES:
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


def check_lookup_args(table, send_count, is_grad, dim, kwargs):
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

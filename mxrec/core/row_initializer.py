"""Fresh rows for a table whose initializer's statistics depend on the shape it fills, and
the rows create_table(init_by_id=True) draws from new IDs (at the end of this file).

A variance-scaling initializer (tf.compat.v1.variance_scaling_initializer, the Glorot /
He / LeCun ones, their TF2 and Keras forms) draws with a standard deviation computed from
the shape's fans, so it cannot make rows for a count known only when the step runs, and
rows drawn for [count, dim] would have the wrong spread anyway. A table's rows must all
come from one distribution: the variable's initial value was drawn for the whole table
[rows, dim]; rows handed to new IDs after eviction (and rows arriving from the
initializer in a tiered table) are drawn here with that same distribution: the same
family (truncated normal, normal or uniform) and the scale computed from the whole
table's shape, by TensorFlow's formulas (init_ops.VarianceScaling).
"""

import dataclasses
import math
import zlib
from typing import Optional, Sequence

import tensorflow as tf

from mxrec._lib import loader

# TensorFlow's constant: the stddev of a unit normal truncated to [-2, 2].
_TRUNCATION = 0.87962566103423978


def _variance_scaling_fields(initializer):
    fields = tuple(getattr(initializer, name, None) for name in ("scale", "mode",
                                                                   "distribution"))
    if any(field is None for field in fields):
        return None
    scale, mode, distribution = fields
    if not isinstance(mode, str) or not isinstance(distribution, str):
        return None
    return float(scale), mode.lower(), distribution.lower()


def is_variance_scaling(initializer) -> bool:
    return _variance_scaling_fields(initializer) is not None


def _fans(shape: Sequence[int]):
    if len(shape) < 1:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def rows_like_table(initializer, table_shape: Sequence[int], count: tf.Tensor,
                    dtype: tf.DType) -> Optional[tf.Tensor]:
    """[count, table_shape[-1]] values from `initializer`'s distribution for
    `table_shape`, or None when it is not a variance-scaling initializer.

    Raises:
        ValueError: a mode or distribution TensorFlow does not have.
    """
    fields = _variance_scaling_fields(initializer)
    if fields is None:
        return None
    scale, mode, distribution = fields
    fan_in, fan_out = _fans([int(d) for d in table_shape])
    if mode == "fan_in":
        scale /= max(1.0, fan_in)
    elif mode == "fan_out":
        scale /= max(1.0, fan_out)
    elif mode == "fan_avg":
        scale /= max(1.0, (fan_in + fan_out) / 2.0)
    else:
        raise ValueError(f"variance-scaling initializer: unknown mode {mode!r}")
    seed = getattr(initializer, "seed", None)
    # A seeded initializer stays deterministic, on a stream of its own: with its own seed
    # the first refill would repeat the table's first initial rows.
    seed = ((seed * 1_000_003 + 17) % (2**31 - 1)
            if isinstance(seed, int) and not isinstance(seed, bool) else None)
    shape = tf.stack([count, int(table_shape[-1])])
    if distribution in ("normal", "truncated_normal"):
        stddev = math.sqrt(scale) / _TRUNCATION
        return tf.random.truncated_normal(shape, 0.0, stddev, dtype, seed=seed)
    if distribution == "untruncated_normal":
        return tf.random.normal(shape, 0.0, math.sqrt(scale), dtype, seed=seed)
    if distribution == "uniform":
        limit = math.sqrt(3.0 * scale)
        return tf.random.uniform(shape, -limit, limit, dtype, seed=seed)
    raise ValueError(f"variance-scaling initializer: unknown distribution {distribution!r}")


# create_table(init_by_id=True): a new ID's first values are drawn from the ID.
#
# A row's initial value in a TF variable depends on its position, and the position an
# ID gets depends on the order IDs arrive, on eviction, on the rank that owns it and on
# the rank count. With init_by_id the table draws each newly admitted ID's values from
# one stream keyed by (table name, initializer seed, ID) (MxrecRowsById, C++), with the
# initializer's family and parameters, and writes them into its row before the step's
# gather: one process and N ranks, a restart and an uninterrupted run, then start every
# ID from the same values.

_BY_ID_FAMILIES = {"TruncatedNormal": "truncated_normal", "RandomNormal": "normal",
                   "RandomUniform": "uniform"}


@dataclasses.dataclass(frozen=True)
class ByIdSpec:
    """How MxrecRowsById draws a table's rows: `distribution` with parameters a, b
    (mean and stddev, or minval and maxval), scaled by `scale` (init_param)."""

    distribution: str
    a: float
    b: float
    seed: int
    scale: float = 1.0


def _family(initializer) -> Optional[str]:
    for cls in type(initializer).__mro__:
        if cls.__name__ in _BY_ID_FAMILIES:
            return _BY_ID_FAMILIES[cls.__name__]
    return None


def by_id_spec(table_name: str, initializer, init_param: float,
               table_shape: Sequence[int]) -> ByIdSpec:
    """The draw create_table(init_by_id=True) makes for `initializer` (the user's
    emb_initializer, before init_param), or a ValueError naming the table and the setting.

    Truncated normal, normal and uniform initializers (tf.compat.v1's, TF2's and
    Keras') keep their parameters; variance-scaling ones (Glorot, He, LeCun) get the
    spread TensorFlow computes for `table_shape`; constant initializers need no draw
    and are refused here (init_by_id changes nothing for them).
    """
    seed = getattr(initializer, "seed", None)
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0
    # The table name is part of the key: two tables built with one seeded initializer
    # must not start an ID from the same values.
    key = (zlib.crc32(table_name.encode("utf-8")) << 32) ^ (seed * 0x9E3779B1 % 2**64)
    key = key % 2**64 - 2**63  # an int64 attribute
    family = _family(initializer)
    if family == "uniform":
        a, b = float(initializer.minval), float(initializer.maxval)
    elif family is not None:
        a, b = float(initializer.mean), float(initializer.stddev)
    else:
        fields = _variance_scaling_fields(initializer)
        if fields is None:
            raise ValueError(
                f"create_table {table_name!r}: init_by_id=True draws each new ID's values "
                "from the ID with the initializer's distribution, which needs a truncated "
                "normal, normal, uniform or variance-scaling emb_initializer, got "
                f"{type(initializer).__name__}; a constant initializer gives every ID the "
                "same values already (leave init_by_id False)")
        scale, mode, distribution = fields
        fan_in, fan_out = _fans([int(d) for d in table_shape])
        scale /= max(1.0, {"fan_in": fan_in, "fan_out": fan_out}.get(
            mode, (fan_in + fan_out) / 2.0))
        if distribution in ("normal", "truncated_normal"):
            family, a, b = "truncated_normal", 0.0, math.sqrt(scale) / _TRUNCATION
        elif distribution == "untruncated_normal":
            family, a, b = "normal", 0.0, math.sqrt(scale)
        else:
            limit = math.sqrt(3.0 * scale)
            family, a, b = "uniform", -limit, limit
    return ByIdSpec(family, a, b, key, float(init_param))


def plan_rows_by_id(spec: ByIdSpec, ids: tf.Tensor, rows: tf.Tensor, restore: tf.Tensor,
                    wanted: tf.Tensor, dim: int, dtype: tf.DType) -> tf.Tensor:
    """[len(wanted), dim] first values of the IDs that the plan (rows [U], restore [N] over
    ids [N]) gives the rows `wanted` (a subset of rows: those handed to new IDs), in one op
    (MxrecPlanRowsById: the IDs found from the plan, then drawn as MxrecRowsById draws)."""
    with tf.device("/device:CPU:0"):
        ids = tf.reshape(ids, [-1])
        if ids.dtype not in (tf.int32, tf.int64):
            ids = tf.cast(ids, tf.int64)
        values = loader.op_library().mxrec_plan_rows_by_id(
            ids, tf.cast(tf.reshape(rows, [-1]), tf.int32),
            tf.cast(tf.reshape(restore, [-1]), tf.int32),
            tf.cast(tf.reshape(wanted, [-1]), tf.int32), dim=int(dim), seed=spec.seed,
            distribution=spec.distribution, a=spec.a, b=spec.b)
        if spec.scale != 1.0:
            values = values * spec.scale
    return tf.cast(values, dtype)

"""Fresh rows for a table whose initializer's statistics depend on the shape it fills.

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

import math
from typing import Optional, Sequence

import tensorflow as tf

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

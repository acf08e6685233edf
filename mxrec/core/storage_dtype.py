"""How a table's rows rest: float32, bfloat16 or float16 (`create_table(storage_dtype=...)`).

Rows are stored in the storage dtype and computed on in float32: a lookup reads the stored
rows and casts them up (exact), an optimizer computes the updated rows in float32 from the
upcast rows and its float32 slots, and the updated rows are rounded to the storage dtype as
they are written (round-to-nearest-even). The gradient that reaches the optimizer stays
float32: the upcast's gradient is not cast down.

A table file of mxrec's Saver keeps each state in the dtype it rests in: float32, float16
(NumPy's own), or bfloat16 as its 16 bits in a uint16 array (NumPy has no bfloat16; no state
is ever stored as uint16 otherwise, so the dtype of the array says which it is).

Example:
    >>> storage_dtype.resolve("user", "bf16")           # tf.bfloat16
    >>> rows = storage_dtype.upcast(tf.gather(table.variable, rows))   # [U, dim] float32
    >>> table.variable.scatter_update(tf.IndexedSlices(storage_dtype.store(new, table), rows))
"""

from typing import Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops

# Names a user may give (tf.DType, NumPy dtype, or one of these strings), by dtype.
_ALIASES = {
    "float32": tf.float32, "fp32": tf.float32, "float": tf.float32,
    "bfloat16": tf.bfloat16, "bf16": tf.bfloat16,
    "float16": tf.float16, "fp16": tf.float16, "half": tf.float16,
}
STORAGE_DTYPES = (tf.float32, tf.bfloat16, tf.float16)
ROUNDINGS = ("nearest", "stochastic")

# The gradient of the lookup's upcast: the incoming float32 gradient as it is, so that the
# optimizer receives the float32 gradient (TF's Cast gradient would round it to the storage
# dtype first).
_UPCAST_GRADIENT = "MxrecStorageUpcast"


@ops.RegisterGradient(_UPCAST_GRADIENT)
def _upcast_gradient(op, grad):
    del op
    return grad


def resolve(table: str, value, setting: str = "storage_dtype") -> tf.DType:
    """`value` (a tf.DType, NumPy dtype or name such as "bfloat16", "bf16", "fp16") as one of
    STORAGE_DTYPES.

    Raises:
        TypeError: a value that names no dtype, or a dtype rows cannot rest in.
    """
    where = f"create_table {table!r}: {setting}"
    if isinstance(value, str):
        dtype = _ALIASES.get(value.lower())
        if dtype is None:
            raise TypeError(f"{where} must be one of {sorted(_ALIASES)} (or the tf dtype), "
                            f"got {value!r}")
        return dtype
    try:
        dtype = tf.as_dtype(value)
    except TypeError as err:
        raise TypeError(f"{where} must be tf.float32, tf.bfloat16 or tf.float16, "
                        f"got {value!r}") from err
    if dtype not in STORAGE_DTYPES:
        raise TypeError(f"{where} must be tf.float32, tf.bfloat16 or tf.float16, "
                        f"got {dtype.name}")
    return dtype


def check_rounding(table: str, rounding) -> Tuple[str, int]:
    """create_table's `rounding`, checked, as (mode, seed): "nearest" (round-to-nearest-
    even), "stochastic" (seed 0) or ("stochastic", seed) with an int seed."""
    seed = 0
    if isinstance(rounding, tuple) and len(rounding) == 2 and rounding[0] == "stochastic":
        rounding, seed = rounding
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
                or not 0 <= seed < 2**31:
            raise ValueError(f"create_table {table!r}: the seed of rounding=('stochastic', "
                             f"seed) must be an int in [0, 2^31), got {seed!r}")
    if not isinstance(rounding, str) or rounding not in ROUNDINGS:
        raise ValueError(f"create_table {table!r}: rounding must be 'nearest', 'stochastic' or "
                         f"('stochastic', seed), got {rounding!r}")
    return rounding, int(seed)


def of(table) -> tf.DType:
    """The storage dtype of a table (float32 for tables that predate the setting)."""
    return getattr(table, "storage_dtype", tf.float32)


def is_reduced(table) -> bool:
    """Whether `table`'s rows or optimizer slots rest in fewer bits than they are computed
    in (its optimizers then update it through mxrec.optimizers.rounded)."""
    return of(table) != tf.float32 or getattr(table, "slot_dtype", tf.float32) != tf.float32


def upcast(rows: tf.Tensor) -> tf.Tensor:
    """Stored rows as float32 (exact), whose gradient stays float32."""
    if rows.dtype == tf.float32:
        return rows
    with rows.graph.gradient_override_map({"Cast": _UPCAST_GRADIENT}):
        return tf.cast(rows, tf.float32)


@tf.custom_gradient
def _upcast_on_tape(rows):
    def gradient(upstream):
        return upstream

    return tf.cast(rows, tf.float32), gradient


def upcast_on_tape(rows: tf.Tensor) -> tf.Tensor:
    """`upcast` for TF2 code (eager, tf.function, GradientTape): the tape ignores
    gradient_override_map, so the cast gets a custom gradient that passes the float32
    gradient through unrounded (mxrec.keras tables)."""
    if rows.dtype == tf.float32:
        return rows
    return _upcast_on_tape(rows)


def store(values: tf.Tensor, table, seed: Optional[tf.Tensor] = None,
          dtype: Optional[tf.DType] = None) -> tf.Tensor:
    """float32 `values` rounded to `dtype` (default: the table's storage dtype): to nearest
    (even), or with `seed` ([2] int64, a stateless random seed) stochastically."""
    dtype = of(table) if dtype is None else dtype
    if seed is None or dtype == tf.float32:
        return tf.cast(values, dtype)
    return stochastic(tf.cast(values, tf.float32), dtype, seed)


def stochastic(values: tf.Tensor, dtype: tf.DType, seed: tf.Tensor) -> tf.Tensor:
    """float32 `values` rounded to `dtype` (bfloat16 or float16) up or down, up with the
    probability of the distance to the lower neighbour over the step between the two: the
    expected stored value is the float32 value (an update smaller than half a step still
    moves the row on average). `seed`: a [2] stateless seed; the same seed, the same bits.

    bfloat16: a uniform 16-bit integer added to the float32 bits, the low 16 bits then
    dropped (the magnitude rounds up when the carry reaches bit 16). float16: its step at
    the value (2^(exponent - 10), at least 2^-24 for subnormals), the value floored to it and
    raised by one step with that probability.
    """
    if dtype == tf.bfloat16:
        noise = tf.random.stateless_uniform(tf.shape(values), seed, minval=0, maxval=1 << 16,
                                            dtype=tf.int32)
        bits = tf.bitwise.bitwise_and(tf.bitcast(values, tf.int32) + noise, -(1 << 16))
        return tf.cast(tf.bitcast(bits, tf.float32), tf.bfloat16)
    exponent = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.bitcast(values, tf.int32), 23),
                                      0xFF) - 127
    step_exponent = tf.maximum(exponent, -14) - 10
    step = tf.bitcast(tf.bitwise.left_shift(step_exponent + 127, 23), tf.float32)
    lower = tf.floor(values / step) * step
    draw = tf.random.stateless_uniform(tf.shape(values), seed, dtype=tf.float32)
    rounded = tf.where(draw * step < values - lower, lower + step, lower)
    # inf, NaN and values past float16's range: as the nearest rounding gives them
    return tf.where(tf.math.is_finite(values) & (tf.abs(values) <= 65504.0),
                    tf.cast(rounded, tf.float16), tf.cast(values, tf.float16))


class StorageInitializer:
    """A table variable's initializer in its storage dtype: `initializer`'s float32 values,
    rounded to nearest (even)."""

    def __init__(self, initializer, dtype: tf.DType):
        self.initializer = initializer
        self.dtype = dtype

    def __call__(self, shape, dtype=None, partition_info=None):
        del dtype
        if not callable(self.initializer):  # a tensor of initial values
            return tf.cast(self.initializer, self.dtype)
        return tf.cast(self.initializer(shape, dtype=tf.float32, partition_info=partition_info),
                       self.dtype)


# ---------------------------------------------------------------- table files (NumPy)

def file_dtype(dtype) -> np.dtype:
    """The NumPy dtype a state resting in `dtype` has in a table file."""
    dtype = tf.as_dtype(dtype)
    if dtype == tf.bfloat16:
        return np.dtype(np.uint16)
    if dtype == tf.float16:
        return np.dtype(np.float16)
    return np.dtype(np.float32)


def to_file(values, dtype) -> np.ndarray:
    """Rows of a state resting in `dtype` (as a session returns them, or float32 values that
    are already representable) in their file form: bfloat16 as its 16 bits."""
    dtype = tf.as_dtype(dtype)
    values = np.asarray(values)
    if dtype == tf.bfloat16:
        return np.ascontiguousarray(values.astype(tf.bfloat16.as_numpy_dtype)).view(np.uint16)
    return values.astype(file_dtype(dtype), copy=False)


def from_file(values) -> np.ndarray:
    """A state's rows from a table file as float32 (exact): uint16 arrays hold bfloat16 bits."""
    values = np.asarray(values)
    if values.dtype == np.uint16:
        return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return values.astype(np.float32, copy=False)


def variable_dtype(variable) -> Optional[tf.DType]:
    """The dtype a variable's values rest in (None for anything else)."""
    dtype = getattr(variable, "dtype", None)
    return None if dtype is None else tf.as_dtype(dtype).base_dtype

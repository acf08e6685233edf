"""The lookup's last step: each position's row from the batch's unique rows.

    emb[i]         = unique_emb[restore[i]], or the default row where restore[i] == U
    d unique_emb[j] = the sum of d emb[i] over the positions with restore[i] == j
                     (positions with restore[i] == U get no gradient)

with unique_emb [U, dim] the rows the lookup gathered from its table and restore [N]
the key stage's restore index. On the CPU one op does each direction
(`MxrecGatherRows`, and `MxrecGatherRowsGrad` as its registered gradient): the
default row is not concatenated to the unique rows, and the gradient is summed into
the U unique rows directly (no [U + 1, dim] sum and slice). Elsewhere (a table on a
GPU: the ops have no GPU kernel) and for value types other than float32/float64 the
lookup keeps TensorFlow's composition, `concat([unique_emb, default])[restore]` with
`unsorted_segment_sum(d emb, restore, U + 1)[:U]` as its gradient. The two give the
same floats, bit for bit, in both directions: the gradient adds each row's positions
in increasing order from zero, as unsorted_segment_sum does on the CPU
(tests/test_gather_rows.py).
"""

import contextlib
from typing import Iterator, Optional

import tensorflow as tf

from mxrec._lib import loader
from mxrec.util.device import accelerator_device
from mxrec.util.gradients import custom_gradient

_FUSED_TYPES = (tf.float32, tf.float64)
_INDEX_TYPES = (tf.int32, tf.int64)
# Whether lookups built now use the fused ops where they can (fused_gather).
_fused_enabled = [True]


@contextlib.contextmanager
def fused_gather(enabled: bool) -> Iterator[None]:
    """Lookups built inside use the fused ops (True, the default) or always TensorFlow's
    composition (False; for A/B measurements and tests). Read when a lookup is built."""
    previous = _fused_enabled[0]
    _fused_enabled[0] = bool(enabled)
    try:
        yield
    finally:
        _fused_enabled[0] = previous


def uses_fused(unique_emb: tf.Tensor, restore: tf.Tensor, device: Optional[str]) -> bool:
    """Whether restore_rows builds the fused ops for these inputs on `device` (the
    table's device; None: unique_emb's, or where an unplaced table would go)."""
    if not _fused_enabled[0]:
        return False
    if unique_emb.dtype not in _FUSED_TYPES or restore.dtype not in _INDEX_TYPES:
        return False
    where = device or unique_emb.device or accelerator_device()
    return tf.DeviceSpec.from_string(where).device_type in (None, "CPU")


def restore_rows(unique_emb: tf.Tensor, restore: tf.Tensor, default_row=None,
                 device: Optional[str] = None) -> tf.Tensor:
    """unique_emb [U, dim] gathered at restore [N] (U means the default row), with a dense
    gradient for unique_emb. default_row: [dim] for positions without a row; zeros when
    None. device: where the table's rows live (see uses_fused)."""
    if uses_fused(unique_emb, restore, device):
        return _fused(unique_emb, restore, default_row, device)
    return composed_restore_rows(unique_emb, restore, default_row)


def _default(unique_emb: tf.Tensor, default_row) -> tf.Tensor:
    if default_row is None:
        return tf.zeros(tf.stack([tf.shape(unique_emb)[1]]), unique_emb.dtype)
    return tf.reshape(tf.cast(default_row, unique_emb.dtype), [-1])


def _fused(unique_emb, restore, default_row, device):
    with tf.device(device or "/device:CPU:0"):
        return loader.op_library().mxrec_gather_rows(
            unique_emb=unique_emb, restore=restore, default_row=_default(unique_emb, default_row))


@tf.RegisterGradient("MxrecGatherRows")
def _gather_rows_grad(op, grad):
    unique_emb, restore = op.inputs[0], op.inputs[1]
    # GradientTape's eager op record has no device; the kernel is the CPU's.
    device = getattr(op, "device", None)
    with tf.device("/device:CPU:0" if device is None else device):
        num_unique = tf.shape(unique_emb, out_type=restore.dtype)[0]
        unique_grad = loader.op_library().mxrec_gather_rows_grad(
            grad=grad, restore=restore, num_unique=num_unique)
    return [unique_grad, None, None]


def composed_restore_rows(unique_emb: tf.Tensor, restore: tf.Tensor, default_row=None):
    """TensorFlow's composition of restore_rows (any device and value type)."""

    @custom_gradient  # tf.custom_gradient would keep the graph alive (mxrec.util.gradients)
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

"""Initial values of table variables and their optimizer slots that Grappler cannot fold.

A constant initializer (zeros, ones, `constant_initializer(0.1)`, the Adagrad accumulator's
initial value, Adam's and FTRL's slots) gives a variable a `Fill` of constants or a
broadcast `Const`. Grappler folds the `Fill` into a `Const` the size of the whole table; the
initializer's executor keeps that constant's tensor for as long as the session lives, and
the variable's buffer is that tensor (AssignVariableOp adopts its input's buffer). The first
sparse update of the variable (a refill's scatter, the optimizer's sparse apply) then finds
the buffer shared and copies the whole table before writing one row (TensorFlow's
copy-on-write in EnsureSparseVariableAccess), and the constant stays resident beside the
copy: a second table's worth of host memory per constant-initialized variable, and a
whole-table copy in the first training step (95 MB, 40 ms on one process and 210 ms on each
of 2 ranks sharing 2 cores, measured on the streaming bench's 3.12 M x 8 table).

`unfolded(value)` rebuilds such a value as a `Fill` whose scalar comes through `DeepCopy`,
a stateful op that neither Grappler nor the graph optimizer's constant folding (which folds
outputs up to 10 MB, a `PlaceholderWithDefault` among them) folds, so the `Fill` runs once
when the initializer runs and its fresh buffer becomes the variable's alone. The values are
the same bits. Initial values that are not constants (random initializers) pass through.
"""

import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow.python.framework import tensor_util
from tensorflow.python.util import tf_inspect

# Which repeated field of a TensorProto holds a dtype's values.
_VALUE_FIELDS = ("half_val", "float_val", "double_val", "int_val", "int64_val", "bool_val",
                 "uint32_val", "uint64_val")


def unfolded(value: tf.Tensor) -> tf.Tensor:
    """`value` as a Fill of a non-foldable scalar when it is a constant filled with one value
    (a Fill of two Consts, or a Const broadcasting one stored value); otherwise `value`."""
    if not isinstance(value, tf.Tensor) or tf.executing_eagerly():
        return value
    op = value.op
    if op.type == "Fill" and all(x.op.type == "Const" for x in op.inputs):
        dims, scalar = op.inputs[0], op.inputs[1]
    elif op.type == "Const":
        scalar = _broadcast_scalar(op)
        if scalar is None:
            return value
        dims = tf.constant(value.shape.as_list(), tf.int64)
    else:
        return value
    with tf.name_scope(op.name.rsplit("/", 1)[-1] + "_unfolded"):
        fresh = _fill(dims, scalar)
    fresh.set_shape(value.shape)
    return fresh


def _fill(dims, scalar) -> tf.Tensor:
    """Fill(dims, DeepCopy(scalar)): no constant folding folds it."""
    with tf.control_dependencies(None):
        with tf.device("/device:CPU:0"):  # a scalar; DeepCopy has CPU kernels for every type
            scalar = tf.raw_ops.DeepCopy(x=scalar)
        return tf.fill(dims, scalar)


def _broadcast_scalar(op):
    """A scalar Const of the one value a Const op's proto stores for all its elements, or
    None when the proto stores its values in full (or the op is small or not fully
    shaped)."""
    proto = op.get_attr("value")
    shape = tf.TensorShape(proto.tensor_shape)
    if not shape.is_fully_defined() or shape.num_elements() <= 1 or proto.tensor_content:
        return None
    stored = [f for f in _VALUE_FIELDS if len(getattr(proto, f))]
    if len(stored) != 1 or len(getattr(proto, stored[0])) != 1:
        return None
    scalar = tensor_pb2.TensorProto()
    scalar.CopyFrom(proto)
    scalar.tensor_shape.Clear()
    return tf.constant(tensor_util.MakeNdarray(scalar), dtype=op.outputs[0].dtype)


class UnfoldedInitializer:
    """A variable initializer (as `tf.compat.v1.get_variable` calls one) whose result goes
    through `unfolded`; `initializer` is kept as `.initializer`."""

    def __init__(self, initializer):
        if tf_inspect.isclass(initializer):
            initializer = initializer()
        self.initializer = initializer

    def __call__(self, shape, dtype=None, partition_info=None):
        # As get_variable calls the initializer: partition_info only where it takes one
        # (TF2 and Keras initializers do not).
        kwargs = {} if dtype is None else {"dtype": dtype}
        if (partition_info is not None
                and "partition_info" in tf_inspect.getfullargspec(self.initializer).args):
            kwargs["partition_info"] = partition_info
        return unfolded(self.initializer(shape, **kwargs))


class FilledInitializer:
    """Every element `value` (a Python number): a Fill of a scalar no constant folding
    folds (a variable's buffer of its own, see the module docstring)."""

    def __init__(self, value):
        self.value = value

    def __call__(self, shape, dtype=tf.float32, partition_info=None):
        del partition_info
        return _fill(shape, tf.constant(self.value, tf.as_dtype(dtype)))


def unfolded_initializer(initializer):
    """`initializer` wrapped in UnfoldedInitializer; None and tensors as they are."""
    if initializer is None or isinstance(initializer, tf.Tensor) or not callable(initializer):
        return initializer
    return UnfoldedInitializer(initializer)

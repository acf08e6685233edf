"""Constant initial values of tables and slots are not folded into constants that the
variables would share (mxrec.core.initial_values): the first sparse update must not copy a
whole table, and the values must be the initializer's bits.

The detector is TensorFlow's own step trace: a node that allocates a table's worth of bytes
in the first training step is the copy-on-write copy. A plain TF variable with the same
initializer shows the copy (the detector works); mxrec's tables and slots must not.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core import initial_values
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import adagrad, ftrl, gradient_descent, lazy_adam, momentum

_v1 = tf.compat.v1
ROWS, DIM = 40_000, 8
TABLE_BYTES = ROWS * DIM * 4

OPTIMIZERS = {
    "sgd": (lambda: gradient_descent.create_hash_optimizer(0.1), {}),
    "adagrad": (lambda: adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0.5),
                {"accumulator": 0.5}),
    "lazy_adam": (lambda: lazy_adam.create_hash_optimizer(0.01), {"m": 0.0, "v": 0.0}),
    "ftrl": (lambda: ftrl.create_hash_optimizer(0.1, initial_accumulator_value=0.25),
             {"accum": 0.25, "linear": 0.0}),
    "momentum": (lambda: momentum.create_hash_optimizer(0.1, momentum=0.9),
                 {"momentum": 0.0}),
}


def _largest_allocation(sess, fetch, feed=None) -> int:
    meta = _v1.RunMetadata()
    sess.run(fetch, feed, options=_v1.RunOptions(trace_level=_v1.RunOptions.FULL_TRACE),
             run_metadata=meta)
    sizes = [m.total_bytes for dev in meta.step_stats.dev_stats for node in dev.node_stats
             for m in node.memory]
    return max(sizes, default=0)


def test_detector_sees_the_copy_of_a_plain_constant_initialized_variable():
    var = _v1.get_variable("plain", [ROWS, DIM], tf.float32, tf.zeros_initializer(),
                           use_resource=True)
    update = var.scatter_update(tf.IndexedSlices(tf.ones([2, DIM]),
                                                 tf.constant([3, 5], tf.int64)))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        assert _largest_allocation(sess, update.op) >= TABLE_BYTES
        assert _largest_allocation(sess, update.op) < TABLE_BYTES  # copied once only


@pytest.mark.parametrize("initializer,value", [
    (tf.zeros_initializer(), 0.0),
    (_v1.zeros_initializer(), 0.0),
    (tf.constant_initializer(0.1), np.float32(0.1)),
    (_v1.constant_initializer(-2.5), -2.5),
    (_v1.ones_initializer, 1.0),  # a class: get_variable instantiates it
    (tf.keras.initializers.Zeros(), 0.0),
])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_first_step_copies_no_table_or_slot(mx, initializer, value, opt_name):
    mx()
    table = create_table(tf.int64, DIM, "t", initializer, device_vocabulary_size=ROWS)
    ids = _v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    loss = tf.reduce_sum(tf.square(emb - 1.0))
    (grad,) = tf.gradients(loss, [table.variable])
    factory, slot_values = OPTIMIZERS[opt_name]
    opt = factory()
    train = opt.apply_gradients([(grad, table.variable)])
    slots = {name: opt.get_slot(table.variable, name) for name in slot_values}
    assert set(opt.get_slot_names()) == set(slot_values)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        largest = _largest_allocation(sess, train, {ids: [7, 9, 7, 11]})
        assert largest < TABLE_BYTES // 100, (opt_name, largest)
        # the initializer's values, bit for bit, in every row the step did not touch (a
        # fetch before the step would hold the buffer and cause the copy itself)
        values = {"table": (sess.run(table.variable)[:ROWS], value)}
        values.update((name, (sess.run(slots[name]), v)) for name, v in slot_values.items())
    for name, (got, expected) in values.items():
        untouched = ~np.any(got != np.float32(expected), axis=1)
        assert untouched.sum() >= ROWS - 3, name
        np.testing.assert_array_equal(got[untouched], np.full([untouched.sum(), DIM], expected,
                                                             np.float32))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32, tf.int64, tf.float16])
def test_unfolded_fill_and_broadcast_const_keep_their_values(dtype):
    fill = tf.fill([300, 7], tf.constant(3, dtype))
    broadcast = tf.constant(5, dtype, shape=[300, 7])
    out = [initial_values.unfolded(t) for t in (fill, broadcast)]
    for t in out:
        assert t.op.type == "Fill"
        assert t.op.inputs[1].op.type == "DeepCopy"
        assert t.shape == (300, 7) and t.dtype == dtype
    with _v1.Session() as sess:
        got = sess.run(out)
    np.testing.assert_array_equal(got[0], np.full([300, 7], 3, dtype.as_numpy_dtype))
    np.testing.assert_array_equal(got[1], np.full([300, 7], 5, dtype.as_numpy_dtype))


def test_unfolded_leaves_what_is_not_a_one_value_constant():
    full = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    scalar = tf.constant(1.5)
    random = tf.random.truncated_normal([10, 4], seed=1)
    variable_fill = tf.fill([3, 4], _v1.placeholder(tf.float32, []))
    for t in (full, scalar, random, variable_fill):
        assert initial_values.unfolded(t) is t
    assert initial_values.unfolded_initializer(None) is None


def test_unfolded_initializer_passes_partition_info_only_when_given():
    seen = {}

    def v1_style(shape, dtype=None, partition_info=None):
        seen["partition_info"] = partition_info
        return tf.zeros(shape, dtype)

    def v2_style(shape, dtype=None):
        return tf.ones(shape, dtype)

    a = initial_values.unfolded_initializer(v1_style)([200, 8], tf.float32, partition_info=None)
    b = initial_values.unfolded_initializer(v2_style)([200, 8], tf.float32)
    assert seen == {"partition_info": None}
    info = object()
    initial_values.unfolded_initializer(v1_style)([200, 8], tf.float32, partition_info=info)
    assert seen == {"partition_info": info}
    # a TF2 initializer is called without it, as get_variable would call it
    c = initial_values.unfolded_initializer(v2_style)([200, 8], tf.float32, partition_info=info)
    assert c.op.type == "Fill"
    with _v1.Session() as sess:
        np.testing.assert_array_equal(sess.run(a), np.zeros([200, 8], np.float32))
        np.testing.assert_array_equal(sess.run(b), np.ones([200, 8], np.float32))

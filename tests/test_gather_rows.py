"""The fused restore gather (MxrecGatherRows) and its gradient (MxrecGatherRowsGrad)
against NumPy and against TensorFlow's composition it replaces
(concat(unique, default)[restore], unsorted_segment_sum(dy, restore, U + 1)[:U]):
values bit for bit, in both directions, on the paths the kernels take (one thread, and
the sort-by-row parallel sum for large gradients), empty batches, int32/int64 restore
indices, errors; and the lookups that use it train exactly as with the composition."""

import numpy as np
import pytest
import tensorflow as tf
from reference import distinct_rows_initializer

from mxrec._lib import loader
from mxrec.core import gather
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import adagrad, lazy_adam

# The kernels' threshold (N * dim values) above which they work in shards.
PARALLEL_VALUES = 1 << 18


def _numpy_forward(unique, restore, default):
    padded = np.concatenate([unique, default.reshape(1, -1)], axis=0)
    return padded[restore]


def _numpy_grad(dy, restore, num_unique):
    """Each row's positions added in increasing order, from zero, in dy's dtype."""
    out = np.zeros((num_unique, dy.shape[1]), dy.dtype)
    for i, row in enumerate(restore):
        if row < num_unique:
            out[row] = out[row] + dy[i]
    return out


def _bits(array):
    array = np.ascontiguousarray(array)
    return array.view(np.uint64 if array.dtype == np.float64 else np.uint32)


def _plan(rng, num_unique, n, default_share=0.2):
    """restore [n]: every unique row used at least once where n allows, some positions
    at the default (== num_unique), power-law repeats."""
    weights = 1.0 / np.arange(1, num_unique + 1) ** 1.1 if num_unique else np.zeros(0)
    if num_unique:
        restore = rng.choice(num_unique, size=n, p=weights / weights.sum())
        restore[:min(n, num_unique)] = rng.permutation(num_unique)[:n]
        rng.shuffle(restore)
    else:
        restore = np.zeros(n, np.int64)
    restore[rng.random(n) < default_share] = num_unique
    return restore


def _run_both(make_session, unique, restore, default, dy, index_dtype):
    """(forward, gradient) of the fused ops and of the composition, in one graph."""
    unique_t = tf.constant(unique)
    restore_t = tf.constant(restore.astype(index_dtype.as_numpy_dtype))
    default_t = None if default is None else tf.constant(default)
    fused = gather.restore_rows(unique_t, restore_t, default_t, device="/device:CPU:0")
    composed = gather.composed_restore_rows(unique_t, restore_t, default_t)
    types = {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
    assert "MxrecGatherRows" in types
    dy_t = tf.constant(dy)
    fused_grad = tf.gradients(fused, unique_t, grad_ys=dy_t)[0]
    composed_grad = tf.gradients(composed, unique_t, grad_ys=dy_t)[0]
    assert fused_grad.op.type == "MxrecGatherRowsGrad"
    sess = make_session()
    return sess.run([fused, composed, fused_grad, composed_grad])


CASES = [
    # (num_unique, n, dim): small (one-thread gradient), large (parallel gradient)
    (7, 40, 4),
    (300, 1000, 16),
    (5000, PARALLEL_VALUES // 16 + 777, 16),
    (1, 50, 3),
]


@pytest.mark.parametrize("num_unique,n,dim", CASES)
@pytest.mark.parametrize("value_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("with_default", [False, True])
def test_matches_numpy_and_the_composition(make_session, num_unique, n, dim, value_dtype,
                                           index_dtype, with_default):
    rng = np.random.default_rng(num_unique * 31 + n)
    unique = rng.standard_normal((num_unique, dim)).astype(value_dtype)
    restore = _plan(rng, num_unique, n)
    default = rng.standard_normal(dim).astype(value_dtype) if with_default else None
    # Gradients of mixed magnitudes, so that a different order of additions would
    # change the floats.
    dy = (rng.standard_normal((n, dim)) * 10.0 ** rng.integers(-6, 6, (n, 1))).astype(
        value_dtype)
    fused, composed, fused_grad, composed_grad = _run_both(
        make_session, unique, restore, default, dy, index_dtype)
    default_np = default if with_default else np.zeros(dim, value_dtype)
    np.testing.assert_array_equal(_bits(fused), _bits(_numpy_forward(unique, restore,
                                                                     default_np)))
    np.testing.assert_array_equal(_bits(fused), _bits(composed))
    np.testing.assert_array_equal(_bits(fused_grad), _bits(_numpy_grad(dy, restore,
                                                                       num_unique)))
    np.testing.assert_array_equal(_bits(fused_grad), _bits(composed_grad))
    assert fused.dtype == value_dtype and fused_grad.shape == (num_unique, dim)


def test_order_of_additions_is_unsorted_segment_sums():
    """One row summed from values whose sum depends on the order: the fused gradient must
    add them in position order, as the reference does (and not, say, pairwise)."""
    tf.compat.v1.reset_default_graph()
    values = np.array([[1e8], [1.0], [-1e8], [1.0], [0.5]], np.float32)
    restore = tf.constant([0, 0, 0, 0, 1], tf.int32)
    unique = tf.constant(np.zeros((1, 1), np.float32))
    out = gather.restore_rows(unique, restore, device="/device:CPU:0")
    grad = tf.gradients(out, unique, grad_ys=tf.constant(values))[0]
    with tf.compat.v1.Session() as sess:
        got = sess.run(grad)
    expected = np.float32(np.float32(np.float32(np.float32(0) + np.float32(1e8)) + 1)
                          - np.float32(1e8)) + np.float32(1)
    np.testing.assert_array_equal(got, [[expected]])


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("num_unique,n", [(0, 0), (0, 5), (4, 0)])
def test_empty_batches(make_session, index_dtype, num_unique, n):
    dim = 3
    unique = np.arange(num_unique * dim, dtype=np.float32).reshape(num_unique, dim)
    restore = np.full(n, num_unique)
    default = np.array([1.5, -2.0, 0.25], np.float32)
    dy = np.ones((n, dim), np.float32)
    fused, composed, fused_grad, composed_grad = _run_both(
        make_session, unique, restore, default, dy, index_dtype)
    assert fused.shape == (n, dim) and fused_grad.shape == (num_unique, dim)
    np.testing.assert_array_equal(fused, np.tile(default, (n, 1)))
    np.testing.assert_array_equal(fused, composed)
    np.testing.assert_array_equal(fused_grad, np.zeros((num_unique, dim), np.float32))
    np.testing.assert_array_equal(fused_grad, composed_grad)


def test_default_positions_get_no_gradient(make_session):
    unique = np.ones((2, 2), np.float32)
    restore = np.array([2, 0, 2, 2, 1, 0])
    dy = np.arange(12, dtype=np.float32).reshape(6, 2)
    _, _, fused_grad, _ = _run_both(make_session, unique, restore, None, dy, tf.int64)
    np.testing.assert_array_equal(fused_grad, [[2 + 10, 3 + 11], [8, 9]])


@pytest.mark.parametrize("bad", [-1, 4, 2**31 - 1])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_restore_out_of_range_is_invalid_argument(bad, index_dtype):
    ops = loader.op_library()
    restore = tf.compat.v1.placeholder(index_dtype, [None])
    unique = tf.constant(np.ones((3, 2), np.float32))
    emb = ops.mxrec_gather_rows(unique_emb=unique, restore=restore,
                                default_row=tf.zeros([2]), name="fwd")
    grad = ops.mxrec_gather_rows_grad(grad=tf.ones([4, 2]), restore=restore,
                                      num_unique=tf.constant(3, index_dtype), name="bwd")
    feed = {restore: [0, 3, bad, 1]}
    with tf.compat.v1.Session() as sess:
        for tensor, op_name in ((emb, "MxrecGatherRows (fwd)"), (grad,
                                                                 "MxrecGatherRowsGrad (bwd)")):
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                sess.run(tensor, feed)
            message = str(info.value)
            assert op_name in message
            assert f"restore[2] = {bad} is not in [0, 3]" in message
        # In range (3 is the default row) both run.
        sess.run([emb, grad], {restore: [0, 3, 2, 1]})


def test_shape_errors():
    ops = loader.op_library()
    with pytest.raises(ValueError, match="must be rank 2|Shape must be rank 2"):
        ops.mxrec_gather_rows(unique_emb=tf.zeros([3]), restore=tf.zeros([2], tf.int32),
                              default_row=tf.zeros([3]))
    with pytest.raises(ValueError, match="Dimensions must be equal|must be equal"):
        ops.mxrec_gather_rows(unique_emb=tf.zeros([3, 2]), restore=tf.zeros([2], tf.int32),
                              default_row=tf.zeros([5]))
    # Shapes known only at run time reach the kernel's checks.
    default = tf.compat.v1.placeholder(tf.float32, None)
    grad_in = tf.compat.v1.placeholder(tf.float32, None)
    emb = ops.mxrec_gather_rows(unique_emb=tf.zeros([3, 2]), restore=tf.zeros([2], tf.int32),
                                default_row=default)
    grad = ops.mxrec_gather_rows_grad(grad=grad_in, restore=tf.zeros([2], tf.int32),
                                      num_unique=tf.constant(3))
    num = tf.compat.v1.placeholder(tf.int32, None)
    grad_neg = ops.mxrec_gather_rows_grad(grad=tf.zeros([0, 2]), restore=tf.zeros([0], tf.int32),
                                          num_unique=num)
    with tf.compat.v1.Session() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="default_row must be a "
                                                                  "vector of 2 values"):
            sess.run(emb, {default: np.zeros(3, np.float32)})
        with pytest.raises(tf.errors.InvalidArgumentError, match="grad has 5 rows but restore"
                                                                  " 2 positions"):
            sess.run(grad, {grad_in: np.zeros((5, 2), np.float32)})
        with pytest.raises(tf.errors.InvalidArgumentError, match="num_unique must be >= 0"):
            sess.run(grad_neg, {num: -1})


def test_composition_kept_off_the_cpu_and_for_other_types():
    """A table on a GPU keeps the composition (the ops have no GPU kernel), as do value
    types other than float32/float64 and lookups built under fused_gather(False)."""
    restore = tf.zeros([4], tf.int32)
    cases = [
        (tf.zeros([3, 2]), "/device:GPU:0", False),
        (tf.zeros([3, 2]), "/job:worker/task:0/device:GPU:1", False),
        (tf.zeros([3, 2], tf.float16), "/device:CPU:0", False),
        (tf.zeros([3, 2]), "/device:CPU:0", True),
        (tf.zeros([3, 2]), "/job:worker/task:1/device:CPU:0", True),
    ]
    for unique, device, fused in cases:
        assert gather.uses_fused(unique, restore, device) is fused, device
        graph_before = {op.name for op in tf.compat.v1.get_default_graph().get_operations()}
        out = gather.restore_rows(unique, restore, device=device)
        new_types = {op.type for op in tf.compat.v1.get_default_graph().get_operations()
                     if op.name not in graph_before}
        assert ("MxrecGatherRows" in new_types) is fused
        assert ("GatherV2" in new_types) is not fused
        assert out.dtype == unique.dtype
    with gather.fused_gather(False):
        assert not gather.uses_fused(tf.zeros([3, 2]), restore, "/device:CPU:0")
    assert gather.uses_fused(tf.zeros([3, 2]), restore, "/device:CPU:0")


def _train(make_session, fused, optimizer, batches, default_value=None):
    """Three lookups of two tables (one repeated: two lookups of one table in a step)
    trained on `batches`; returns the losses, the embeddings and the final variables."""
    tf.compat.v1.reset_default_graph()
    from mxrec.util import initialize
    initialize.terminate_config_initializer()
    initialize.init()
    dim = 4
    ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
    with gather.fused_gather(fused):
        tables = [create_table(tf.int64, dim, f"t{k}", distinct_rows_initializer(),
                               device_vocabulary_size=64) for k in range(2)]
        embs = [sparse_lookup(tables[0], ids[:, 0], name="l0"),
                sparse_lookup(tables[1], ids[:, 1], name="l1"),
                sparse_lookup(tables[0], ids[:, 2], name="l2")]
        x = tf.concat(embs, axis=1)
        weights = tf.constant(np.linspace(-1.0, 2.0, 3 * dim, dtype=np.float32))
        loss = tf.reduce_sum(tf.sin(x * weights))
        variables = [t.variable for t in tables]
        grads = tf.gradients(loss, variables)
        train = optimizer().apply_gradients(zip(grads, variables))
    types = {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
    assert ("MxrecGatherRows" in types) is fused
    assert ("MxrecGatherRowsGrad" in types) is fused
    sess = make_session()
    out = []
    for batch in batches:
        out.append(sess.run([loss, x, train], {ids: batch})[:2])
    final = sess.run([t.variable for t in tables])
    initialize.terminate_config_initializer()
    return out, final


@pytest.mark.parametrize("optimizer", [
    lambda: adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0.5),
    lambda: lazy_adam.create_hash_optimizer(0.02, beta1=0.8, beta2=0.95, epsilon=1e-6),
], ids=["adagrad", "lazy_adam"])
def test_lookups_train_exactly_as_with_the_composition(make_session, optimizer):
    rng = np.random.default_rng(5)
    batches = [rng.integers(0, 40, (50, 3)).astype(np.int64) for _ in range(4)]
    with_fused = _train(make_session, True, optimizer, batches)
    composed = _train(make_session, False, optimizer, batches)
    for (loss_a, x_a), (loss_b, x_b) in zip(with_fused[0], composed[0]):
        np.testing.assert_array_equal(_bits(np.float32(loss_a)), _bits(np.float32(loss_b)))
        np.testing.assert_array_equal(_bits(x_a), _bits(x_b))
    for a, b in zip(with_fused[1], composed[1]):
        np.testing.assert_array_equal(_bits(a), _bits(b))

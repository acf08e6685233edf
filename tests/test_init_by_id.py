"""create_table(init_by_id=True): a new ID's first values come from the ID, not from the row.

The reference below re-derives MxrecRowsById's stream in plain Python integers (SplitMix64
over a counter keyed by (seed, ID); Box-Muller; redraws past 2 stddev), so the op is
checked against an independent implementation, and every table mode is checked against
the op: an ID's row before its first update equals its draw whatever row, arrival order,
eviction, tier or rank count it meets.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import row_initializer
from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup
from mxrec.optimizers import adagrad, gradient_descent
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
_M = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return z ^ (z >> 31)


def reference_row(seed, key, dim, distribution, a, b):
    """One ID's row, in Python integers and floats (the op's documented stream)."""
    state = _mix(_mix((seed + _GOLDEN) & _M) ^ _mix((key + 2 * _GOLDEN) & _M))

    def uniform():
        nonlocal state
        state = (state + _GOLDEN) & _M
        return ((_mix(state) >> 11) + 0.5) * 2.0**-53

    spare = []

    def normal():  # Marsaglia's polar method, both values of a pair in turn
        if spare:
            return spare.pop()
        while True:
            u, v = 2.0 * uniform() - 1.0, 2.0 * uniform() - 1.0
            s = u * u + v * v
            if 0.0 < s < 1.0:
                break
        m = math.sqrt(-2.0 * math.log(s) / s)
        spare.append(v * m)
        return u * m

    row = []
    for _ in range(dim):
        if distribution == "uniform":
            row.append(a + (b - a) * uniform())
            continue
        z = normal()
        while distribution == "truncated_normal" and abs(z) > 2.0:
            z = normal()
        row.append(a + b * z)
    return np.asarray(row, np.float32)


def expected(table, ids):
    """The rows init_by_id gives `ids` in `table` (its ByIdSpec through the reference)."""
    spec = table.by_id
    np_a, np_b = np.float32(spec.a), np.float32(spec.b)  # the op's float attributes
    return np.stack([reference_row(spec.seed % 2**64, int(i) % 2**64, table.dim,
                                   spec.distribution, float(np_a), float(np_b)) * spec.scale
                     for i in ids])


@pytest.mark.parametrize("distribution,a,b", [("truncated_normal", 0.25, 0.5),
                                              ("normal", -1.0, 2.0), ("uniform", -0.3, 0.7)])
def test_the_op_draws_the_documented_stream(distribution, a, b):
    ids = np.array([0, 1, 7, 7, -1, -(2**63), 2**63 - 1, 123456789], np.int64)
    rows = loader.op_library().mxrec_rows_by_id(ids, dim=6, seed=-12345,
                                                distribution=distribution, a=a, b=b)
    with _v1.Session() as sess:
        got = sess.run(rows)
    want = np.stack([reference_row(-12345 % 2**64, int(i) % 2**64, 6, distribution, a, b)
                     for i in ids])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[2], got[3])  # the same ID, the same bits
    assert not np.allclose(got[1], got[2])
    if distribution == "truncated_normal":
        assert np.all(np.abs(got - a) <= 2 * b + 1e-6)
    if distribution == "uniform":
        assert np.all((got >= a) & (got < b))


def test_the_draw_has_the_initializers_spread():
    """Many IDs: the sample mean and stddev of TF's truncated normal (stddev 0.88 sigma)."""
    rows = loader.op_library().mxrec_rows_by_id(np.arange(20000, dtype=np.int64), dim=8,
                                                seed=3, distribution="truncated_normal",
                                                a=0.0, b=1.0)
    with _v1.Session() as sess:
        got = sess.run(rows)
    assert abs(got.mean()) < 0.01
    assert abs(got.std() - row_initializer._TRUNCATION) < 0.01  # noqa: SLF001


class Net:
    """One table, a training lookup of placeholder IDs, loss sum(emb * weights)."""

    def __init__(self, initializer, capacity=64, name="t", optimizer=None, config=None,
                 **table_kwargs):
        self.table = create_table(tf.int64, 3, name, initializer, device_vocabulary_size=capacity,
                                  init_by_id=True, **table_kwargs)
        self.ids = _v1.placeholder(tf.int64, [None], name="ids")
        self.emb = sparse_lookup(self.table, self.ids, access_and_evict_config=config)
        loss = tf.reduce_sum(self.emb * tf.constant([1.0, -2.0, 0.5]))
        optimizer = optimizer or gradient_descent.create_hash_optimizer(0.1)
        _, sparse = get_dense_and_sparse_variable()
        # The loss is linear, so its gradient does not wait for the lookup: the update
        # waits for it here, and the fetched rows are those before the update.
        with tf.control_dependencies([self.emb]):
            self.train_op = optimizer.apply_gradients(zip(tf.gradients(loss, sparse), sparse))

    def step(self, sess, ids):
        emb, _ = sess.run([self.emb, self.train_op], {self.ids: np.asarray(ids, np.int64)})
        return emb


def test_an_id_starts_from_its_draw_whatever_row_it_gets(mx, make_session):
    mx()
    init = _v1.truncated_normal_initializer(mean=0.1, stddev=0.3, seed=11)
    first = Net(init, name="t")
    sess = make_session()
    ids = [42, 7, 42, 2**40, -5]
    np.testing.assert_allclose(first.step(sess, ids), expected(first.table, ids), rtol=1e-6)
    rows_a = sess.run(first.table.variable)
    # Another arrival order (other rows for the same IDs) gives each ID the same start.
    _v1.reset_default_graph()
    mx()
    second = Net(init, name="t")
    sess = make_session()
    order = [2**40, -5, 99, 7, 42]
    got = second.step(sess, order)
    np.testing.assert_allclose(got, expected(second.table, order), rtol=1e-6)
    np.testing.assert_array_equal(got[[0, 1, 3, 4]], expected(first.table, [2**40, -5, 7, 42]))
    assert not np.array_equal(rows_a[:5], sess.run(second.table.variable)[:5])  # rows moved


def test_a_row_given_to_a_new_id_after_eviction_is_that_ids(mx, make_session):
    """Capacity 2 and eviction: the evicted row's next owner starts from its own draw, and
    an evicted ID that comes back starts from its draw again (SGD updates in between)."""
    mx()
    ts = _v1.placeholder(tf.int64, [None])
    add_timestamp(ts)
    net = Net(_v1.random_uniform_initializer(-1.0, 1.0, seed=3), capacity=2,
              config={"access_threshold": 0, "eviction_threshold": 10})
    sess = make_session()

    def step(ids, t):
        return sess.run([net.emb, net.train_op], {net.ids: np.asarray(ids, np.int64),
                                                   ts: np.asarray([t], np.int64)})[0]

    g = 0.1 * np.array([1.0, -2.0, 0.5], np.float32)
    first = step([1, 2], 0)
    np.testing.assert_allclose(first, expected(net.table, [1, 2]), rtol=1e-6)
    step([1], 20)
    assert net.table.evict(10) == 1  # 2, unseen for 20 s: its row goes to 3 next
    third = step([1, 3], 21)
    np.testing.assert_allclose(third[0], first[0] - 2 * g, rtol=1e-6)
    np.testing.assert_allclose(third[1], expected(net.table, [3])[0], rtol=1e-6)
    step([3], 40)
    assert net.table.evict(10) == 1  # 1 now; 2 comes back to its own start
    back = step([2, 3], 41)
    np.testing.assert_allclose(back[0], expected(net.table, [2])[0], rtol=1e-6)
    np.testing.assert_allclose(back[1], third[1] - 2 * g, rtol=1e-6)


def test_a_host_tier_swaps_in_new_ids_from_their_draw(mx, make_session):
    """6 device rows over a host tier: each new ID's first lookup is its draw; an ID that
    comes back from the host tier has its trained values (Adagrad, NumPy reference)."""
    mx()
    net = Net(_v1.random_normal_initializer(0.0, 0.5, seed=5), capacity=6,
              host_vocabulary_size=64, optimizer=adagrad.create_hash_optimizer(0.1))
    sess = make_session()
    grad = np.array([1.0, -2.0, 0.5], np.float32)
    values, accum = {}, {}
    for step in range(6):
        # 3 new IDs, 0 every step, and one back from the host tier (seen 2 steps ago).
        ids = [100 * step + k for k in (1, 2, 3)] + [0] + ([100 * (step - 2) + 2]
                                                           if step > 1 else [])
        emb = net.step(sess, ids)
        for position, key in enumerate(ids):
            if key not in values:
                values[key] = expected(net.table, [key])[0]
                accum[key] = np.full(3, 0.9, np.float32)  # Adagrad's initial accumulator
            np.testing.assert_allclose(emb[position], values[key], rtol=1e-5, atol=1e-6)
        for key in set(ids):
            g = grad * ids.count(key)
            accum[key] = accum[key] + g * g
            values[key] = values[key] - 0.1 * g / np.sqrt(accum[key])
    assert loader.engine().tier_stats(net.table.table_key)["swap_in_total"] > 0


def test_static_shapes_and_a_second_lookup_of_the_table(mx, make_session):
    """init(use_dynamic=False) pads the plan to send_count; two lookups of one table in a
    step share new IDs: both read the IDs' draws."""
    mx(use_dynamic=False)
    table = create_table(tf.int64, 3, "t", _v1.truncated_normal_initializer(stddev=0.2),
                         device_vocabulary_size=32, init_by_id=True)
    a = _v1.placeholder(tf.int64, [4])
    b = _v1.placeholder(tf.int64, [3])
    emb_a = sparse_lookup(table, a, send_count=8, name="a")
    emb_b = sparse_lookup(table, b, send_count=8, name="b")
    loss = tf.reduce_sum(emb_a) + tf.reduce_sum(emb_b)
    _, sparse = get_dense_and_sparse_variable()
    with tf.control_dependencies([emb_a, emb_b]):  # the rows fetched are those before it
        train = gradient_descent.create_hash_optimizer(0.1).apply_gradients(
            zip(tf.gradients(loss, sparse), sparse))
    sess = make_session()
    got_a, got_b, _ = sess.run([emb_a, emb_b, train], {a: [5, 6, 5, 9], b: [9, 77, 6]})
    np.testing.assert_allclose(got_a, expected(table, [5, 6, 5, 9]), rtol=1e-6)
    np.testing.assert_allclose(got_b, expected(table, [9, 77, 6]), rtol=1e-6)


def test_dynamic_expansion_draws_new_rows_from_their_ids(mx, make_session):
    mx(use_dynamic_expansion=True)
    table = create_table(tf.int64, 3, "t", _v1.truncated_normal_initializer(stddev=0.2, seed=1),
                         device_vocabulary_size=8, init_by_id=True)
    ids = _v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    sess = make_session()
    for batch in ([3, 1, 3], [8, 1, 12345]):
        np.testing.assert_allclose(sess.run(emb, {ids: batch}), expected(table, batch),
                                   rtol=1e-6)


def test_variance_scaling_gets_the_whole_tables_spread_and_init_param(mx):
    mx()
    glorot = create_table(tf.int64, 4, "g", _v1.glorot_uniform_initializer(seed=2),
                          device_vocabulary_size=96, init_by_id=True)
    limit = math.sqrt(6.0 / (96 + 4))
    assert glorot.by_id.distribution == "uniform"
    assert glorot.by_id.a == pytest.approx(-limit) and glorot.by_id.b == pytest.approx(limit)
    scaled = create_table(tf.int64, 4, "s", tf.keras.initializers.TruncatedNormal(stddev=0.3),
                          device_vocabulary_size=8, init_by_id=True, init_param=0.5)
    assert (scaled.by_id.distribution, scaled.by_id.b, scaled.by_id.scale) == \
        ("truncated_normal", pytest.approx(0.3), 0.5)
    # The table name keys the stream: one seeded initializer, two tables, other values.
    assert glorot.by_id.seed != create_table(
        tf.int64, 4, "h", _v1.glorot_uniform_initializer(seed=2), device_vocabulary_size=96,
        init_by_id=True).by_id.seed


def test_refusals_name_the_table_and_the_setting(mx):
    mx()
    with pytest.raises(ValueError, match=r"create_table 'c': init_by_id=True .* Constant"):
        create_table(tf.int64, 4, "c", _v1.constant_initializer(0.5), init_by_id=True)
    with pytest.raises(ValueError, match="init_by_id"):
        create_table(tf.int64, 4, "o", tf.keras.initializers.Orthogonal(), init_by_id=True)
    with pytest.raises(TypeError, match="create_table 'x': init_by_id must be True or False"):
        create_table(tf.int64, 4, "x", _v1.truncated_normal_initializer(), init_by_id=1)


def test_without_init_by_id_new_rows_keep_their_rows_value(mx, make_session):
    """The default (mx_rec's): a fresh row is not refilled, the variable's value stands."""
    mx()
    table = create_table(tf.int64, 3, "t", _v1.truncated_normal_initializer(seed=4),
                         device_vocabulary_size=16)
    ids = _v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    sess = make_session()
    initial = sess.run(table.variable)
    np.testing.assert_array_equal(sess.run(emb, {ids: [100, 200]}), initial[:2])


def test_the_plan_op_draws_the_ids_its_plan_gives_the_rows():
    """MxrecPlanRowsById finds each wanted row's ID from (ids, unique_rows, restore) and
    draws it as MxrecRowsById does; a row outside the plan is an InvalidArgument."""
    ops = loader.op_library()
    ids = np.array([[40, -7], [40, 9]], np.int64)          # positions 0..3
    unique_rows = np.array([12, 3, 30], np.int32)          # 40 -> 12, -7 -> 3, 9 -> 30
    restore = np.array([0, 1, 0, 2], np.int32)
    attrs = dict(dim=4, seed=77, distribution="normal", a=0.0, b=1.0)
    got = ops.mxrec_plan_rows_by_id(ids.reshape(-1), unique_rows, restore,
                                    np.array([30, 12], np.int32), **attrs)
    want = ops.mxrec_rows_by_id(np.array([9, 40], np.int64), **attrs)
    narrow = ops.mxrec_plan_rows_by_id(ids.reshape(-1).astype(np.int32), unique_rows,
                                       restore, np.array([3], np.int32), **attrs)
    bad = ops.mxrec_plan_rows_by_id(ids.reshape(-1), unique_rows, restore,
                                    np.array([5], np.int32), **attrs)
    with _v1.Session() as sess:
        got, want, narrow, want_narrow = sess.run(
            [got, want, narrow, ops.mxrec_rows_by_id(np.array([-7], np.int64), **attrs)])
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(narrow, want_narrow)
        with pytest.raises(tf.errors.InvalidArgumentError, match="wanted row 5 is not a row"):
            sess.run(bad)


def _plan_reference(ids, unique_rows, restore, wanted):
    """Each wanted row's ID: the first unique row holding it, that row's first position."""
    keys = []
    for row in wanted:
        i = int(np.flatnonzero(unique_rows == row)[0])
        keys.append(ids[int(np.flatnonzero(restore == i)[0])])
    return np.array(keys, np.int64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_plan_op_matches_a_reference_on_random_plans(seed):
    """Random plans (repeated IDs, a row held by two unique slots, a slot no position
    restores to, wanted rows repeated and in any order): the IDs found are the reference's,
    drawn as MxrecRowsById draws them."""
    rng = np.random.default_rng(seed)
    ops = loader.op_library()
    u = 300
    unique_rows = rng.permutation(5000)[:u].astype(np.int32)
    unique_rows[7] = unique_rows[200]                      # one row in two slots
    reachable = sorted(set(range(u)) - {11})               # slot 11: no position
    restore = rng.permutation(np.concatenate([reachable, rng.choice(reachable, 1701)]))
    restore = restore.astype(np.int32)
    ids = rng.integers(-2**62, 2**62, 2000).astype(np.int64)
    wanted = unique_rows[rng.choice(reachable, 120, replace=False)]
    wanted = np.concatenate([wanted, wanted[:5], unique_rows[[200]]]).astype(np.int32)
    attrs = dict(dim=3, seed=5, distribution="uniform", a=-1.0, b=1.0)
    got = ops.mxrec_plan_rows_by_id(ids, unique_rows, restore, wanted, **attrs)
    want = ops.mxrec_rows_by_id(_plan_reference(ids, unique_rows, restore, wanted), **attrs)
    unreached = ops.mxrec_plan_rows_by_id(ids, unique_rows, restore,
                                          unique_rows[[3, 11]].astype(np.int32), **attrs)
    with _v1.Session() as sess:
        got, want = sess.run([got, want])
        np.testing.assert_array_equal(got, want)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"wanted row {unique_rows[11]} is not a row"):
            sess.run(unreached)

"""The send-back plan's ops (MxrecSendPositions, MxrecScatterRows, MxrecGatherSumRows) against
NumPy and against the TensorFlow compositions they replace in mxrec.distributed.send_back,
bit for bit, and their errors on a bad plan."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.distributed import sharded_ops

_v1 = tf.compat.v1


def _run(fetches):
    with tf.Graph().as_default(), _v1.Session() as sess:
        return sess.run(fetches())


def _route(rng, n, size, chunk):
    """A route of n flat IDs over `size` owners: where [U, 2] (owner, slot), order [U] (a
    permutation), index [n] (each flat ID's unique ID)."""
    u = int(rng.integers(1, max(2, n) + 1)) if n else 0
    owners = np.sort(rng.integers(0, size, u)).astype(np.int32)
    slots = np.zeros(u, np.int32)
    for owner in range(size):
        mine = owners == owner
        slots[mine] = rng.permutation(chunk)[:mine.sum()] if mine.sum() <= chunk else 0
    where = np.stack([owners, slots], axis=1).astype(np.int32)
    order = rng.permutation(u).astype(np.int32)
    index = rng.integers(0, u, n).astype(np.int32) if u else np.zeros(0, np.int32)
    return where, order, index


def _positions_numpy(where, order, index, width, offset):
    by_unique = np.empty(len(order), np.int64)
    by_unique[order] = where[:, 0].astype(np.int64) * width + offset + where[:, 1]
    return by_unique[index]


def test_send_positions_equal_numpy_and_the_tf_composition():
    rng = np.random.default_rng(3)
    size = 3
    routes = [_route(rng, n, size, 9) for n in (40, 0, 7, 1, 25)]
    width = np.array([9, 9, 12, 9, 20], np.int32)
    offset = np.array([0, 4, 3, 0, 11], np.int32)
    group_of = [1, 0, 1, 2, 1]

    def build():
        ops = sharded_ops.send_positions(
            [tf.constant(r[0]) for r in routes], [tf.constant(r[1]) for r in routes],
            [tf.constant(r[2]) for r in routes], tf.constant(width), tf.constant(offset),
            group_of, 3)
        # The composition send_back.positions used before the op, per lookup.
        composed = []
        for (where, order, index), w, o in zip(routes, width, offset):
            flat = tf.constant(where)[:, 0] * int(w) + tf.constant(where)[:, 1] + int(o)
            composed.append(tf.gather(tf.gather(flat, tf.math.invert_permutation(order)),
                                      index))
        return ops, composed

    got, composed = _run(build)
    per_lookup = [_positions_numpy(*r, w, o) for r, w, o in zip(routes, width, offset)]
    for g in range(3):
        want = np.concatenate([per_lookup[k] for k in range(5) if group_of[k] == g])
        np.testing.assert_array_equal(got[g], want)
        assert got[g].dtype == np.int32
    for k in range(5):
        np.testing.assert_array_equal(composed[k], per_lookup[k])


@pytest.mark.parametrize("case,message", [
    ("order_repeats", "is not a permutation"),
    ("order_outside", "is not a permutation"),
    ("index_outside", "is not in \\[0, 3\\)"),
    ("row_past_int32", "outside \\[0, 2\\^31 - 1\\]"),
    ("width_short", "width and offset must be vectors"),
])
def test_send_positions_refuses_a_bad_route(case, message):
    where = np.array([[0, 0], [0, 1], [1, 0]], np.int32)
    order = np.array([2, 0, 1], np.int32)
    index = np.array([0, 2, 1], np.int32)
    width = np.array([4], np.int32)
    if case == "order_repeats":
        order = np.array([2, 0, 2], np.int32)
    elif case == "order_outside":
        order = np.array([3, 0, 1], np.int32)
    elif case == "index_outside":
        index = np.array([0, 3], np.int32)
    elif case == "row_past_int32":
        width = np.array([2**31 - 1], np.int32)
        where = np.array([[0, 0], [0, 1], [1, 1]], np.int32)  # row 2^31
    elif case == "width_short":
        width = np.zeros(0, np.int32)

    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _run(lambda: sharded_ops.send_positions(
            [tf.constant(where)], [tf.constant(order)], [tf.constant(index)],
            tf.constant(width), tf.constant([0], tf.int32), [0], 1))


def test_send_positions_refuses_more_groups_than_lookups():
    """An output per group: a huge num_groups would have TensorFlow allocate that many
    outputs (eagerly: until the process is killed) before the kernel could refuse it."""
    with pytest.raises(ValueError, match=r"num_groups must be in \[1, 1\].*got 2147483647"):
        sharded_ops.send_positions(
            [tf.zeros([0, 2], tf.int32)], [tf.zeros([0], tf.int32)], [tf.zeros([0], tf.int32)],
            tf.constant([1]), tf.constant([0]), [0], 2**31 - 1)


def test_send_positions_refuses_a_group_outside_num_groups():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="group_of"):
        _run(lambda: sharded_ops.send_positions(
            [tf.zeros([0, 2], tf.int32)], [tf.zeros([0], tf.int32)], [tf.zeros([0], tf.int32)],
            tf.constant([1]), tf.constant([0]), [2], 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_rows_equals_scatter_nd(dtype):
    rng = np.random.default_rng(5)
    emb = rng.standard_normal((30, 5)).astype(dtype)
    emb[3] = -0.0
    first = rng.integers(0, 30, 50).astype(np.int32)
    spots = rng.permutation(64)[:50].astype(np.int32)
    spots[7] = spots[8]  # a repeated spot sums, as scatter_nd does

    def build():
        op = sharded_ops.scatter_rows(tf.constant(emb), tf.constant(first), tf.constant(spots),
                                      tf.constant(64))
        ref = tf.scatter_nd(spots[:, None], tf.gather(emb, first), [64, 5])
        return op, ref

    got, ref = _run(build)
    want = np.zeros((64, 5), dtype)
    for i in range(50):
        want[spots[i]] += emb[first[i]]
    np.testing.assert_array_equal(got, want)
    assert got.tobytes() == ref.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [None, 0.37])
def test_gather_sum_rows_equals_the_segment_sum(dtype, scale):
    rng = np.random.default_rng(7)
    buffer = rng.standard_normal((40, 3)).astype(dtype)
    spots = rng.integers(0, 40, 90).astype(np.int32)
    first = rng.integers(0, 12, 90).astype(np.int32)
    first[:3] = 11  # the owned row 11 sums three terms, in order

    def build():
        op = sharded_ops.gather_sum_rows(tf.constant(buffer), tf.constant(spots),
                                         tf.constant(first), tf.constant(13), scale)
        moved = tf.constant(buffer) if scale is None else tf.constant(buffer) * scale
        ref = tf.math.unsorted_segment_sum(tf.gather(moved, spots), first, 13)
        return op, ref

    got, ref = _run(build)
    assert got.shape == (13, 3)
    assert got.tobytes() == ref.tobytes()
    want = np.zeros((13, 3), dtype)
    factor = dtype(1) if scale is None else dtype(scale)
    for i in range(90):
        want[first[i]] += buffer[spots[i]] * factor
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[12], 0)


@pytest.mark.parametrize("op,message", [
    ("scatter_first", "first\\[1\\] = 9 is not in \\[0, 4\\)"),
    ("scatter_spot", "spots\\[0\\] = 8 is not in \\[0, 8\\)"),
    ("gather_spot", "spots\\[1\\] = -1 is not in \\[0, 8\\)"),
    ("gather_first", "first\\[0\\] = 3 is not in \\[0, 3\\)"),
])
def test_scatter_and_gather_refuse_an_index_outside(op, message):
    emb = np.zeros([4, 2], np.float32)
    buffer = np.zeros([8, 2], np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        if op == "scatter_first":
            _run(lambda: sharded_ops.scatter_rows(emb, tf.constant([0, 9]), tf.constant([0, 1]),
                                                  tf.constant(8)))
        elif op == "scatter_spot":
            _run(lambda: sharded_ops.scatter_rows(emb, tf.constant([0]), tf.constant([8]),
                                                  tf.constant(8)))
        elif op == "gather_spot":
            _run(lambda: sharded_ops.gather_sum_rows(buffer, tf.constant([0, -1]),
                                                     tf.constant([0, 1]), tf.constant(3)))
        else:
            _run(lambda: sharded_ops.gather_sum_rows(buffer, tf.constant([0]), tf.constant([3]),
                                                     tf.constant(3)))


def test_the_ops_have_no_gradient():
    """Their users build the transposes themselves: a gradient through them is None."""
    def build():
        emb = tf.constant(np.ones((3, 2), np.float32))
        out = sharded_ops.scatter_rows(emb, tf.constant([0, 2]), tf.constant([1, 0]),
                                       tf.constant(2))
        back = sharded_ops.gather_sum_rows(emb, tf.constant([0, 2]), tf.constant([1, 0]),
                                           tf.constant(2))
        return [g is None for g in tf.gradients([out, back], [emb])]

    with tf.Graph().as_default():
        assert build() == [True]


def test_pack_send_equals_scatter_nd_over_every_lookup():
    rng = np.random.default_rng(11)
    size = 3
    chunks = np.array([4, 0, 6, 1], np.int32)
    wheres, pairs = [], []
    for chunk in chunks:
        cells = [(o, s) for o in range(size) for s in range(chunk)]
        u = int(rng.integers(0, len(cells) + 1)) if cells else 0
        picked = [cells[i] for i in rng.permutation(len(cells))[:u]]
        wheres.append(np.array(picked, np.int32).reshape(-1, 2))
        pairs.append(np.stack([rng.integers(-2**63, 2**63 - 1, u, dtype=np.int64),
                               rng.integers(1, 9, u)], axis=1).astype(np.int64).reshape(-1, 2))

    def build():
        op = sharded_ops.pack_send([tf.constant(w) for w in wheres],
                                   [tf.constant(p) for p in pairs], tf.constant(chunks), size)
        # The composition exchange_all used before the op.
        offsets = np.concatenate([[0], np.cumsum(chunks)[:-1]])
        slots = np.concatenate([w + [0, o] for w, o in zip(wheres, offsets)]).astype(np.int32)
        ref = tf.scatter_nd(slots, np.concatenate(pairs), [size, int(chunks.sum()), 2])
        return op, ref

    got, ref = _run(build)
    want = np.zeros((size, int(chunks.sum()), 2), np.int64)
    offset = 0
    for w, p, chunk in zip(wheres, pairs, chunks):
        for (owner, slot), pair in zip(w, p):
            want[owner, offset + slot] = pair
        offset += chunk
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref, want)


@pytest.mark.parametrize("where,message", [
    ([[2, 0]], "\\(2, 0\\) is outside the 2 owners x 3 columns of lookup 0"),
    ([[0, 3]], "\\(0, 3\\) is outside"),
    ([[-1, 0]], "\\(-1, 0\\) is outside"),
])
def test_pack_send_refuses_a_cell_outside(where, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _run(lambda: sharded_ops.pack_send([tf.constant(where, tf.int32)],
                                           [tf.constant([[5, 1]], tf.int64)],
                                           tf.constant([3]), 2))

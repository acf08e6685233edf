"""MxrecRoute (routing.route) against the TF composition it replaces (route_reference)
and against NumPy: all five outputs equal, values, dtypes and shapes."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.distributed import routing, sharded_ops

SIZES = (1, 2, 3, 4, 7)
FIELDS = ("pairs", "counts", "where", "order", "index")
INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _owner(ids, size):
    """owner_of in Python integers: ((id * 0x9E3779B97F4A7C15 mod 2^64) >> 33) mod size."""
    return np.array([((int(i) % 2**64) * 0x9E3779B97F4A7C15 % 2**64 >> 33) % size
                     for i in ids], np.int32)


def numpy_route(ids, size):
    """The five outputs from np.unique (unique IDs renumbered in first-occurrence order)
    and a stable argsort of the owners."""
    flat = np.asarray(ids, np.int64).reshape(-1)
    values, first, inverse, occurrences = np.unique(
        flat, return_index=True, return_inverse=True, return_counts=True)
    by_first = np.argsort(first, kind="stable")
    renumber = np.empty(len(values), np.int64)
    renumber[by_first] = np.arange(len(values))
    unique, occurrences = values[by_first], occurrences[by_first].astype(np.int64)
    owner = _owner(unique, size)
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=size).astype(np.int32)
    starts = np.cumsum(counts) - counts
    slot = np.arange(len(unique)) - starts[owner[order]]
    return {"pairs": np.stack([unique[order], occurrences[order]], axis=1).astype(np.int64),
            "counts": counts,
            "where": np.stack([owner[order], slot], axis=1).astype(np.int32),
            "order": order.astype(np.int32),
            "index": renumber[inverse].astype(np.int32)}


def _power_law(n, pool=1_000_000, seed=0):
    """examples/multiworker/train.py's make_data: Zipf 1.1 over `pool` keys spread over the
    int64 range."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, pool + 1) ** 1.1
    keys = rng.integers(-2**62, 2**62, size=pool)
    return keys[rng.choice(pool, size=n, p=weights / weights.sum())]


def _batches():
    rng = np.random.default_rng(7)
    return {
        "repeats": rng.integers(0, 20, 300),
        "power_law": _power_law(53_248),
        "negative": rng.integers(-1000, 1000, 800),
        "int64_extremes": np.array([INT64_MAX, INT64_MIN, 0, -1, 1, INT64_MIN, INT64_MAX,
                                    INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, 0], np.int64),
        "empty": np.zeros(0, np.int64),
        "two_d": rng.integers(0, 40, (16, 5)),
        "one_id": np.array([-42], np.int64),
        # Equal low bits: the table's slots must come from a mix of all the bits.
        "strided": np.repeat(np.arange(3000, dtype=np.int64) << 40, 2),
        "random_100k": rng.integers(INT64_MIN, INT64_MAX, 100_000, endpoint=True),
        "random_100k_repeats": rng.integers(-2**20, 2**20, 100_000),
    }


BATCHES = _batches()


def _fields(routed):
    return {f: getattr(routed, f) for f in FIELDS}


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_route_equals_reference_and_numpy(name):
    ids = np.asarray(BATCHES[name], np.int64)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        tensor = tf.constant(ids)
        built = {size: (routing.route(tensor, size), routing.route_reference(tensor, size))
                 for size in SIZES}
        ran = sess.run({size: (_fields(op), _fields(ref)) for size, (op, ref) in built.items()})
    for size in SIZES:
        got, ref = ran[size]
        want = numpy_route(ids, size)
        for field in FIELDS:
            what = f"{name}, size {size}, {field}"
            np.testing.assert_array_equal(got[field], ref[field], err_msg=what)
            np.testing.assert_array_equal(got[field], want[field], err_msg=what)
            assert got[field].dtype == ref[field].dtype == want[field].dtype, what
            assert got[field].shape == ref[field].shape == want[field].shape, what


def test_route_static_shapes():
    with tf.Graph().as_default():
        known = routing.route(tf.zeros([6, 4], tf.int64), 3)
        assert known.index.shape.as_list() == [24]
        assert known.counts.shape.as_list() == [3]
        assert known.pairs.shape.as_list() == [None, 2]
        assert known.where.shape.as_list() == [None, 2]
        assert known.order.shape.as_list() == [None]
        unknown = routing.route(tf.compat.v1.placeholder(tf.int64, shape=None), 2)
        assert unknown.index.shape.as_list() == [None]


def test_route_is_one_op_on_the_cpu_and_casts_int32_ids():
    ids = np.array([[5, -3], [5, 8]], np.int32)
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as sess:
        routed = routing.route(tf.constant(ids), 2)
        types = [op.type for op in graph.get_operations()]
        got = sess.run(_fields(routed))
    assert types.count("MxrecRoute") == 1 and "Unique" not in types
    assert routed.pairs.op.device.upper().endswith("CPU:0")
    want = numpy_route(ids, 2)
    for field in FIELDS:
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)


@pytest.mark.parametrize("size", [0, -1, 2.0, True, "2"])
def test_route_size_must_be_a_positive_integer(size):
    with tf.Graph().as_default(), pytest.raises(ValueError, match=r"route: size \(the number "
                                                 r"of ranks\) must be an integer >= 1"):
        sharded_ops.route(tf.constant([1], tf.int64), size)


def test_route_size_beyond_int32_names_the_op():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        out = sharded_ops.route(tf.constant([1], tf.int64), 2**31)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"MxrecRoute .*size = 2147483648 ranks is more than"):
            sess.run(out)


def test_route_in_a_dataset_map():
    """The graph modifier routes each batch in the input pipeline's map
    (mxrec.distributed.sharded_pipeline)."""
    batches = np.random.default_rng(3).integers(-50, 50, (3, 40))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        dataset = tf.data.Dataset.from_tensor_slices(batches).map(
            lambda ids: _fields(routing.route(ids, 3)))
        nxt = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        got = [sess.run(nxt) for _ in batches]
    for ids, out in zip(batches, got):
        want = numpy_route(ids, 3)
        for field in FIELDS:
            np.testing.assert_array_equal(out[field], want[field], err_msg=field)

"""MxrecKeyStagePacked: the key stage of several tables in one call on packed tensors.

The reference is the per-table op (MxrecKeyStage, one call per table, in table order) on
twin tables with the same settings and history: every batch's unique rows, restore index,
reused rows and batch id must be identical, and so must the tables' exported state at the
end, with admission thresholds, shared admission counts, eviction between batches (so rows
are reused), padding keys, empty tables in a batch, int32 IDs and deferred batches.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from mxrec._lib import loader
from mxrec.util import ops as mxrec_ops

_v1 = tf.compat.v1
_serial = itertools.count()
# name: (device rows, admission threshold, padding keys)
_TABLES = {"user": (200, 0.0, []), "item": (300, 2.0, [0]), "cat": (120, 1.0, []),
           "shared_a": (240, 2.0, []), "shared_b": (240, 2.0, [])}


def _make(engine, prefix):
    keys = []
    for name, (capacity, threshold, padding) in _TABLES.items():
        key = f"{prefix}{name}"
        engine.create_table(key=key, name=name, dim=4, capacity=capacity,
                            padding_keys=padding, access_threshold=threshold)
        if name.startswith("shared"):
            engine.share_counts(key, prefix + "group")
        keys.append(key)
    return keys


@pytest.fixture
def twins(engine):
    """(reference keys, packed keys): the same tables twice."""
    prefix = f"test_key_stage_packed_{next(_serial)}/"
    yield _make(engine, prefix + "ref/"), _make(engine, prefix + "packed/")
    engine.drop_prefix(prefix)


def _batches(seed, count, sizes):
    rng = np.random.default_rng(seed)
    out = []
    for b in range(count):
        # IDs from a pool that moves on, so that old IDs age out and get evicted.
        out.append([rng.integers(b * 5, b * 5 + 3 * size + 1, size=size).astype(np.int64)
                    for size in sizes])
    return out


def _state(engine, key):
    state = engine.export_state(key)
    return {name: np.asarray(state[name]) for name in ("keys", "rows", "counts", "last_seen")}


def _run_twins(engine, ref_keys, packed_keys, batches, dtype=tf.int64, deferred=False,
               is_train=True):
    """Runs every batch through both paths; returns the per-batch outputs of both."""
    n = len(ref_keys)
    ops = loader.op_library()
    graph = tf.Graph()
    with graph.as_default():
        ids = [_v1.placeholder(dtype, [None]) for _ in range(n)]
        stamp = _v1.placeholder(tf.int64, [])
        ref = []
        previous = []
        for key, t in zip(ref_keys, ids):  # one call per table, in table order
            with tf.control_dependencies(previous):
                (rows,), (restore,), (reused,), batch_id = ops.mxrec_key_stage(
                    ids=[t], timestamp=stamp, weights=[], table_keys=[key], is_train=is_train,
                    deferred=deferred)
            previous = [rows.op]
            ref.append((rows, restore, reused, batch_id[0]))
        packed = mxrec_ops.key_stage_packed(ids, packed_keys, is_train, timestamp=stamp,
                                            deferred=deferred)
        got = [(packed.unique_rows[i], packed.restore[i], packed.reused_rows[i],
                packed.batch_ids[i]) for i in range(n)]
        commits = []
        if deferred and is_train:
            commits = [mxrec_ops.commit_batches(tf.stack([r[3] for r in ref]), ref_keys),
                       mxrec_ops.commit_batches(packed.batch_ids, packed_keys)]
    results = []
    with _v1.Session(graph=graph) as session:
        for b, batch in enumerate(batches):
            feed = {t: a.astype(dtype.as_numpy_dtype) for t, a in zip(ids, batch)}
            feed[stamp] = 1000 + 10 * b
            want, have = session.run([ref, got], feed)
            if commits:
                session.run(commits, feed)
            results.append((want, have))
            for key in ref_keys + packed_keys:  # evict IDs not seen in the last 3 batches
                engine.evict(key, 25)
    return results


def _assert_same(results):
    for b, (want, have) in enumerate(results):
        for t, (w, h) in enumerate(zip(want, have)):
            for name, x, y in zip(("unique_rows", "restore", "reused_rows", "batch_id"), w, h):
                np.testing.assert_array_equal(y, x, err_msg=f"batch {b}, table {t}, {name}")


def test_packed_matches_per_table_calls(engine, twins):
    ref_keys, packed_keys = twins
    batches = _batches(1, 14, [50, 80, 30, 60, 60])
    results = _run_twins(engine, ref_keys, packed_keys, batches)
    _assert_same(results)
    # The run exercised what it is meant to: rows reused after eviction, IDs not admitted.
    assert any(len(w[2]) for want, _ in results for w in want)
    assert any((w[1] == len(w[0])).any() for want, _ in results for w in want)
    for ref, packed in zip(ref_keys, packed_keys):
        want, have = _state(engine, ref), _state(engine, packed)
        for name in want:
            np.testing.assert_array_equal(have[name], want[name], err_msg=f"{packed} {name}")


def test_packed_int32_empty_tables_and_eval(engine, twins):
    ref_keys, packed_keys = twins
    batches = _batches(2, 6, [20, 0, 15, 0, 10])
    batches[3] = [np.zeros(0, np.int64)] * 5  # a batch with no IDs at all
    _assert_same(_run_twins(engine, ref_keys, packed_keys, batches, dtype=tf.int32))
    _assert_same(_run_twins(engine, ref_keys, packed_keys, batches, is_train=False))


def test_packed_deferred(engine, twins):
    ref_keys, packed_keys = twins
    results = _run_twins(engine, ref_keys, packed_keys, _batches(3, 5, [30, 30, 30, 30, 30]),
                         deferred=True)
    _assert_same(results)
    assert all(w[3] > 0 for want, _ in results for w in want)
    for key in ref_keys + packed_keys:
        assert engine.pending_batches(key) == 0


def test_packed_one_table(engine, twins):
    ref_keys, packed_keys = twins
    batches = [b[:1] for b in _batches(4, 6, [70])]
    _assert_same(_run_twins(engine, ref_keys[:1], packed_keys[:1], batches))


def _run_raw(keys, ids, splits, timestamp=5):
    with tf.Graph().as_default():
        ph_ids = _v1.placeholder(ids.dtype, None)
        ph_splits = _v1.placeholder(tf.int64, None)
        ph_stamp = _v1.placeholder(tf.int64, None)
        out = loader.op_library().mxrec_key_stage_packed(
            ids=ph_ids, splits=ph_splits, timestamp=ph_stamp, table_keys=keys)
        with _v1.Session() as session:
            return session.run(list(out), {ph_ids: ids, ph_splits: np.asarray(splits, np.int64),
                                           ph_stamp: timestamp})


@pytest.mark.parametrize("ids, splits, match", [
    (np.arange(6), [1, 3, 6, 6, 6, 6], r"splits\[0\] must be 0 \(table 'user'"),
    (np.arange(6), [0, 4, 3, 6, 6, 6], r"IDs of table 'item' are splits\[1\]..splits\[2\] = 4..3"),
    (np.arange(6), [0, 2, 9, 9, 9, 9], r"IDs of table 'item' .* within the 6 IDs"),
    (np.arange(6), [0, 2, 4, 4, 4, 5], r"splits\[5\] = 5 must be the number of IDs, 6 .*'shared_b"),
    (np.arange(6), [0, 6], r"input 'splits' must have 6 \(len\(table_keys\) \+ 1"),
    (np.arange(6).reshape(2, 3), [0, 6, 6, 6, 6, 6], r"input 'ids' must be a vector"),
    (np.arange(6), [[0, 6, 6, 6, 6, 6]], r"input 'splits' must be a vector"),
])
def test_packed_bad_splits(twins, ids, splits, match):
    _, keys = twins
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        _run_raw(keys, ids.astype(np.int64), splits)


def test_packed_bad_timestamp(twins):
    _, keys = twins
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input 'timestamp' must be a scalar"):
        _run_raw(keys, np.arange(3, dtype=np.int64), [0, 3, 3, 3, 3, 3], timestamp=[5, 6])


def test_packed_table_twice(twins):
    _, keys = twins
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 'cat' is named twice in table_keys \(entries 1 and 2\)"):
        _run_raw([keys[0], keys[2], keys[2]], np.arange(3, dtype=np.int64), [0, 1, 2, 3])
    with tf.Graph().as_default(), pytest.raises(ValueError, match="named twice in table_keys"):
        mxrec_ops.key_stage_packed([tf.constant([1], tf.int64)] * 2, [keys[0], keys[0]], True)


def test_packed_wrapper_errors(twins):
    _, keys = twins
    with tf.Graph().as_default():
        one = tf.constant([1, 2], tf.int64)
        with pytest.raises(ValueError, match="got 1 ID tensors for 2 tables"):
            mxrec_ops.key_stage_packed([one], keys[:2], True)
        with pytest.raises(ValueError, match="got 0 ID tensors for 0 tables"):
            mxrec_ops.key_stage_packed([], [], True)
        with pytest.raises(ValueError, match="must all be int32 or all int64"):
            mxrec_ops.key_stage_packed([one, tf.constant([1], tf.int32)], keys[:2], True)
        with pytest.raises(ValueError, match=r"IDs of table '.*item' must be 1-D"):
            mxrec_ops.key_stage_packed([one, tf.constant([[1]], tf.int64)], keys[:2], True)


def test_packed_table_error_names_table(engine, twins):
    """An exhausted table fails the call with its own message (the table, the limit)."""
    _, keys = twins
    ids = np.concatenate([np.arange(5), np.arange(1000, 1200)]).astype(np.int64)
    with pytest.raises(tf.errors.ResourceExhaustedError, match=r"mxrec table 'cat' is full"):
        _run_raw([keys[0], keys[2]], ids, [0, 5, 205])

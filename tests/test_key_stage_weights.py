"""MxrecKeyStage's weights: position p standing for weights[p] occurrences of its ID.

The owner of a sharded table plans the IDs it received with their occurrence counts as
weights (mxrec.distributed.id_exchange) instead of repeating each ID that many times. The
reference is the key stage of twin tables (same settings and history) on the repeated
batch, `np.repeat(ids, weights)`: every batch's unique rows and reused rows, the restore
index at each run's first copy, the tables' exported state (keys, rows, admission counts,
last-seen times) and their statistics (ids_seen, rejected, admitted) must be identical, with
admission thresholds, a fractional faae coefficient, shared admission counts, padding keys,
a host tier, eviction between batches (rows reused), an ID at several positions (sent by
several ranks) and deferred batches. Then the refusals.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from mxrec.util import ops as mxrec_ops

_v1 = tf.compat.v1
_serial = itertools.count()
# name: (device rows, admission threshold, padding keys, faae coefficient, host rows)
_TABLES = {"plain": (400, 0.0, [], 1.0, 0), "admit": (400, 3.0, [0], 1.0, 0),
           "faae": (400, 2.5, [], 0.7, 0), "shared_a": (400, 4.0, [], 1.0, 0),
           "shared_b": (400, 4.0, [], 1.0, 0), "tiered": (100, 2.0, [], 1.0, 1000)}
_STATS = ("ids_seen", "rejected", "admitted", "rows_in_use", "ids_tracked")


def _make(engine, prefix):
    keys = []
    for name, (capacity, threshold, padding, faae, host) in _TABLES.items():
        key = f"{prefix}{name}"
        engine.create_table(key=key, name=name, dim=4, capacity=capacity,
                            padding_keys=padding, access_threshold=threshold,
                            faae_coefficient=faae, host_capacity=host)
        if name.startswith("shared"):
            engine.share_counts(key, prefix + "group")
        keys.append(key)
    return keys


@pytest.fixture
def twins(engine):
    """(repeated keys, weighted keys): the same tables twice."""
    prefix = f"test_key_stage_weights_{next(_serial)}/"
    yield _make(engine, prefix + "repeated/"), _make(engine, prefix + "weighted/")
    engine.drop_prefix(prefix)


def _batch(rng, b, size):
    """IDs from a pool that moves on (old IDs age out and are evicted), some at several
    positions, padding included, with weights of 1 to 6 and a few hot ones."""
    ids = rng.integers(b * 6, b * 6 + 2 * size + 1, size=size).astype(np.int64)
    weights = rng.integers(1, 7, size=size).astype(np.int64)
    weights[rng.random(size) < 0.05] = 300
    return ids, weights


def _state(engine, key):
    state = engine.export_state(key)
    return {name: np.asarray(state[name]) for name in ("keys", "rows", "counts", "last_seen")}


def _run(engine, repeated_keys, weighted_keys, batches, deferred=False):
    n = len(repeated_keys)
    graph = tf.Graph()
    with graph.as_default():
        ids = [_v1.placeholder(tf.int64, [None]) for _ in range(n)]
        flat = [_v1.placeholder(tf.int64, [None]) for _ in range(n)]
        weights = [_v1.placeholder(tf.int64, [None]) for _ in range(n)]
        stamp = _v1.placeholder(tf.int64, [])
        rows, restore, reused, want_ids = mxrec_ops.key_stage(
            flat, repeated_keys, True, timestamp=stamp, deferred=deferred)
        want = (rows, restore, reused)
        rows, restore, reused, got_ids = mxrec_ops.key_stage(
            ids, weighted_keys, True, timestamp=stamp, deferred=deferred, weights=weights)
        got = (rows, restore, reused)
        commits = []
        if deferred:
            commits = [mxrec_ops.commit_batches(want_ids, repeated_keys),
                       mxrec_ops.commit_batches(got_ids, weighted_keys)]
    with _v1.Session(graph=graph) as session:
        for b, batch in enumerate(batches):
            feed = {stamp: 1000 + 10 * b}
            for t in range(n):
                feed[ids[t]], feed[weights[t]] = batch[t]
                feed[flat[t]] = np.repeat(*batch[t])
            w, g, _ = session.run([want, got, commits], feed)  # the commits after both
            for t in range(n):
                runs = np.cumsum(batch[t][1]) - batch[t][1]  # each position's first copy
                where = f"batch {b}, table {weighted_keys[t]}"
                np.testing.assert_array_equal(g[0][t], w[0][t], err_msg=f"{where} unique rows")
                np.testing.assert_array_equal(g[1][t], w[1][t][runs], err_msg=f"{where} restore")
                np.testing.assert_array_equal(g[2][t], w[2][t], err_msg=f"{where} reused rows")
            for key in repeated_keys + weighted_keys:  # IDs not seen in the last 3 batches
                engine.evict(key, 25)


def _assert_twins(engine, repeated_keys, weighted_keys):
    for want_key, got_key in zip(repeated_keys, weighted_keys):
        want, got = _state(engine, want_key), _state(engine, got_key)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{got_key} {name}")
        want, got = engine.stats(want_key), engine.stats(got_key)
        for name in _STATS:
            assert got[name] == want[name], (got_key, name, got[name], want[name])


@pytest.mark.parametrize("deferred", [False, True])
def test_weights_plan_as_the_repeated_batch(engine, twins, deferred):
    rng = np.random.default_rng(7)
    batches = [[_batch(rng, b, size) for size in (60, 80, 40, 50, 50, 70)]
               for b in range(12)]
    batches[4] = [(np.zeros(0, np.int64), np.zeros(0, np.int64))] * 6  # no IDs at all
    _run(engine, *twins, batches, deferred=deferred)
    _assert_twins(engine, *twins)
    repeated, weighted = twins
    assert all(engine.pending_batches(key) == 0 for key in repeated + weighted)
    stats = {key.rsplit("/", 1)[1]: engine.stats(key) for key in repeated}
    # The run exercised what it is meant to: IDs kept waiting, rows reused, the host tier.
    assert stats["admit"]["rejected"] > 0 and stats["faae"]["rejected"] > 0
    assert stats["plain"]["evicted_rows"] > 0 and stats["tiered"]["tier_ids"] > 0
    assert stats["plain"]["ids_seen"] == sum(int(b[0][1].sum()) for b in batches)


def _key_stage(engine, weights, is_train=True, ids=(1, 2, 3)):
    key = f"test_key_stage_weights_{next(_serial)}/t"
    engine.create_table(key=key, name="tbl", dim=4, capacity=16)
    try:
        with tf.Graph().as_default(), _v1.Session() as session:
            return session.run(mxrec_ops.key_stage(
                [tf.constant(ids, tf.int64)], [key], is_train,
                weights=[tf.constant(w, tf.int64) for w in weights]))
    finally:
        engine.drop_prefix(key)


def test_weights_refused(engine):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"weight 0 at position 1 of "
                       r"table 'tbl'.*at least 1"):
        _key_stage(engine, [[1, 0, 2]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"weight -3"):
        _key_stage(engine, [[-3, 1, 2]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"add up to more than 2\^31 - 1"):
        _key_stage(engine, [[2**30, 2**30, 1]])
    with pytest.raises(ValueError, match=r"Dimensions must be equal|shape"):
        _key_stage(engine, [[1, 1]])
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                       match=r"2 weight tensors for 1 ID tensors"):
        _key_stage(engine, [[1, 1, 1], [1, 1, 1]])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"evaluation batch counts nothing"):
        _key_stage(engine, [[1, 1, 1]], is_train=False)
    # The largest total allowed plans.
    rows, restore, _, _ = _key_stage(engine, [[2**31 - 3, 1, 1]])
    assert list(restore[0]) == [0, 1, 2] and len(rows[0]) == 3

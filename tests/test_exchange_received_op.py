"""MxrecExchangeReceived (exchange_all's grouping of the received slots) against the TF
composition it replaces (id_exchange._received_slots_reference) and against NumPy: all five
outputs equal, values, dtypes and shapes; and its checks."""

import types

import numpy as np
import pytest
import tensorflow as tf

from mxrec.distributed import communication, id_exchange, routing, sharded_ops

FIELDS = ("pairs", "lookup", "peer", "valid", "per_lookup")
INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def numpy_received(received, chunks, size):
    """The five outputs by scanning the slots per lookup, in peer-then-column order."""
    received = np.asarray(received, np.int64).reshape(-1, 2)
    chunks = np.asarray(chunks, np.int64)
    total = int(chunks.sum())
    offsets = np.cumsum(chunks) - chunks
    rows = []
    for lookup, (chunk, offset) in enumerate(zip(chunks, offsets)):
        for peer in range(size):
            for column in range(offset, offset + chunk):
                slot = peer * total + column
                if received[slot, 1] > 0:
                    rows.append((received[slot], lookup, peer, peer * chunk + column - offset))
    per_lookup = np.bincount([r[1] for r in rows], minlength=len(chunks)).astype(np.int32)
    return {"pairs": np.array([r[0] for r in rows], np.int64).reshape(-1, 2),
            "lookup": np.array([r[1] for r in rows], np.int32),
            "peer": np.array([r[2] for r in rows], np.int32),
            "valid": np.array([r[3] for r in rows], np.int32),
            "per_lookup": per_lookup}


def _received(rng, chunks, size, fill):
    """[size * sum(chunks), 2] slots, each filled with probability `fill` by an ID over
    the int64 range and a count in 1..5, else (0, 0)."""
    slots = size * int(np.sum(chunks))
    ids = rng.integers(INT64_MIN, INT64_MAX, slots, endpoint=True)
    counts = np.where(rng.random(slots) < fill, rng.integers(1, 6, slots), 0)
    return np.stack([np.where(counts > 0, ids, 0), counts], axis=1).astype(np.int64)


def _no_fill_in(received, chunks, size, lookups):
    """`received` with the slots of `lookups` emptied on every peer."""
    received = received.copy().reshape(size, -1, 2)
    offsets = np.cumsum(chunks) - chunks
    for lookup in lookups:
        received[:, offsets[lookup]:offsets[lookup] + chunks[lookup]] = 0
    return received.reshape(-1, 2)


def _cases():
    rng = np.random.default_rng(11)
    cases = {}
    for size in (1, 2, 3, 4):
        chunks = np.array([1, 3, 2, 1, 5, 4, 1], np.int32)
        cases[f"size {size}, random"] = (_received(rng, chunks, size, 0.5), chunks, size)
        cases[f"size {size}, full"] = (_received(rng, chunks, size, 1.0), chunks, size)
        cases[f"size {size}, all empty"] = (_received(rng, chunks, size, 0.0), chunks, size)
        cases[f"size {size}, lookups 0, 3 and 6 empty"] = (
            _no_fill_in(_received(rng, chunks, size, 0.7), chunks, size, [0, 3, 6]), chunks,
            size)
        cases[f"size {size}, one lookup"] = (
            _received(rng, np.array([6], np.int32), size, 0.4), np.array([6], np.int32), size)
        ones = np.ones(9, np.int32)
        cases[f"size {size}, chunks of 1"] = (_received(rng, ones, size, 0.5), ones, size)
        wide = rng.integers(1, 300, 26).astype(np.int32)
        cases[f"size {size}, 26 lookups, sparse"] = (_received(rng, wide, size, 0.1), wide,
                                                      size)
        with_zero = np.array([2, 0, 3, 0], np.int32)
        cases[f"size {size}, chunks of 0"] = (_received(rng, with_zero, size, 0.6), with_zero,
                                              size)
    return cases


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_exchange_received_equals_reference_and_numpy(name):
    received, chunks, size = CASES[name]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        r, c = tf.constant(received), tf.constant(chunks)
        op = sharded_ops.exchange_received(r, c, size)
        ref = id_exchange._received_slots_reference(r, c)
        got, want_ref = sess.run((dict(zip(FIELDS, op)), dict(zip(FIELDS, ref))))
    want = numpy_received(received, chunks, size)
    for field in FIELDS:
        what = f"{name}, {field}"
        np.testing.assert_array_equal(got[field], want_ref[field], err_msg=what)
        np.testing.assert_array_equal(got[field], want[field], err_msg=what)
        assert got[field].dtype == want_ref[field].dtype == want[field].dtype, what
        assert got[field].shape == want_ref[field].shape == want[field].shape, what


def test_exchange_received_static_shapes():
    with tf.Graph().as_default():
        out = sharded_ops.exchange_received(tf.zeros([12, 2], tf.int64),
                                            tf.constant([1, 2, 3], tf.int32), 2)
        assert [t.shape.as_list() for t in out] == [[None, 2], [None], [None], [None], [3]]
        with pytest.raises(ValueError, match="must be 2"):
            sharded_ops.exchange_received(tf.zeros([12, 3], tf.int64),
                                          tf.constant([1, 2, 3], tf.int32), 2)


def _table(name):
    return types.SimpleNamespace(table_name=name, dim=4, key_dtype=tf.int64,
                                 all2all_gradients_op="sum_gradients_and_div_by_ranksize")


def test_exchange_all_runs_the_op_on_the_cpu(monkeypatch):
    monkeypatch.setattr(communication, "get_rank_size", lambda: 2)
    monkeypatch.setattr(communication, "allreduce", lambda t, reduction="sum": tf.identity(t))
    monkeypatch.setattr(communication, "alltoall", lambda t, grad_scale=None: tf.identity(t))
    with tf.Graph().as_default() as graph:
        routes = [routing.route(tf.constant([1, 2, 3, 2], tf.int64), 2),
                  routing.route(tf.constant([5], tf.int64), 2)]
        lookups = [id_exchange.PlannedLookup(f"l{i}", _table(f"t{i}"), None) for i in range(2)]
        id_exchange.exchange_all(lookups, routes, [None, None], True)
        ops = [op for op in graph.get_operations() if op.type == "MxrecExchangeReceived"]
        types_ = [op.type for op in graph.get_operations()]
    assert len(ops) == 1 and "TopKV2" not in types_
    assert ops[0].device.upper().endswith("CPU:0")


def _run(received, chunks, size):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        return sess.run(sharded_ops.exchange_received(
            tf.constant(np.asarray(received, np.int64).reshape(-1, 2)),
            tf.constant(chunks, tf.int32), size))


def test_negative_chunk_is_an_error():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"MxrecExchangeReceived .*chunks\[1\] = -1 is negative"):
        _run(np.zeros((4, 2)), [3, -1, 2], 1)


def test_negative_count_names_the_slot():
    received = np.zeros((2 * 5, 2), np.int64)
    received[7] = (42, -3)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"MxrecExchangeReceived .*slot 7 \(peer 1, column 2\) has -3 "
                             r"occurrences"):
        _run(received, [2, 3], 2)


@pytest.mark.parametrize("slots", [9, 11, 0])
def test_received_length_must_be_size_times_total(slots):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"MxrecExchangeReceived .*received has {slots} slots but "
                             r"size \* sum\(chunks\) = 2 \* 5 = 10"):
        _run(np.zeros((slots, 2)), [2, 3], 2)


def test_no_slots_and_no_lookups():
    got = _run(np.zeros((0, 2)), np.zeros(0, np.int32), 3)
    assert [t.shape for t in got] == [(0, 2), (0,), (0,), (0,), (0,)]


@pytest.mark.parametrize("size", [0, -1, 2.0, True, "2"])
def test_size_must_be_a_positive_integer(size):
    with tf.Graph().as_default(), pytest.raises(
            ValueError, match=r"exchange_received: size \(the number of ranks\) must be an "
                              r"integer >= 1"):
        sharded_ops.exchange_received(tf.zeros([2, 2], tf.int64), tf.constant([1]), size)


def test_size_beyond_int32_names_the_op():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"MxrecExchangeReceived .*size = 2147483648 ranks is more than"):
        _run(np.zeros((0, 2)), [0], 2**31)

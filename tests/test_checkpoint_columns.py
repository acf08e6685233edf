"""A checkpoint's per-ID columns read and written in chunks (mxrec.saver.fold, table_file):
the helpers that find a file's records without an array per ID, checked against NumPy's
whole-array answers, and a save and restore whose Python side stays within a budget that
does not grow with the table (traced allocations: NumPy reports its arrays to tracemalloc).
"""

import os
import tempfile
import tracemalloc

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.saver import fold, stream
from mxrec.saver.checkpoint import Saver
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1


def _columns(n, seed):
    rng = np.random.default_rng(seed)
    rows = np.where(rng.random(n) < 0.3, rng.integers(0, 1 << 20, n), -1).astype(np.int32)
    in_host = ((rows < 0) & (rng.random(n) < 0.6)).astype(np.uint8)
    return rows, in_host


@pytest.mark.parametrize("n", [0, 1, 65535, 65536, 200_001])
def test_places_equal_the_whole_array_answer(n):
    rows, in_host = _columns(n, n)
    device, host = rows >= 0, (rows < 0) & (in_host != 0)
    want = np.full(n, -1, np.int64)
    want[device] = np.arange(device.sum())
    want[host] = np.arange(host.sum())
    places = fold._Places(rows, in_host)
    assert (places.devices(), places.hosts()) == (device.sum(), host.sum())
    np.testing.assert_array_equal(places[np.arange(n)], want)
    shuffled = np.random.default_rng(1).permutation(n)[:5000]
    np.testing.assert_array_equal(places[shuffled], want[shuffled])
    np.testing.assert_array_equal(fold._Places(rows, None)[np.arange(n)],
                                  np.where(device, np.cumsum(device) - 1, -1))


@pytest.mark.parametrize("n", [0, 7, 65536, 200_001])
def test_ordinals_and_chunk_positions_equal_flatnonzero(n):
    _, in_host = _columns(n, n + 1)
    want = np.flatnonzero(in_host)
    ordinals = fold._Ordinals(in_host)
    for begin, count in [(0, 1), (0, 70000), (3, 65536), (len(want) - 2, 10), (len(want), 5)]:
        begin = max(begin, 0)
        np.testing.assert_array_equal(ordinals.take(begin, count), want[begin:begin + count])
    pieces = list(fold.chunk_positions(in_host, 1000, lambda c: c != 0))
    assert all(0 < len(p) <= 1000 for p in pieces)
    np.testing.assert_array_equal(np.concatenate(pieces) if pieces else np.zeros(0), want)
    assert fold.any_of(in_host, lambda c: c != 0) == bool(len(want))


def _model(ssd_dir):
    """A tiered table whose records mostly have no device row: counted IDs not admitted
    (access_threshold 2, each seen once) and admitted IDs in the host and SSD tiers."""
    tf.compat.v1.reset_default_graph()
    init()
    ids = _v1.placeholder(tf.int64, [None])
    table = create_table(tf.int64, 4, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=2048, host_vocabulary_size=2048,
                         ssd_vocabulary_size=200_000, ssd_data_path=ssd_dir)
    add_timestamp(_v1.placeholder_with_default(tf.constant(0, tf.int64), []))
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 2,
                                                              "eviction_threshold": 1 << 30})
    loss = tf.reduce_sum(emb * emb)
    _, sparse = get_dense_and_sparse_variable()
    train = create_hash_optimizer(0.1).minimize(loss, var_list=sparse)
    return ids, sparse_lookup(table, ids, is_train=False), train


def _traced_peak(work):
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_save_and_restore_hold_no_column_of_the_whole_table_in_python(tmp_path, monkeypatch):
    """1 M counted IDs and 6 k admitted (most in the host and SSD tiers): the Python side
    of a full save and of its restore holds a few chunks and blocks (files hashed 1 MiB at
    a time here), less than one int64 column of every record (8 MB), where whole columns
    took several; the restore equals the trained rows."""
    monkeypatch.setattr(stream, "_READ_BYTES", 1 << 20)
    counted = np.arange(1_000_000, 2_000_000, dtype=np.int64)
    admitted = np.arange(6000, dtype=np.int64)
    ids, emb, train = _model(tempfile.mkdtemp(dir=tmp_path))
    saver = Saver(str(tmp_path / "ckpt"), checkpoint_memory_mb=1)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for begin in range(0, len(counted), 100_000):
            sess.run(train, {ids: counted[begin:begin + 100_000]})
        for _ in range(2):
            for begin in range(0, len(admitted), 1000):
                sess.run(train, {ids: admitted[begin:begin + 1000]})
        want = sess.run(emb, {ids: admitted})
        save_peak = _traced_peak(lambda: saver.save(sess, 1))
    ids, emb, _ = _model(tempfile.mkdtemp(dir=tmp_path))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        restore_peak = _traced_peak(lambda: Saver(str(tmp_path / "ckpt"),
                                                  checkpoint_memory_mb=1).restore(sess))
        np.testing.assert_allclose(sess.run(emb, {ids: admitted}), want, rtol=1e-6)
    whole_column = 8 * len(counted)  # one int64 column of every record
    assert save_peak < whole_column, save_peak
    assert restore_peak < whole_column, restore_peak


def test_release_range_frees_the_blocks_and_keeps_the_rest(tmp_path):
    path = tmp_path / "spool.bin"
    data = np.arange(1 << 20, dtype=np.uint32)  # 4 MiB
    data.tofile(path)
    os.sync()
    before = os.stat(path).st_blocks
    stream.release_range(str(path), 1 << 20, 1 << 20)
    after = os.stat(path).st_blocks
    got = np.fromfile(path, np.uint32)
    assert os.path.getsize(path) == 4 << 20
    if after == before:
        pytest.skip("this filesystem punches no holes (release_range keeps the blocks)")
    assert before - after >= (1 << 20) // 512
    np.testing.assert_array_equal(got[(1 << 18):(1 << 19)], 0)
    np.testing.assert_array_equal(got[:1 << 18], data[:1 << 18])
    np.testing.assert_array_equal(got[1 << 19:], data[1 << 19:])

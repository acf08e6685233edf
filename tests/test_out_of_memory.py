"""Running out of host memory fails the call that needed the memory, with the table and the
bytes asked for, and leaves the table as it was; it never ends the process, not even on a pool
thread. An allocation limit (set_allocation_limit_for_testing) stands in for a full machine."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from mxrec._lib import loader

_v1 = tf.compat.v1
_serial = itertools.count()


@pytest.fixture
def prefix(engine):
    prefix = f"test_out_of_memory_{next(_serial)}/"
    yield prefix
    engine.set_allocation_limit_for_testing(0)
    engine.drop_dynamic_stores(prefix)
    engine.drop_prefix(prefix)
    engine.set_num_threads(1)


def test_id_map_growth_on_a_pool_thread(engine, prefix):
    """100,000 new IDs make each of the 16 ID-map shards grow its probe array (by 1.5x steps
    from 16) to 10,390 slots of 12 bytes, on the pool's threads; with that refused (the record
    chunks, at most 64 KiB each, and the 6,927-slot step before are allowed) the batch fails
    and hands out no row."""
    key = prefix + "t"
    engine.create_table(key=key, name="t", dim=4, capacity=1 << 20)
    engine.set_num_threads(2)
    ids = np.arange(100_000, dtype=np.int64) * 7919
    engine.set_allocation_limit_for_testing(96 << 10)
    with pytest.raises(RuntimeError, match=r"mxrec table 't': out of host memory: planning a "
                                           r"batch of 100000 IDs needs 124680 bytes"):
        engine.process([key], [ids], True)
    assert engine.stats(key)["rows_in_use"] == 0
    engine.set_allocation_limit_for_testing(0)
    (rows, restore, _), = engine.process([key], [ids], True)
    np.testing.assert_array_equal(rows, np.arange(100_000))
    np.testing.assert_array_equal(restore, np.arange(100_000))


def test_dynamic_store_chunk(engine, prefix):
    """A chunk of 4,096 rows of 64 floats (1 MiB) refused: EnsureRows is ResourceExhausted and
    the store does not grow."""
    key = prefix + "dyn"
    engine.create_table(key=key, name="dyn", dim=64, capacity=2**31 - 1)
    engine.create_dynamic_store(key=key, name="dyn", dim=64, chunk_rows=4096)
    engine.process([key], [np.arange(10, dtype=np.int64)], True)  # addresses 0..9
    addresses = _v1.placeholder(tf.int64, [None])
    ensure = loader.op_library().mxrec_dynamic_ensure_rows(addresses, table_key=key)
    engine.set_allocation_limit_for_testing(512 << 10)
    with _v1.Session() as sess:
        with pytest.raises(tf.errors.ResourceExhaustedError,
                           match=r"mxrec table 'dyn': out of host memory: growing the dynamic "
                                 r"store from 0 to 4096 rows .* needs 1048576 bytes"):
            sess.run(ensure, {addresses: [3, 9]})
        assert engine.dynamic_store_stats(key)["capacity"] == 0
        engine.set_allocation_limit_for_testing(0)
        assert sorted(sess.run(ensure, {addresses: [3, 9]})) == [3, 9]
    assert engine.dynamic_store_stats(key)["capacity"] == 4096


def test_host_tier_chunk(engine, prefix):
    """The first victim of a tiered table needs a host-tier chunk (2 MiB); refused, the swap
    fails and the plan stays pending, so the same swap succeeds once memory is there."""
    key = prefix + "tiered"
    engine.create_table(key=key, name="tiered", dim=4, capacity=2, host_capacity=100)
    engine.process([key], [np.array([1, 2], np.int64)], True, 1)  # fills the device rows
    (rows, _, reused), = engine.process([key], [np.array([3], np.int64)], True, 2)
    assert len(reused) == 1  # ID 1 or 2 leaves for the host tier
    victim = {0: 1, 1: 2}[int(reused[0])]
    current = np.full((1, 4), 5.0, np.float32)
    engine.set_allocation_limit_for_testing(1 << 20)
    with pytest.raises(RuntimeError, match=r"mxrec table 'tiered': out of host memory: a "
                                           r"host-tier chunk of 131072 rows of 'embedding' "
                                           r"needs 2097152 bytes"):
        engine.tier_swap(key, "embedding", reused, current)
    assert engine.tier_stats(key)["pending_plans"] == 1
    engine.set_allocation_limit_for_testing(0)
    _, fresh = engine.tier_swap(key, "embedding", reused, current)
    assert fresh.tolist() == [True]
    ids, values = engine.tier_export(key)
    assert ids.tolist() == [victim]
    np.testing.assert_array_equal(values, current)

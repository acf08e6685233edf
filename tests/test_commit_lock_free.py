"""A step's commit of its planned batch (HostTable::Commit) takes no lock: it never waits
for the key stage planning a later batch, and every reader still sees the step boundary."""

import itertools
import threading
import time

import numpy as np
import pytest

_serial = itertools.count()


@pytest.fixture
def table(engine):
    prefix = f"test_commit_{next(_serial)}/"

    def _create(capacity=1 << 22):
        key = prefix + "t"
        engine.create_table(key=key, name="t", dim=4, capacity=capacity,
                            access_threshold=0.0, faae_coefficient=1.0)
        return key

    yield _create
    engine.drop_prefix(prefix)
    engine.set_num_threads(1)


def _plan(engine, key, ids, timestamp=0):
    (_, _, _, batch_id), = engine.process([key], [np.asarray(ids, np.int64)], True, timestamp,
                                         deferred=True)
    return batch_id


def test_commit_does_not_wait_for_the_key_stage(engine, table):
    """The key stage holds the table's lock while it plans a batch of 1.5 M new IDs (about
    half a second here); a commit made meanwhile returns before that batch is planned."""
    engine.set_num_threads(1)
    key = table()
    first = _plan(engine, key, [1, 2, 3])
    big = np.arange(1, 1_500_001, dtype=np.int64) * 7919
    times = {}

    def plan_big():
        times["planning"] = time.perf_counter()
        _plan(engine, key, big, timestamp=5)
        times["planned"] = time.perf_counter()

    planner = threading.Thread(target=plan_big)
    planner.start()
    while "planning" not in times:
        time.sleep(0.001)
    time.sleep(0.05)  # the planner is inside the engine, holding the table's lock
    start = time.perf_counter()
    engine.commit(key, first)  # holds the GIL: the planner cannot record its end meanwhile
    took = time.perf_counter() - start
    planner.join()
    left = times["planned"] - start
    assert took < left / 2, (f"the commit took {took:.3f} s, waiting for the key stage, which "
                             f"planned its batch {left:.3f} s after the commit began")
    # The commit took effect for the next holder of the lock: only the big batch is pending.
    assert engine.pending_batches(key) == 1


def test_every_reader_sees_the_commit(engine, table):
    """What a commit retires, each reader sees as retired: pending batches, the newest
    trained time, eviction (IDs of pending batches are protected), evaluation (IDs a pending
    batch admitted read as unseen) and the export."""
    key = table(capacity=16)
    engine.process([key], [np.array([1], np.int64)], True, 0)        # trained at t=0
    pending = _plan(engine, key, [2, 3], timestamp=100)
    assert engine.newest_timestamp(key) == 0
    (rows, restore, _), = engine.process([key], [np.array([3, 1], np.int64)], False, -1)
    assert rows.tolist() == [0] and restore.tolist() == [1, 0]      # 3 unseen yet
    assert engine.evict(key, 0) == 0
    engine.commit(key, pending)
    # Evaluation retires the batch first: 3 is seen now.
    (rows, restore, _), = engine.process([key], [np.array([3, 1], np.int64)], False, -1)
    assert rows.tolist() == [2, 0] and restore.tolist() == [0, 1]
    assert engine.newest_timestamp(key) == 100
    assert engine.pending_batches(key) == 0
    assert engine.evict(key, 50) == 1     # 1 (t=0) goes; 2 and 3 were trained at t=100
    assert sorted(dict(zip(*engine.export_rows(key)))) == [2, 3]


def test_commits_in_any_order_retire_every_older_batch(engine, table):
    """Two lookups of a table in one step commit in any order; a commit retires every older
    pending batch (one dropped with a re-initialised iterator), and a commit of a batch
    retired already changes nothing."""
    key = table(capacity=64)
    a = _plan(engine, key, [1])
    b = _plan(engine, key, [2])
    c = _plan(engine, key, [3])
    d = _plan(engine, key, [4])
    assert engine.pending_batches(key) == 4
    engine.commit(key, c)          # a and b retire with it (b never ran)
    engine.commit(key, a)          # retired already: nothing changes
    assert engine.pending_batches(key) == 1
    engine.commit(key, d)
    engine.commit(key, b)
    assert engine.pending_batches(key) == 0
    e = _plan(engine, key, [5])
    engine.commit(key, d)          # an older id leaves the new batch pending
    assert engine.pending_batches(key) == 1
    engine.commit(key, e)
    assert engine.pending_batches(key) == 0

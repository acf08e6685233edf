"""One large table's key stage on several threads (the in-table parallel path: the per-thread
scatter of positions into per-shard buckets, probed in groups) plans exactly what one thread
plans: the same unique rows, restore index and reused rows for every batch, and the same
table state, with admission, padding keys, eviction between batches (rows reused), evaluation
batches and deferred batches. The batches are above the engine's parallel threshold
(32,768 IDs), so 2 threads take the parallel path."""

import itertools

import numpy as np
import pytest

_serial = itertools.count()
_IDS = 70_000  # > kParallelMinIds


def _batches(seed, count):
    rng = np.random.default_rng(seed)
    out = []
    for b in range(count):
        # Power-law IDs over int64 from a pool that moves on: repeats, new IDs, IDs aging out.
        base = rng.zipf(1.3, size=_IDS) % 40_000 + b * 3_000
        ids = (base.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
        ids[rng.integers(0, _IDS, size=50)] = 0  # padding
        out.append(ids)
    return out


def _run(engine, threads, batches, deferred):
    key = f"test_key_stage_threads_{next(_serial)}/t"
    engine.set_num_threads(threads)
    engine.create_table(key=key, name="big", dim=4, capacity=60_000, padding_keys=[0],
                        access_threshold=2.0)
    plans = []
    try:
        for b, ids in enumerate(batches):
            stamp = 1000 + 10 * b
            (plan,) = engine.process([key], [ids], train=True, timestamp=stamp,
                                     deferred=deferred)
            if deferred:
                engine.commit(key, plan[3])
            (evaluated,) = engine.process([key], [ids[::-1].copy()], train=False,
                                          timestamp=stamp)
            plans.append((plan[:3], evaluated))
            engine.evict(key, 25)
        state = engine.export_state(key)
        return plans, {name: np.asarray(state[name])
                       for name in ("keys", "rows", "counts", "last_seen", "free_rows")}
    finally:
        engine.drop_prefix(key)


@pytest.mark.parametrize("deferred", [False, True])
def test_two_threads_plan_what_one_thread_plans(engine, deferred):
    previous = engine.num_threads()
    batches = _batches(5, 8)
    try:
        want, want_state = _run(engine, 1, batches, deferred)
        have, have_state = _run(engine, 2, batches, deferred)
        again, _ = _run(engine, 2, batches, deferred)  # and the same on a second run
    finally:
        engine.set_num_threads(previous)
    reused = 0
    for b, (w, h, a) in enumerate(zip(want, have, again)):
        (w_train, w_eval), (h_train, h_eval), (a_train, _) = w, h, a
        for name, x, y, z in zip(("unique_rows", "restore", "reused_rows"), w_train, h_train,
                                 a_train):
            np.testing.assert_array_equal(y, x, err_msg=f"batch {b}, {name}, 2 threads")
            np.testing.assert_array_equal(z, x, err_msg=f"batch {b}, {name}, 2 threads again")
        for name, x, y in zip(("unique_rows", "restore", "reused_rows"), w_eval, h_eval):
            np.testing.assert_array_equal(y, x, err_msg=f"batch {b}, evaluation {name}")
        reused += len(w_train[2])
        # The batch had repeats, padding and IDs not admitted (the default index).
        assert (w_train[1] == len(w_train[0])).any()
    assert reused > 0
    for name in want_state:
        np.testing.assert_array_equal(have_state[name], want_state[name], err_msg=name)


def _new_ids(seed, count, size=_IDS):
    """Batches of mostly new IDs (spread over int64) with repeats, for the row grants."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(count):
        base = rng.integers(0, size, size=size) + b * (size // 2)
        out.append((base.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64))
    return out


def _grants(engine, threads, batches, capacity, refill):
    """Per batch: the training plan, or the error's text; then an evaluation of the batch
    while the deferred batch is pending (IDs it admitted read as not admitted) and after its
    commit; the table state at the end."""
    key = f"test_key_stage_threads_{next(_serial)}/g"
    engine.set_num_threads(threads)
    engine.create_table(key=key, name="grants", dim=4, capacity=capacity, padding_keys=[],
                        refill_new_rows=refill)
    out = []
    try:
        for b, ids in enumerate(batches):
            try:
                (plan,) = engine.process([key], [ids], train=True, timestamp=b, deferred=True)
            except RuntimeError as error:  # the table is full: compared as text
                out.append(("error", str(error)))
                engine.evict(key, 0)  # frees every row: the next batch reuses them
                continue
            (pending,) = engine.process([key], [ids], train=False, timestamp=b)
            engine.commit(key, plan[3])
            (committed,) = engine.process([key], [ids], train=False, timestamp=b)
            out.append((plan[:3], pending, committed))
        state = engine.export_state(key)
        return out, {name: np.asarray(state[name]) for name in ("keys", "rows", "free_rows")}
    finally:
        engine.drop_prefix(key)


@pytest.mark.parametrize("refill", [False, True])
def test_parallel_row_grants_match_one_thread(engine, refill):
    # Rows handed out on several threads (SlotsInParallel): the free list's rows first
    # (from its back), then never used ones, each numbered by first occurrence; with
    # refill_new_rows every granted row is in reused_rows. A later batch overflows the
    # table: the error names it and takes every grant back, as on one thread.
    previous = engine.num_threads()
    batches = _new_ids(7, 5)
    capacity = 110_000
    try:
        want, want_state = _grants(engine, 1, batches, capacity, refill)
        have, have_state = _grants(engine, 2, batches, capacity, refill)
    finally:
        engine.set_num_threads(previous)
    assert [w[0] for w in want].count("error") >= 1
    assert "'grants' is full" in next(w[1] for w in want if w[0] == "error")
    granted = 0
    for b, (w, h) in enumerate(zip(want, have)):
        assert w[0] == h[0] if w[0] == "error" else h[0] != "error", f"batch {b}"
        if w[0] == "error":
            assert h[1] == w[1]
            continue
        (w_train, w_pending, w_done), (h_train, h_pending, h_done) = w, h
        for name, x, y in zip(("unique_rows", "restore", "reused_rows"), w_train, h_train):
            np.testing.assert_array_equal(y, x, err_msg=f"batch {b}, {name}")
        for x, y in zip(w_pending + w_done, h_pending + h_done):
            np.testing.assert_array_equal(y, x, err_msg=f"batch {b}, evaluation")
        # Pending, the batch's new IDs read as not admitted; committed, they have rows.
        assert len(w_pending[0]) < len(w_done[0])
        granted += len(w_train[2])
        if b == 0:
            # A fresh table: rows 0, 1, ... by first occurrence (NumPy's reference).
            keys, first, inverse = np.unique(batches[0], return_index=True,
                                             return_inverse=True)
            rank = np.empty(len(keys), np.int64)
            rank[np.argsort(first)] = np.arange(len(keys))
            np.testing.assert_array_equal(w_train[0], np.arange(len(keys)))
            np.testing.assert_array_equal(w_train[1], rank[inverse.ravel()])
            assert len(w_train[2]) == (len(keys) if refill else 0)
    assert granted > 0
    for name in want_state:
        np.testing.assert_array_equal(have_state[name], want_state[name], err_msg=name)

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

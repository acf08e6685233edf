"""The host engine (pybind) against a plain-Python model of the key stage."""

import itertools

import numpy as np
import pytest
from reference import RefKeyStage

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
_serial = itertools.count()


@pytest.fixture
def table(engine):
    """table(capacity, padding_keys=(), name=...) -> engine key of a fresh table."""
    prefix = f"test_engine_{next(_serial)}/"

    def _create(capacity, padding_keys=(), name="t", dim=4):
        key = prefix + name
        engine.create_table(key=key, name=name, dim=dim, capacity=capacity,
                            padding_keys=list(padding_keys), access_threshold=0.0,
                            faae_coefficient=1.0)
        return key

    yield _create
    engine.drop_prefix(prefix)
    engine.set_num_threads(1)


def _ids(values):
    return np.asarray(values, dtype=np.int64)


def _process_one(engine, key, ids, train=True):
    (result,) = engine.process([key], [_ids(ids)], train=train)
    unique_rows, restore, reused = result
    assert unique_rows.dtype == np.int32 and restore.dtype == np.int32
    assert len(restore) == len(ids)
    assert len(reused) == 0  # nothing is ever evicted in these tests
    return unique_rows, restore


def _check_batch(engine, key, ref, ids, train=True):
    got_rows, got_restore = _process_one(engine, key, ids, train)
    want_rows, want_restore = ref.process(ids, train)
    np.testing.assert_array_equal(got_rows, want_rows)
    np.testing.assert_array_equal(got_restore, want_restore)
    return got_rows, got_restore


def _check_export(engine, key, ref):
    ids, rows = engine.export_rows(key)
    want_ids, want_rows = ref.export()
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(rows, want_rows)


def test_dedupe_restore_and_first_occurrence_rows(engine, table):
    key = table(100)
    ref = RefKeyStage(100)
    rows, restore = _check_batch(engine, key, ref, [7, 3, 7, 7, 9, 3, 11])
    np.testing.assert_array_equal(rows, [0, 1, 2, 3])
    np.testing.assert_array_equal(restore, [0, 1, 0, 0, 2, 1, 3])
    # Old IDs keep their rows; new ones continue the numbering in order of first occurrence.
    rows, restore = _check_batch(engine, key, ref, [12, 9, 5, 12, 7])
    np.testing.assert_array_equal(rows, [4, 2, 5, 0])
    np.testing.assert_array_equal(restore, [0, 1, 2, 0, 3])
    _check_export(engine, key, ref)
    stats = engine.stats(key)
    assert stats["rows_in_use"] == 6
    assert stats["admitted"] == 6
    assert stats["ids_tracked"] == 6
    assert stats["ids_seen"] == 12
    assert stats["train_batches"] == 2
    assert stats["eval_batches"] == 0
    assert stats["rejected"] == 0
    assert stats["evicted"] == 0
    assert stats["capacity"] == 100


def test_restore_reconstructs_the_batch(engine, table):
    key = table(1000)
    rng = np.random.default_rng(1)
    for _ in range(3):
        ids = rng.integers(-50, 50, size=500)
        rows, restore = _process_one(engine, key, ids)
        exported_ids, exported_rows = engine.export_rows(key)
        row_of = dict(zip(exported_ids.tolist(), exported_rows.tolist()))
        np.testing.assert_array_equal(rows[restore], [row_of[int(i)] for i in ids])
        assert len(set(rows.tolist())) == len(rows)  # unique rows are unique


def test_int64_extremes(engine, table):
    key = table(10)
    ref = RefKeyStage(10)
    batch = [I64_MIN, I64_MAX, 0, -1, 0, I64_MIN, -1, I64_MAX, 1]
    rows, restore = _check_batch(engine, key, ref, batch)
    np.testing.assert_array_equal(rows, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(restore, [0, 1, 2, 3, 2, 0, 3, 1, 4])
    _check_batch(engine, key, ref, [1, I64_MAX, -2, I64_MIN + 1, I64_MAX - 1])
    _check_export(engine, key, ref)
    ids, _ = engine.export_rows(key)
    assert ids.dtype == np.int64
    assert ids[0] == I64_MIN and ids[1] == I64_MAX


def test_one_id_repeated(engine, table):
    key = table(4)
    ref = RefKeyStage(4)
    rows, restore = _check_batch(engine, key, ref, [42] * 1000)
    np.testing.assert_array_equal(rows, [0])
    assert not restore.any()
    assert engine.stats(key)["ids_seen"] == 1000
    assert engine.stats(key)["rows_in_use"] == 1


def test_empty_batch(engine, table):
    key = table(4)
    for train in (True, False):
        rows, restore = _process_one(engine, key, [], train)
        assert rows.shape == (0,) and restore.shape == (0,)
    stats = engine.stats(key)
    assert stats["rows_in_use"] == 0 and stats["ids_tracked"] == 0
    assert stats["train_batches"] == 1 and stats["eval_batches"] == 1


def test_eval_inserts_nothing(engine, table):
    key = table(10)
    ref = RefKeyStage(10)
    _check_batch(engine, key, ref, [5, 6, 5])
    before = engine.stats(key)
    rows, restore = _check_batch(engine, key, ref, [8, 6, 9, 5, 8, 6], train=False)
    np.testing.assert_array_equal(rows, [1, 0])
    np.testing.assert_array_equal(restore, [2, 0, 2, 1, 2, 0])
    # All unseen: every position takes the default index 0.
    rows, restore = _check_batch(engine, key, ref, [100, 101], train=False)
    assert rows.shape == (0,)
    np.testing.assert_array_equal(restore, [0, 0])
    after = engine.stats(key)
    for name in ("rows_in_use", "ids_tracked", "ids_seen", "admitted", "rejected",
                 "train_batches"):
        assert after[name] == before[name], name
    assert after["eval_batches"] == before["eval_batches"] + 2
    _check_export(engine, key, ref)
    # The eval batches did not reserve rows: the next new training ID gets row 2.
    rows, _ = _check_batch(engine, key, ref, [9])
    np.testing.assert_array_equal(rows, [2])


def test_padding_keys(engine, table):
    pads = [-1, I64_MIN]
    key = table(10, padding_keys=pads)
    ref = RefKeyStage(10, pads)
    rows, restore = _check_batch(engine, key, ref, [-1, 4, I64_MIN, 4, 3, -1])
    np.testing.assert_array_equal(rows, [0, 1])
    np.testing.assert_array_equal(restore, [2, 0, 2, 0, 1, 2])
    rows, restore = _check_batch(engine, key, ref, [-1, -1])
    assert rows.shape == (0,)
    np.testing.assert_array_equal(restore, [0, 0])
    _check_batch(engine, key, ref, [-1, 4, 9], train=False)
    stats = engine.stats(key)
    assert stats["ids_seen"] == 3  # padding occurrences are not counted
    assert stats["rows_in_use"] == 2 and stats["ids_tracked"] == 2
    assert stats["rejected"] == 0
    _check_export(engine, key, ref)
    ids, _ = engine.export_rows(key)
    assert not set(pads) & set(ids.tolist())


def test_capacity_exhaustion(engine, table):
    key = table(4, name="small_table")
    ref = RefKeyStage(4)
    _check_batch(engine, key, ref, [10, 20, 30])
    trained = engine.export_rows(key)
    with pytest.raises(RuntimeError) as err:
        _process_one(engine, key, [10, 40, 50, 60])
    message = str(err.value)
    assert "small_table" in message
    assert "device_vocabulary_size" in message
    assert "4" in message
    # Rows handed out before the failure keep their IDs.
    ids, rows = engine.export_rows(key)
    row_of = dict(zip(ids.tolist(), rows.tolist()))
    for i, r in zip(*trained):
        assert row_of[int(i)] == int(r)
    assert engine.stats(key)["rows_in_use"] <= 4
    # Known IDs still plan, in training and in evaluation.
    rows, restore = _process_one(engine, key, [30, 10, 20, 30])
    np.testing.assert_array_equal(rows, [2, 0, 1])
    np.testing.assert_array_equal(restore, [0, 1, 2, 0])
    rows, _ = _process_one(engine, key, [20], train=False)
    np.testing.assert_array_equal(rows, [1])


def test_capacity_exact_fit(engine, table):
    key = table(3)
    ref = RefKeyStage(3)
    _check_batch(engine, key, ref, [1, 2, 3, 3, 2, 1])
    assert engine.stats(key)["rows_in_use"] == 3
    with pytest.raises(RuntimeError, match="device_vocabulary_size"):
        _process_one(engine, key, [4])


def test_multiple_tables_in_one_call(engine, table):
    keys = [table(50, name="a"), table(50, name="b", padding_keys=[0]), table(50, name="c")]
    refs = [RefKeyStage(50), RefKeyStage(50, [0]), RefKeyStage(50)]
    rng = np.random.default_rng(3)
    for _ in range(4):
        batches = [rng.integers(-5, 15, size=n) for n in (30, 7, 0)]
        results = engine.process(keys, [_ids(b) for b in batches], train=True)
        assert len(results) == 3
        for (rows, restore, _), ref, ids in zip(results, refs, batches):
            want_rows, want_restore = ref.process(ids)
            np.testing.assert_array_equal(rows, want_rows)
            np.testing.assert_array_equal(restore, want_restore)
    for key, ref in zip(keys, refs):
        _check_export(engine, key, ref)


def _large_batches(seed):
    rng = np.random.default_rng(seed)
    vocab = np.unique(rng.integers(I64_MIN, I64_MAX, size=60_000, dtype=np.int64))
    vocab = np.concatenate([[I64_MIN, I64_MAX, 0, -1], vocab])
    batches = []
    for n in (200_000, 150_000, 40_000):
        p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
        batches.append(vocab[rng.choice(len(vocab), size=n, p=p / p.sum())])
    return batches


def test_large_batches_identical_for_any_thread_count(engine, table):
    batches = _large_batches(seed=11)
    pads = [int(batches[0][5])]
    ref = RefKeyStage(1 << 20, pads)
    want = [ref.process(b) for b in batches]
    eval_batch = np.concatenate([batches[2][:20_000], np.arange(40_000, dtype=np.int64)])
    want_eval = ref.process(eval_batch, train=False)
    exports = []
    for threads in (1, 2, 4):
        engine.set_num_threads(threads)
        assert engine.num_threads() == threads
        key = table(1 << 20, padding_keys=pads, name=f"threads{threads}")
        other = table(1 << 20, name=f"other{threads}")
        for ids, (want_rows, want_restore) in zip(batches, want):
            # Two tables in one call: the per-table parallel loop nests the per-shard one.
            (rows, restore, _), (rows2, restore2, _) = engine.process(
                [key, other], [ids, ids[::-1].copy()], train=True)
            np.testing.assert_array_equal(rows, want_rows)
            np.testing.assert_array_equal(restore, want_restore)
        rows, restore, _ = engine.process([key], [eval_batch], train=False)[0]
        np.testing.assert_array_equal(rows, want_eval[0])
        np.testing.assert_array_equal(restore, want_eval[1])
        stats = engine.stats(key)
        assert stats["rows_in_use"] == len(ref.rows)
        assert stats["ids_seen"] == sum(int((b != pads[0]).sum()) for b in batches)
        exports.append((engine.export_rows(key), engine.export_rows(other), rows2, restore2))
    _check_export(engine, key, ref)
    for ids_rows, other_rows, rows2, restore2 in exports[1:]:
        for got, want in zip(ids_rows + other_rows + (rows2, restore2),
                             exports[0][0] + exports[0][1] + exports[0][2:]):
            np.testing.assert_array_equal(got, want)


def _ref_thresholded(batches, threshold):
    """Rows and restore of a table admitting IDs once their count reaches threshold
    (every occurrence of the batch counted first), rows by first occurrence."""
    counts, rows, out = {}, {}, []
    for ids in batches:
        for key in ids.tolist():
            counts[key] = counts.get(key, 0) + 1
        unique, index, restore = [], {}, []
        for key in ids.tolist():
            if key not in rows and counts[key] >= threshold:
                rows[key] = len(rows)
            if key not in rows:
                restore.append(None)
                continue
            if key not in index:
                index[key] = len(unique)
                unique.append(rows[key])
            restore.append(index[key])
        out.append((np.array(unique, np.int32),
                    np.array([len(unique) if r is None else r for r in restore], np.int32)))
    return out, counts


def test_large_deferred_batches_with_threshold_identical_for_any_thread_count(engine, table):
    # In-table parallel planning (each thread a group of shards) with admission
    # counts and the pending-batch journal: the same plans and, after the
    # commits, the same host state as one thread and as the reference.
    batches = _large_batches(seed=5)
    want, counts = _ref_thresholded(batches, threshold=3)
    exports = []
    for threads in (1, 3, 16):
        engine.set_num_threads(threads)
        key = table(1 << 20, name=f"thr{threads}")
        engine.configure_admission(key, access_threshold=3.0)
        ids_of_batches = []
        for ids, (want_rows, want_restore) in zip(batches, want):
            rows, restore, _, batch_id = engine.process([key], [ids], train=True,
                                                        deferred=True)[0]
            np.testing.assert_array_equal(rows, want_rows)
            np.testing.assert_array_equal(restore, want_restore)
            ids_of_batches.append(batch_id)
        assert engine.pending_batches(key) == len(batches)
        for batch_id in ids_of_batches:
            engine.commit(key, batch_id)
        stats = engine.stats(key)
        assert stats["ids_tracked"] == len(counts)
        assert stats["admitted"] == sum(1 for c in counts.values() if c >= 3)
        assert stats["rejected"] == sum(int((r == len(u)).sum()) for u, r in want)
        exports.append(engine.export_rows(key))
    for got in exports[1:]:
        for a, b in zip(got, exports[0]):
            np.testing.assert_array_equal(a, b)


def _splitmix64(ids):
    """HashKey of the engine (the splitmix64 finalizer), in NumPy."""
    x = np.asarray(ids, dtype=np.int64).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _expected_map_bytes(ids, tiered, aged=False):
    """The ID map's bytes for a table that took `ids` (distinct) in one batch: per shard (the
    hash's top 4 bits) a probe array of 12-byte slots, the smallest of 16 grown by 1.5x
    steps (s + s // 2) that keeps the shard's IDs within 7/10 of it, and records (16 bytes,
    + 5 tiered) in chunks of 64, 64, 128, ..., 2048, then 4096, with a table of one 8-byte
    pointer per 64 records (one more for the tier records). `aged`: the table has shrunk, so
    its maps also keep a 2-byte shrink age per record (and its pointer table)."""
    shards = np.bincount((_splitmix64(ids) >> np.uint64(60)).astype(np.int64), minlength=16)
    total = 0
    for count in shards.tolist():
        slots = 16
        while slots * 7 < count * 10:
            slots += slots // 2
        records = 0
        if count:
            records = 64
            while records < count:
                records = records * 2 if records < 4096 else records + 4096
        families = 1 + (1 if tiered else 0) + (1 if aged else 0)
        per_record = 16 + (5 if tiered else 0) + (2 if aged else 0)
        total += slots * 12 + records * per_record + families * records // 8
    return total


@pytest.mark.parametrize("tiered", [False, True])
def test_id_map_bytes_counts_probe_arrays_and_records(engine, tiered):
    # Empty: 16 shards of 16 probe slots and no records. Then exactly the probe arrays and
    # record chunks that 100,000 IDs take, from a NumPy model of the shards; a tiered
    # table also keeps its tier records, a device-only one none.
    key = f"test_engine_map_bytes_{int(tiered)}/t"
    engine.create_table(key=key, name="t", dim=4, capacity=1 << 20, padding_keys=[],
                        access_threshold=0.0, faae_coefficient=1.0,
                        host_capacity=(1 << 20) if tiered else 0)
    try:
        assert engine.stats(key)["id_map_bytes"] == 16 * 16 * 12
        ids = np.arange(100_000, dtype=np.int64) * 7919
        engine.process([key], [ids], train=True)
        assert engine.stats(key)["id_map_bytes"] == _expected_map_bytes(ids, tiered)
        # The first shrink gives the maps their shrink ages (2 bytes per record). Erased
        # IDs' records are reused: removing every ID (two shrinks) and taking them again
        # grows nothing (without reuse each shard would need twice the chunks).
        assert engine.shrink(key, 1) == 0
        assert engine.stats(key)["id_map_bytes"] == _expected_map_bytes(ids, tiered, aged=True)
        before = engine.stats(key)["id_map_bytes"]
        assert engine.shrink(key, 1) == ids.size
        assert engine.stats(key)["ids_tracked"] == 0
        engine.process([key], [ids], train=True)
        assert engine.stats(key)["ids_tracked"] == ids.size
        assert engine.stats(key)["id_map_bytes"] == before
    finally:
        engine.drop_prefix(f"test_engine_map_bytes_{int(tiered)}/")


@pytest.mark.parametrize("times", [
    [1_700_000_000, 1_700_000_100, 1_700_000_200, 1_700_000_300],  # seconds: 32-bit offsets
    [5, 2**40, 3, I64_MAX - 7],  # spans that turn the map wide on the second batch
    [0, I64_MAX - 7, 1, 2**33],
])  # (a negative batch time means "now": the engine takes the wall clock)
def test_last_seen_times_are_exact_for_any_int64(engine, table, times):
    # Each batch brings new IDs and repeats old ones at its time; the exported last-seen
    # times and eviction by age match a dict of the newest time per ID, whether the map
    # keeps the times as 32-bit offsets or had to widen them.
    key = table(1 << 12)
    newest = {}
    rng = np.random.default_rng(7)
    for b, time in enumerate(times):
        ids = np.concatenate([np.arange(b * 300, b * 300 + 300), rng.integers(0, b * 300 + 1, 200)])
        engine.process([key], [_ids(ids)], train=True, timestamp=time)
        for i in ids.tolist():
            newest[i] = time
    state = engine.export_state(key, 0, False)
    got = dict(zip(state["keys"].tolist(), state["last_seen"].tolist()))
    assert got == newest
    # Evict against the same dict: the newest trained time minus a max age.
    newest_time = max(times)
    max_age = sorted(newest_time - t for t in set(times))[1]
    want_kept = {i for i, t in newest.items() if t >= newest_time - max_age}
    assert engine.evict(key, max_age) == len(newest) - len(want_kept)
    state = engine.export_state(key, 0, False)
    assert set(state["keys"].tolist()) == want_kept
    assert dict(zip(state["keys"].tolist(), state["last_seen"].tolist())) == {
        i: newest[i] for i in want_kept}


def test_counts_of_ids_repeated_past_the_dedupe_counter(engine):
    # One ID 200,000 times in a batch (past the dedupe entry's 16-bit occurrence counter,
    # which spills into the batch's total), others a few times: each count is the float32
    # sum of one weight per occurrence, added in order, as a NumPy loop gives it.
    key = "test_engine_counts/t"
    weight = np.float32(0.1)
    engine.create_table(key=key, name="t", dim=4, capacity=1 << 10, padding_keys=[],
                        access_threshold=1e9, faae_coefficient=float(weight))
    try:
        ids = np.concatenate([np.full(200_000, 7), np.arange(100), np.full(65_535, 8),
                              np.full(65_536, 9), np.full(65_537, 10)]).astype(np.int64)
        np.random.default_rng(3).shuffle(ids)
        for _ in range(2):
            engine.process([key], [ids], train=True, timestamp=1)
        want = {}
        for i, n in zip(*np.unique(ids, return_counts=True)):
            total = np.float32(0)
            for _ in range(2 * int(n)):
                total = np.float32(total + weight)
            want[int(i)] = float(total)
        state = engine.export_state(key, 0, False)
        assert dict(zip(state["keys"].tolist(), state["counts"].tolist())) == want
    finally:
        engine.drop_prefix("test_engine_counts/")


def test_dedupe_generation_wraps(engine, table):
    # 70,000 batches pass the per-batch dedupe table's 16-bit generation once: batches
    # after the wrap still tell their IDs apart from older batches' (unique rows and
    # restore against the Python model, counts exact).
    key = table(64)
    ref = RefKeyStage(capacity=64)
    counts = {}
    for b in range(70_000):
        ids = [b % 5, (b * 7) % 11, b % 5]
        if b % 9_973 == 0 or b > 65_530:
            rows, restore = _process_one(engine, key, ids)
            want_rows, want_restore = ref.process(ids)
            np.testing.assert_array_equal(rows, want_rows)
            np.testing.assert_array_equal(restore, want_restore)
        else:
            engine.process([key], [_ids(ids)], train=True)
            ref.process(ids)
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
    state = engine.export_state(key, 0, False)
    assert dict(zip(state["keys"].tolist(), state["counts"].tolist())) == counts


def test_errors(engine, table):
    with pytest.raises(KeyError):
        engine.stats("no/such/table")
    with pytest.raises(KeyError):
        engine.process(["no/such/table"], [_ids([1])], train=True)
    key = table(4)
    with pytest.raises(ValueError):
        engine.process([key], [np.zeros((2, 2), np.int64)], train=True)
    with pytest.raises(ValueError):
        engine.set_num_threads(0)
    for capacity in (0, 2**31):
        with pytest.raises(ValueError, match="device_vocabulary_size"):
            engine.create_table(key=key + "bad", name="bad", dim=4, capacity=capacity,
                                padding_keys=[], access_threshold=0.0, faae_coefficient=1.0)
    # Re-registering the same key with other settings is refused.
    with pytest.raises(ValueError, match="already exists"):
        engine.create_table(key=key, name="t", dim=8, capacity=4, padding_keys=[],
                            access_threshold=0.0, faae_coefficient=1.0)


def test_drop_prefix(engine, table):
    key = table(4, name="dropme")
    _process_one(engine, key, [1, 2])
    prefix = key.rsplit("/", 1)[0] + "/"
    assert engine.drop_prefix(prefix) == 1
    assert key not in engine.table_keys()
    with pytest.raises(KeyError):
        engine.export_rows(key)

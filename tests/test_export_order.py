"""The order of a table's exported checkpoint records: by (device row, key), rows -1 first.

The engine places records with a device row at their row instead of sorting them, and
sorts only those without one; rows held twice or spread far wider than the records fall
back to one sort. A save streams them into spool files instead: those with a device row
at their row, those without one selected in passes over the ID map, each the next smallest
keys (so no spot per ID is held). These tests check the exported order against NumPy's
lexsort of the same records, and the records against the engine's own view of the
admitted rows and, streamed, against the same table's export as a whole.
"""

import itertools

import numpy as np
import pytest

_serial = itertools.count()


@pytest.fixture
def make_table(engine):
    prefix = f"test_export_order_{next(_serial)}/"

    def _create(capacity, threshold=0.0, name="t"):
        key = prefix + name
        engine.create_table(key=key, name=name, dim=4, capacity=capacity, padding_keys=[],
                            access_threshold=threshold, faae_coefficient=1.0)
        return key

    yield _create
    engine.drop_prefix(prefix)


def _check_order(state):
    keys, rows = state["keys"], state["rows"]
    order = np.lexsort((keys, rows))  # by row, then key
    np.testing.assert_array_equal(order, np.arange(len(keys)))
    admitted = rows[rows >= 0]
    assert len(np.unique(admitted)) == len(admitted), "a device row exported twice"
    for name in ("counts", "last_seen"):
        assert len(state[name]) == len(keys)


def _check_against_rows(engine, key, state):
    """The exported admitted records are the engine's (ID, row) pairs."""
    ids, rows = engine.export_rows(key)
    mine = state["rows"] >= 0
    got = dict(zip(state["keys"][mine].tolist(), state["rows"][mine].tolist()))
    assert got == dict(zip(ids.tolist(), rows.tolist()))


@pytest.mark.parametrize("threshold", [0.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_export_is_ordered_by_row_then_key(engine, make_table, threshold, seed):
    rng = np.random.default_rng(seed)
    key = make_table(50_000, threshold)
    pool = rng.integers(-(2**62), 2**62, size=8_000)
    for step in range(12):
        batch = rng.choice(pool, size=3_000)
        engine.process([key], [batch], train=True, timestamp=1_000 + step)
        if step in (5, 9):  # free rows, then reused by later admissions (out of order)
            engine.evict(key, 2)
    state = engine.export_state(key, 0)
    _check_order(state)
    _check_against_rows(engine, key, state)
    if threshold > 0:
        assert (state["rows"] < 0).any(), "the test needs IDs counted but not admitted"
    assert len(state["free_rows"]) > 0 or threshold > 0


def test_delta_export_is_ordered_and_holds_the_changed_ids(engine, make_table):
    rng = np.random.default_rng(7)
    key = make_table(20_000)
    first = rng.integers(0, 2**40, size=5_000)
    engine.process([key], [first], train=True, timestamp=10)
    full = engine.export_state(key, 0, delta_chain=True)
    _check_order(full)
    changed = np.concatenate([first[::7], rng.integers(2**41, 2**42, size=2_000)])
    engine.process([key], [changed], train=True, timestamp=20)
    delta = engine.export_state(key, int(full["epoch"]), delta_chain=True)
    _check_order(delta)
    assert set(delta["keys"].tolist()) == set(changed.tolist())


def test_rows_spread_wider_than_the_records(engine, make_table):
    """A few records left at high rows (the rest evicted): the sorted fallback."""
    key = make_table(40_000)
    old = np.arange(30_000, dtype=np.int64) * 3 + 1
    engine.process([key], [old], train=True, timestamp=1)
    recent = np.array([old[-1], old[-50], old[-3_000], old[100]], np.int64)
    engine.process([key], [recent], train=True, timestamp=100)
    engine.evict(key, 10)
    state = engine.export_state(key, 0)
    assert sorted(state["keys"].tolist()) == sorted(recent.tolist())
    assert state["rows"].max() + 1 > 4 * len(state["keys"]) + 4096  # wide rows
    _check_order(state)
    _check_against_rows(engine, key, state)


def test_empty_table_and_unadmitted_only(engine, make_table):
    key = make_table(100, threshold=5.0)
    state = engine.export_state(key, 0)
    assert len(state["keys"]) == 0
    ids = np.array([9, -3, 2**62, -(2**62), 0], np.int64)
    engine.process([key], [ids], train=True, timestamp=1)
    state = engine.export_state(key, 0)
    np.testing.assert_array_equal(state["keys"], np.sort(ids))
    assert (state["rows"] == -1).all()
    _check_order(state)


def _streamed(engine, key, folder, chunk_rows, since=0):
    """The table's export streamed into spool files (a save's path), read back."""
    folder.mkdir()
    out = engine.export_state(key, since, delta_chain=True, spool=str(folder),
                              chunk_rows=chunk_rows)
    columns = {name: np.fromfile(folder / f"{name}.bin", dtype)
               for name, dtype in (("keys", np.int64), ("rows", np.int32),
                                   ("counts", np.float32), ("last_seen", np.int64))}
    assert all(len(c) == int(out["records"]) for c in columns.values())
    assert int(out["rowless"]) == int((columns["rows"] < 0).sum())
    return columns


def test_streamed_export_is_in_key_order_over_several_passes(engine, make_table, tmp_path):
    """More IDs without a device row than one pass selects (65536 at chunk_rows 256 and
    dim 4): in key order all the same, negative keys first, then the admitted ones (seen
    twice) by row; the same records as the export as a whole, full and delta."""
    rng = np.random.default_rng(11)
    key = make_table(50_000, threshold=2.0)
    ids = np.unique(rng.integers(-(2**62), 2**62, size=200_000))
    engine.process([key], [ids], train=True, timestamp=1)
    engine.process([key], [rng.choice(ids, 30_000, replace=False)], train=True, timestamp=2)
    streamed = _streamed(engine, key, tmp_path / "full", chunk_rows=256)
    assert (streamed["rows"] < 0).sum() > 2 * 65_536, "the test needs several passes"
    assert (streamed["rows"] >= 0).sum() > 10_000
    _check_order(streamed)
    whole = engine.export_state(key, 0)
    for name, column in streamed.items():
        np.testing.assert_array_equal(column, whole[name])
    since = int(whole["epoch"])
    changed = ids[::20]
    engine.process([key], [changed], train=True, timestamp=3)
    delta = _streamed(engine, key, tmp_path / "delta", chunk_rows=256, since=since)
    _check_order(delta)
    np.testing.assert_array_equal(np.sort(delta["keys"]), np.sort(changed))

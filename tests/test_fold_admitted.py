"""The columnar fold of a version chain (fold.whole_table + fold.admitted: what WarmStart,
the serving export and a restore on another rank count read) against a per-ID fold written
here from the format's rules, on random chains: full saves by several ranks, deltas that
remove and re-admit IDs, counted-only IDs, a host tier with masked values, an ID repeated
within a file; and every error path."""

import numpy as np
import pytest

from mxrec.saver import fold, schema
from mxrec.saver.manifest import CheckpointError

DIM = 3


def _file(rng, keys, removed=(), tier=True, states=("embedding", "slot")):
    """One rank's table file: each key device row, host tier or counted only."""
    keys = np.asarray(keys, np.int64)
    where = rng.integers(0, 3 if tier else 2, len(keys))  # 0 device, 1 counted, 2 host tier
    rows = np.where(where == 0, np.arange(len(keys)), -1)
    arrays = {
        schema.host_key("keys"): keys,
        schema.host_key("rows"): rows,
        schema.host_key("counts"): rng.integers(1, 9, len(keys)).astype(np.float64),
        schema.host_key("last_seen"): rng.integers(0, 100, len(keys)),
        schema.host_key("free_rows"): np.zeros([0], np.int64),
        schema.host_key("removed"): np.asarray(removed, np.int64),
        schema.SCALARS_KEY: np.array([0, int(rng.integers(0, 100)), 0], np.int64),
        schema.ACCESS_THRESHOLD_KEY: np.float64(1.0),
    }
    device, host = int((where == 0).sum()), int((where == 2).sum())
    for state in states:
        arrays[schema.state_key(state)] = rng.normal(size=(device, DIM)).astype(np.float32)
    if tier:
        arrays[schema.host_key("in_host")] = (where == 2).astype(np.int8)
        for state in states:
            arrays[schema.tier_key(state)] = rng.normal(size=(host, DIM)).astype(np.float32)
            # The embedding is always in the tier; a slot may be absent (mask 0).
            mask = np.ones(host, np.int8) if state == "embedding" else \
                rng.integers(0, 2, host).astype(np.int8)
            arrays[schema.tier_mask_key(state)] = mask
    return arrays


def _version(kind, step, files, table="t"):
    names = [f"{table}-r{r}.npz" for r in range(len(files))]
    manifest = {"kind": kind, "step": step, "ranks": len(files),
                "tables": {table: {"dim": DIM, "files": names}}}
    return fold.OpenVersion(kind, manifest, dict(zip(names, files)), None)


def _random_chain(seed, ranks=2, deltas=3, tier=True):
    rng = np.random.default_rng(seed)
    pool = np.arange(1, 400, dtype=np.int64) * 7919
    versions = []
    for number in range(deltas + 1):
        files = []
        for _ in range(ranks):
            keys = rng.choice(pool, int(rng.integers(0, 60)), replace=False)
            # Repeated within a file (the last record wins), except where the chain is one
            # full file: that is read in place, one record an ID, as a save writes it (a
            # repeated admitted ID there is refused: test below).
            if len(keys) > 2 and rng.random() < 0.3 and (ranks, deltas) != (1, 0):
                keys = np.concatenate([keys, keys[:2]])
            removed = rng.choice(pool, int(rng.integers(0, 20)), replace=False) if number else ()
            files.append(_file(rng, keys, removed, tier))
        versions.append(_version("full" if number == 0 else "delta", 100 + number, files))
    return versions


def _reference(versions, state="embedding", table="t"):
    """(ids, values) of `state` of every admitted ID, folded an ID at a time: each file in
    order (a full version's first file starts afresh), its removals, then its records (the
    last record of an ID wins), values from the device rows or the masked host tier."""
    records = {}  # ID -> (admitted, value or None)
    for kind, manifest, files, _ in versions:
        names = manifest["tables"].get(table, {}).get("files", [])
        for number, file_name in enumerate(names):
            arrays = files[file_name]
            if kind == "full" and number == 0:
                records = {}
            for key in arrays[schema.host_key("removed")].tolist():
                records.pop(key, None)
            in_host = arrays.get(schema.host_key("in_host"),
                                 np.zeros(len(arrays[schema.host_key("keys")])))
            device = host = 0
            for key, row, tiered in zip(arrays[schema.host_key("keys")].tolist(),
                                        arrays[schema.host_key("rows")].tolist(), in_host):
                value = None
                if row >= 0:
                    if schema.state_key(state) in arrays:
                        value = arrays[schema.state_key(state)][device]
                    device += 1
                elif tiered:
                    if (schema.tier_key(state) in arrays
                            and arrays[schema.tier_mask_key(state)][host]):
                        value = arrays[schema.tier_key(state)][host]
                    host += 1
                records[key] = (row >= 0 or bool(tiered), value)
    ids = sorted(key for key, (admitted, _) in records.items() if admitted)
    for key in ids:
        if records[key][1] is None:
            raise CheckpointError(f"checkpoint holds no {state!r} value of ID {key}")
    values = (np.stack([records[key][1] for key in ids]).astype(np.float32) if ids
              else np.zeros((0, DIM), np.float32))
    return np.asarray(ids, np.int64), values


def _admitted(versions, table, dim, state="embedding"):
    return fold.admitted(fold.whole_table(versions, table), dim, state)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("tier", [True, False])
def test_equals_the_per_id_fold(seed, tier):
    versions = _random_chain(seed, ranks=1 + seed % 3, deltas=seed % 4, tier=tier)
    ids, values = _admitted(versions, "t", DIM)
    want_ids, want_values = _reference(versions)
    assert ids.dtype == np.int64 and values.dtype == np.float32
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(values, want_values)
    assert values.shape == (len(ids), DIM)


def test_one_full_file_that_repeats_an_admitted_id_is_refused():
    rng = np.random.default_rng(5)
    arrays = _file(rng, [7, 11, 13, 7], tier=False)
    arrays[schema.host_key("rows")] = np.arange(4)  # every record has a device row
    for state in ("embedding", "slot"):
        arrays[schema.state_key(state)] = rng.normal(size=(4, DIM)).astype(np.float32)
    versions = [_version("full", 100, [arrays])]
    with pytest.raises(CheckpointError, match="ID 7 appears twice"):
        _admitted(versions, "t", DIM)


def test_a_slot_missing_in_the_tier_is_an_error_in_both():
    for seed in range(40):
        versions = _random_chain(seed, ranks=2, deltas=2)
        try:
            want = _reference(versions, "slot")
        except CheckpointError as error:
            with pytest.raises(CheckpointError, match=str(error).split(" ID ")[0]):
                _admitted(versions, "t", DIM, "slot")
            with pytest.raises(CheckpointError) as got:
                _admitted(versions, "t", DIM, "slot")
            assert str(got.value) == str(error)  # the same (first) ID named
            return
        got = _admitted(versions, "t", DIM, "slot")
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    pytest.fail("no chain left an admitted ID without its slot")


def test_a_full_save_starts_afresh_and_a_removal_then_readmission_keeps_the_last():
    rng = np.random.default_rng(0)
    # The embedding only: the rows are set by hand (the fold checks every state's length).
    first = _file(rng, [5, 6], tier=False, states=("embedding",))
    first[schema.host_key("rows")] = np.array([0, 1])
    first[schema.state_key("embedding")] = np.array([[1, 1, 1], [2, 2, 2]], np.float32)
    delta = _file(rng, [6], removed=[5, 6], tier=False, states=("embedding",))
    delta[schema.host_key("rows")] = np.array([0])
    delta[schema.state_key("embedding")] = np.array([[9, 9, 9]], np.float32)
    versions = [_version("full", 1, [first]), _version("delta", 2, [delta])]
    ids, values = _admitted(versions, "t", DIM)
    np.testing.assert_array_equal(ids, [6])
    np.testing.assert_array_equal(values, [[9, 9, 9]])
    # Only the chain's full save and what follows count: an earlier state is not read.
    again = _admitted([_version("full", 3, [delta])], "t", DIM)
    np.testing.assert_array_equal(again[0], [6])


def test_empty_and_unknown_tables():
    rng = np.random.default_rng(1)
    versions = [_version("full", 1, [_file(rng, [], tier=False)])]
    ids, values = _admitted(versions, "t", DIM)
    assert ids.shape == (0,) and values.shape == (0, DIM) and values.dtype == np.float32
    with pytest.raises(CheckpointError, match="table 'other' is not in the checkpoint"):
        _admitted(versions, "other", DIM)


def test_a_delta_table_without_a_full_save_is_refused_as_the_restore_does():
    rng = np.random.default_rng(2)
    versions = [_version("full", 1, [_file(rng, [1])], table="a"),
                _version("delta", 2, [_file(rng, [2])], table="t")]
    with pytest.raises(CheckpointError, match="a delta holds table 't', which its full"):
        _admitted(versions, "t", DIM)
    with pytest.raises(CheckpointError, match="a delta holds table 't', which its full"):
        fold.table_names(versions)
    with pytest.raises(CheckpointError, match="a delta holds table 't', which its full"):
        fold.whole_table(versions, "t")
    assert fold.table_names(versions[:1]) == ["a"]
    assert len(fold.whole_table(versions[:1], "a")) == 1


def test_a_short_state_is_a_clear_error():
    rng = np.random.default_rng(3)
    arrays = _file(rng, [1, 2, 3], tier=False, states=("embedding",))
    arrays[schema.host_key("rows")] = np.array([0, 1, 2])
    arrays[schema.state_key("embedding")] = np.zeros((2, DIM), np.float32)
    with pytest.raises(CheckpointError, match=r"table 't', file t-r0.npz of full-0+7: the "
                                              r"checkpoint has 3 IDs with a device row but "
                                              r"only 2 rows of their 'embedding' values"):
        _admitted([_version("full", 7, [arrays])], "t", DIM)
    tiered = _file(rng, [1, 2], tier=True, states=("embedding",))
    tiered[schema.host_key("rows")] = np.array([-1, -1])
    tiered[schema.host_key("in_host")] = np.array([1, 1], np.int8)
    tiered[schema.tier_key("embedding")] = np.zeros((1, DIM), np.float32)
    tiered[schema.tier_mask_key("embedding")] = np.ones(1, np.int8)
    with pytest.raises(CheckpointError, match="full-0+8: the checkpoint has 2 IDs in the host "
                                              "tier but only 1 rows of their 'embedding'"):
        _admitted([_version("full", 8, [tiered])], "t", DIM)

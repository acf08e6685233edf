"""Checkpoints written and read a chunk of rows at a time (mxrec.saver.stream, table_file,
fold): the memory budget's refusals, a save and restore in many chunks against the state
the process held (every tier: device rows, host memory, SSD file), the same bytes whatever
the chunk size, and a chain written by mxrec's earlier, whole-array writer still restoring.

tests/data/checkpoint_format1 holds a chain (full at step 10, deltas at 20 and 30) written
by that writer (`make.py` there, run on the code before chunked checkpoints) and the state
at step 30 (`expected.npz`: every ID's row and Adagrad slot, from every tier).
"""

import json
import pathlib
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core import tiers
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.saver import stream
from mxrec.saver.checkpoint import CheckpointError, NonFiniteError, Saver
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
FIXTURE = pathlib.Path(__file__).parent / "data" / "checkpoint_format1"


def _fixture_model():
    """The model of the fixture's make.py: a tiered table (64 device rows, 128 in host
    memory, the rest on disk) and a device-only one, trained by Adagrad."""
    tf.compat.v1.reset_default_graph()
    init()
    ids = _v1.placeholder(tf.int64, [None])
    tiered = create_table(tf.int64, 4, "tiered", _v1.truncated_normal_initializer(0, 0.1, seed=1),
                          device_vocabulary_size=64, host_vocabulary_size=128,
                          ssd_vocabulary_size=1000, ssd_data_path=tempfile.mkdtemp(),
                          init_by_id=True)
    plain = create_table(tf.int64, 3, "plain", _v1.truncated_normal_initializer(0, 0.1, seed=2),
                         device_vocabulary_size=1000)
    scale = _v1.get_variable("scale", [], initializer=tf.ones_initializer())
    loss = (tf.reduce_sum(tf.square(scale * sparse_lookup(tiered, ids) - 1.0))
            + tf.reduce_sum(tf.square(sparse_lookup(plain, ids) + 1.0)))
    dense, tables = get_dense_and_sparse_variable()
    train = tf.group(
        _v1.train.GradientDescentOptimizer(0.01).minimize(loss, var_list=dense),
        create_hash_optimizer(0.1).apply_gradients(zip(tf.gradients(loss, tables), tables)))
    return ids, train, (tiered, plain), scale


def _values(sess, tables):
    """{table|state: (ids sorted, values)} from every tier."""
    out = {}
    for table in tables:
        for state, (keys, values) in tiers.export_values(sess, table).items():
            order = np.argsort(keys)
            out[f"{table.table_name}|{state}"] = (keys[order], values[order])
    return out


def test_a_chain_of_the_earlier_format_restores(tmp_path):
    directory = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, directory, ignore=shutil.ignore_patterns("*.py", "expected.npz"))
    expected = np.load(FIXTURE / "expected.npz")
    _, _, tables, scale = _fixture_model()
    saver = Saver(str(directory), checkpoint_memory_mb=1)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        assert saver.restore(sess) == 30
        got = _values(sess, tables)
        assert sess.run(scale) == expected["scale"]
        # Saved again by the chunked writer, restored into a new graph: the same state.
        saver.save(sess, 40)
    assert len(got) == 4
    for key, (ids, values) in got.items():
        order = np.argsort(expected[f"{key}|ids"])
        np.testing.assert_array_equal(ids, expected[f"{key}|ids"][order])
        np.testing.assert_array_equal(values, expected[f"{key}|values"][order])
    _, _, tables, _ = _fixture_model()
    saver = Saver(str(directory))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        assert saver.restore(sess) == 40
        again = _values(sess, tables)
    for key in got:
        np.testing.assert_array_equal(again[key][0], got[key][0])
        np.testing.assert_array_equal(again[key][1], got[key][1])


def test_memory_budget_refusals(tmp_path):
    _fixture_model()
    for bad in (0, -5):
        with pytest.raises(ValueError, match=r"checkpoint_memory_mb must be >= 1"):
            Saver(str(tmp_path), checkpoint_memory_mb=bad)
    for bad in ("256", 1.5, True):
        with pytest.raises(TypeError, match="checkpoint_memory_mb must be an integer"):
            Saver(str(tmp_path), checkpoint_memory_mb=bad)
    tf.compat.v1.reset_default_graph()
    init()
    ids = _v1.placeholder(tf.int64, [None])
    wide = create_table(tf.int64, 4096, "wide", _v1.zeros_initializer(), device_vocabulary_size=8)
    loss = tf.reduce_sum(sparse_lookup(wide, ids))
    _, tables = get_dense_and_sparse_variable()
    create_hash_optimizer(0.1).apply_gradients(zip(tf.gradients(loss, tables), tables))
    # 256 rows x dim 4096 x 2 states (embedding, Adagrad's accumulator) x 4 bytes x 3 copies.
    need = 256 * 4096 * 2 * 4 * 3
    with pytest.raises(ValueError, match=rf"checkpoint_memory_mb=2 MiB is below what one chunk "
                                         rf"of table 'wide' needs: .* = {need} bytes \(24 MiB\)"):
        Saver(str(tmp_path), checkpoint_memory_mb=2)
    Saver(str(tmp_path), checkpoint_memory_mb=24)


def _tiered_model(dim):
    tf.compat.v1.reset_default_graph()
    init()
    ids = _v1.placeholder(tf.int64, [None])
    table = create_table(tf.int64, dim, "big", _v1.truncated_normal_initializer(0, 0.1, seed=4),
                         device_vocabulary_size=300, host_vocabulary_size=700,
                         ssd_vocabulary_size=20_000, ssd_data_path=tempfile.mkdtemp(),
                         init_by_id=True)
    loss = tf.reduce_sum(tf.square(sparse_lookup(table, ids) - 0.5))
    _, tables = get_dense_and_sparse_variable()
    train = create_hash_optimizer(0.2).apply_gradients(zip(tf.gradients(loss, tables), tables))
    return ids, train, table


def test_many_chunks_save_and_restore_every_tier_and_write_the_same_bytes(tmp_path):
    """dim 128 with Adagrad and a 1 MiB budget: 341 rows a chunk, 4000 IDs over the device
    rows (300), host memory (700) and the SSD file; a full save, a delta after more training,
    and their restore equal the state the process held; a full save in one chunk writes the
    same bytes as in many."""
    dim = 128
    assert stream.chunk_rows(1, dim, 2) == 341
    ids, train, table = _tiered_model(dim)
    small = Saver(str(tmp_path / "small"), checkpoint_memory_mb=1)
    large = Saver(str(tmp_path / "large"), checkpoint_memory_mb=4096)
    rng = np.random.default_rng(0)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for _ in range(60):
            sess.run(train, {ids: rng.integers(0, 4000, 256)})
        small.save(sess, 1)
        large.save(sess, 1)
        for _ in range(10):
            sess.run(train, {ids: rng.integers(3000, 4500, 256)})
        small.save(sess, 2, kind="delta")
        want = _values(sess, [table])
        stats = tiers.stats(table)
    assert stats["ssd_rows"] > 1000 and stats["host_rows"] > 341, stats
    for name in ("full-000000000001/manifest.json",):
        small_files = json.loads((tmp_path / "small" / name).read_text())["files"]
        large_files = json.loads((tmp_path / "large" / name).read_text())["files"]
        assert small_files["table-000.npz"] == large_files["table-000.npz"]
    # A plain np.load reads the file (the format np.savez writes).
    with np.load(tmp_path / "small" / "full-000000000001" / "table-000.npz") as npz:
        assert npz["tier/embedding"].shape[1] == dim and npz["state/embedding"].shape == (300, dim)
    ids, train, table = _tiered_model(dim)
    restorer = Saver(str(tmp_path / "small"), checkpoint_memory_mb=1)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        assert restorer.restore(sess) == 2
        got = _values(sess, [table])
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key][0], want[key][0])
        np.testing.assert_array_equal(got[key][1], want[key][1])


def test_a_failing_tier_reader_leaves_the_table_as_it_was_and_raises_its_error(tmp_path):
    """The engine's chunked import (HostTier::ReplaceFrom): the reader's exception comes
    back as it was raised, and a chunk of the wrong size is refused; either way the table
    keeps its state (the new host tier is built aside)."""
    from mxrec._lib import loader

    ids, train, table = _tiered_model(8)
    rng = np.random.default_rng(1)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for _ in range(20):
            sess.run(train, {ids: rng.integers(0, 3000, 256)})
        before = _values(sess, [table])
        engine = loader.engine()
        state = engine.export_state(table.table_key)
        host = int(state["in_host"].sum())
        assert host > 0
        common = dict(keys=state["keys"], rows=state["rows"], counts=state["counts"],
                      last_seen=state["last_seen"], free_rows=state["free_rows"],
                      next_row=state["next_row"], newest_timestamp=state["newest_timestamp"],
                      counting_frozen=state["counting_frozen"],
                      access_threshold=state["access_threshold"], in_host=state["in_host"],
                      lru_rows=state["lru_rows"], lru_ages=state["lru_ages"],
                      tier_components=list(state["tier_components"]), chunk_rows=100)
        width = len(state["tier_components"]) * 8

        def failing(begin, n):
            if begin >= 200:
                raise OSError("disk gone")
            return state["tier_present"][begin:begin + n], state["tier_values"][begin:begin + n]

        with pytest.raises(OSError, match="disk gone"):
            engine.import_state(table.table_key, tier_reader=failing, **common)
        with pytest.raises(ValueError, match=r"chunk of 100 IDs holds 100 masks and "
                                             rf"{100 * (width - 1)} values"):
            engine.import_state(table.table_key, tier_reader=lambda b, n: (
                np.zeros(n, np.uint32), np.zeros((n, width - 1), np.float32)), **common)
        assert _values(sess, [table]).keys() == before.keys()
        for key, (keys, values) in _values(sess, [table]).items():
            np.testing.assert_array_equal(keys, before[key][0])
            np.testing.assert_array_equal(values, before[key][1])


def test_a_refused_save_leaves_no_spool_or_temporary(tmp_path):
    ids, train, table = _tiered_model(8)
    saver = Saver(str(tmp_path), checkpoint_memory_mb=1)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for begin in range(0, 3000, 250):  # most IDs in the host tier and on disk
            sess.run(train, {ids: np.arange(begin, begin + 250)})
        saver.save(sess, 1)
        sess.run(table.variable.assign(tf.fill(tf.shape(table.variable), np.nan)))
        # every value of the 300 device rows x dim 8
        with pytest.raises(NonFiniteError, match="table 'big' embedding: 2400 non-finite"):
            saver.save(sess, 2, check_finite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full-000000000001"]


@pytest.mark.parametrize("where", ["local", "ram"])
def test_write_npz_and_mapped_npz_round_trip(tmp_path, where):
    """A file written a chunk at a time is the npz np.load reads, its entry the file's size
    and SHA-256; read back mapped (a file of another filesystem through a local copy)."""
    import hashlib

    rng = np.random.default_rng(3)
    rows = rng.random((1000, 7)).astype(np.float32)
    keys = rng.integers(-2**63, 2**63 - 1, 1000, dtype=np.int64)
    path = str(tmp_path / "t.npz") if where == "local" else "ram://mxrec-test/t.npz"
    entry = stream.write_npz(path, [stream.whole("host/keys", keys, rows=99),
                                    stream.whole("state/embedding", rows, rows=128),
                                    stream.whole("host/threshold", np.array(3.5)),
                                    stream.whole("host/removed", np.zeros(0, np.int64))])
    copies = stream.LocalCopies()
    try:
        local = copies.local(path)
        with open(local, "rb") as f:
            data = f.read()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        stream.verify(path, entry)
        with pytest.raises(CheckpointError, match="truncated"):
            stream.verify(path, dict(entry, bytes=entry["bytes"] + 1))
        mapped = stream.MappedNpz(local)
        np.testing.assert_array_equal(mapped["state/embedding"][100:300], rows[100:300])
        np.testing.assert_array_equal(mapped["host/keys"], keys)
        assert float(mapped["host/threshold"]) == 3.5 and mapped["host/removed"].shape == (0,)
        with np.load(local) as npz:
            assert list(npz.files) == ["host/keys", "state/embedding", "host/threshold",
                                       "host/removed"]
            np.testing.assert_array_equal(npz["state/embedding"], rows)
    finally:
        copies.close()
    with pytest.raises(CheckpointError, match="got 999 rows, its shape says"):
        stream.write_npz(str(tmp_path / "bad.npz"), [stream.Member(
            "x", np.float32, (1000, 7), lambda: iter([rows[:999]]))])


def test_chunked_tier_import_places_every_id_as_the_in_memory_import(tmp_path):
    """The engine's chunked import of host-tier IDs (HostTier::ReplaceFrom with a reader):
    IDs spread among device rows, the host tier and the SSD tier (several chunks, SSD writes
    of several 8 MiB batches, some IDs without values, a reader returning float64 and
    non-contiguous arrays), every ID's values exported back equal to the input, and the
    same export as the import of the same state from whole arrays."""
    from mxrec._lib import loader

    engine = loader.engine()
    dim, n, host = 64, 40_000, 3_000
    rng = np.random.default_rng(5)
    keys = rng.permutation(rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64))
    rows = np.full(n, -1, np.int32)
    rows[:100] = np.arange(100)
    in_host = np.ones(n, np.uint8)
    in_host[:100] = 0
    in_host[100:200] = 0  # counted, not admitted
    tiered = int(in_host.sum())
    present = np.full(tiered, 3, np.uint32)
    present[::97] = 0  # no values: restarts from the initializer, no tier slot
    present[1::89] = 1  # the embedding only
    values = rng.standard_normal((tiered, 2, dim)).astype(np.float32)
    values[present == 0] = 0
    values[present == 1, 1] = 0
    common = dict(keys=keys, rows=rows, counts=rng.random(n).astype(np.float32),
                  last_seen=rng.integers(0, 100, n), free_rows=np.zeros(0, np.int32),
                  next_row=100, newest_timestamp=99, counting_frozen=False,
                  access_threshold=0.0, in_host=in_host, lru_rows=np.zeros(0, np.int32),
                  lru_ages=np.zeros(0, np.uint32), tier_components=["embedding", "slot"])
    asked = []

    def reader(begin, n_ids):
        asked.append((begin, n_ids))
        wide = np.zeros((n_ids, 2, 2 * dim))  # float64, read through a strided view
        wide[:, :, ::2] = values[begin:begin + n_ids]
        return present[begin:begin + n_ids], wide[:, :, ::2]

    exports = []
    for how in ("chunked", "whole"):
        key = f"test_chunked_tier_import_{how}/t"
        engine.create_table(key=key, name="imported", dim=dim, capacity=128,
                            host_capacity=host, ssd_capacity=n, ssd_path=str(tmp_path))
        try:
            if how == "chunked":
                engine.import_state(key, tier_reader=reader, chunk_rows=19_001, **common)
            else:
                engine.import_state(key, tier_present=present, tier_values=values, **common)
            stats = engine.tier_stats(key)
            exports.append(engine.export_state(key))
        finally:
            engine.drop_prefix(key)
        held = int((present != 0).sum())
        assert (stats["host_rows"], stats["ssd_rows"]) == (host, held - host), stats
    assert asked == [(b, min(19_001, tiered - b)) for b in range(0, tiered, 19_001)]
    chunked, whole = exports
    for name in ("keys", "rows", "counts", "last_seen", "in_host", "tier_present",
                 "tier_values"):
        np.testing.assert_array_equal(chunked[name], whole[name], err_msg=name)
    # Against the input: the export lists the tiered IDs by key; the values of each.
    exported = chunked["in_host"] != 0
    order = np.argsort(keys[in_host != 0])
    np.testing.assert_array_equal(chunked["keys"][exported], keys[in_host != 0][order])
    np.testing.assert_array_equal(chunked["tier_present"], present[order])
    np.testing.assert_array_equal(chunked["tier_values"], values[order])

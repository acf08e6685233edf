"""Host and SSD tiers: a small device cache over host memory (and disk) trains exactly like
device-only mode, on the direct path and through the graph modifier with prefetch; rows spill
to disk and read back; each misconfiguration has its error."""

import numpy as np
import pytest
import tensorflow as tf
from support import TIER_OPTIMIZERS

from mxrec.core import tiers
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.graph.modifier import modify_graph_and_start_emb_cache
from mxrec.optimizers import gradient_descent
from mxrec.util.initialize import get_initializer, init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
BATCH = 8
NUM_BATCHES = 30
DIM = 4
IDS_A = 400  # table "a": one lookup of [B, 2] per step
IDS_B = 200  # table "b": two lookups of [B, 1] per step
OPTIMIZERS = TIER_OPTIMIZERS


def _data(seed=0, num_batches=NUM_BATCHES):
    """Skewed IDs, so that rows leave the cache and come back."""
    rng = np.random.default_rng(seed)
    n = BATCH * num_batches
    a = (rng.zipf(1.3, size=(n, 2)) % IDS_A).astype(np.int64)
    b = (1000 + rng.zipf(1.2, size=(n, 2)) % IDS_B).astype(np.int64)
    labels = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    return {"a": a, "b": b}, labels


def _dataset(data):
    features, labels = data
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)


def _tables(device_a, device_b, host=0, ssd=0, ssd_path=()):
    init_value = _v1.constant_initializer(0.05)
    return (create_table(tf.int64, DIM, "a", init_value, device_vocabulary_size=device_a,
                         host_vocabulary_size=host, ssd_vocabulary_size=ssd,
                         ssd_data_path=ssd_path),
            create_table(tf.int64, DIM, "b", init_value, device_vocabulary_size=device_b,
                         host_vocabulary_size=host, ssd_vocabulary_size=ssd,
                         ssd_data_path=ssd_path))


def _model(features, labels, tables, modify_graph):
    table_a, table_b = tables
    emb = [sparse_lookup(table_a, features["a"], modify_graph=modify_graph, name="a_lookup"),
           sparse_lookup(table_b, features["b"][:, :1], modify_graph=modify_graph,
                         name="b_first"),
           sparse_lookup(table_b, features["b"][:, 1:], modify_graph=modify_graph,
                         name="b_second")]
    flat = tf.concat([tf.reshape(e, [-1, e.shape[1] * DIM]) for e in emb], axis=1)
    kernel = _v1.get_variable("dense/kernel", [flat.shape[-1], 1],
                              initializer=_v1.glorot_uniform_initializer(seed=3))
    logits = tf.matmul(flat, kernel)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    dense, sparse = get_dense_and_sparse_variable()
    dense_op = _v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense)
    return loss, dense_op, sparse


def _train(optimizer, tiered, modify_graph=False, prefetch=1, seed=0, ssd_path=None,
           host=1000, ssd=0):
    """Trains on the same batches; returns {table: {component: {id: row}}}, the dense kernel
    and the tier statistics."""
    init(prefetch_batch_number=prefetch)
    data = _data(seed)
    iterator = _v1.data.make_initializable_iterator(_dataset(data))
    features, labels = iterator.get_next()
    if tiered:
        tables = _tables(20, 20, host=host, ssd=ssd, ssd_path=ssd_path or ())  # 5% and 10%
    else:
        tables = _tables(IDS_A, IDS_B)
    loss, dense_op, sparse = _model(features, labels, tables, modify_graph)
    grads = tf.gradients(loss, sparse)
    train_op = tf.group(dense_op, OPTIMIZERS[optimizer]().apply_gradients(zip(grads, sparse)))
    if modify_graph:
        modify_graph_and_start_emb_cache()
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(get_initializer(True) if modify_graph else iterator.initializer)
        for _ in range(NUM_BATCHES):
            sess.run(train_op)
        rows = {}
        for table in tables:
            exported = tiers.export_values(sess, table)
            rows[table.table_name] = {
                component: dict(zip(ids.tolist(), values)) for component, (ids, values)
                in exported.items()}
        kernel = sess.run(_v1.trainable_variables()[0])
    stats = {t.table_name: tiers.stats(t) for t in tables} if tiered else {}
    return rows, kernel, stats


def _assert_same(got, want):
    """Bit for bit: a tiered table applies the same float operations to the same rows in the
    same order as the device-only one (swaps only copy values), so nothing may differ."""
    rows, kernel, _ = got
    want_rows, want_kernel, _ = want
    for table, components in want_rows.items():
        assert sorted(rows[table]) == sorted(components), table
        for component, values in components.items():
            got_values = rows[table][component]
            assert sorted(got_values) == sorted(values), f"{table}/{component}: IDs differ"
            for key, value in values.items():
                np.testing.assert_array_equal(got_values[key], value,
                                              err_msg=f"{table}/{component}/{key}")
    np.testing.assert_array_equal(kernel, want_kernel)


_REFERENCES = {}


def _reference(optimizer, seed=0):
    if (optimizer, seed) not in _REFERENCES:
        with tf.Graph().as_default():
            _REFERENCES[(optimizer, seed)] = _train(optimizer, tiered=False, seed=seed)
        terminate_config_initializer()
    return _REFERENCES[(optimizer, seed)]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("seed", [0, 1])
def test_host_tier_direct_path_equals_device_only(optimizer, seed):
    got = _train(optimizer, tiered=True, seed=seed)
    _assert_same(got, _reference(optimizer, seed))
    stats = got[2]
    # The cache is small: rows really went to the host tier and came back.
    for name in ("a", "b"):
        assert stats[name]["swap_out_total"] > 50, stats[name]
        assert stats[name]["swap_in_total"] > 10, stats[name]
        assert stats[name]["device_rows"] == 20
        assert stats[name]["tier_ids"] == stats[name]["host_rows"] > 0
        assert stats[name]["pending_plans"] == 0


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_host_tier_graph_modifier_prefetch_equals_device_only(optimizer, prefetch):
    _assert_same(_train(optimizer, tiered=True, modify_graph=True, prefetch=prefetch),
                 _reference(optimizer))


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("prefetch", [1, 4])
def test_ssd_tier_equals_device_only(tmp_path, optimizer, prefetch):
    got = _train(optimizer, tiered=True, modify_graph=True, prefetch=prefetch,
                 ssd_path=str(tmp_path), host=30, ssd=1000)
    _assert_same(got, _reference(optimizer))
    for name in ("a", "b"):
        assert got[2][name]["ssd_rows"] > 0, got[2][name]
        assert got[2][name]["host_rows"] <= 30


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_gather_scatter_swaps_equal_device_only(tmp_path, monkeypatch, optimizer):
    """The swap path of a GPU table (gather, swap on the host, scatter), run on the CPU."""
    monkeypatch.setattr(tiers, "SWAP_IN_PLACE", False)
    got = _train(optimizer, tiered=True, modify_graph=True, prefetch=2, ssd_path=str(tmp_path),
                 host=30, ssd=1000)
    types = {op.type for op in _v1.get_default_graph().get_operations()}
    assert "MxrecTierSwap" in types and "MxrecTierSwapInPlace" not in types
    _assert_same(got, _reference(optimizer))


@pytest.mark.parametrize("device, in_place", [("/device:CPU:0", True), ("/device:GPU:0", False)])
def test_swap_op_follows_the_table_device(monkeypatch, device, in_place):
    """CPU tables swap in place; tables on a GPU gather, swap on the host and scatter."""
    from mxrec.core import embedding  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(embedding, "accelerator_device", lambda: device)
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, DIM, "t", _v1.zeros_initializer(), device_vocabulary_size=4,
                         host_vocabulary_size=100)
    assert tiers.swaps_in_place(table) == in_place
    sparse_lookup(table, _v1.placeholder(tf.int64, [None]))  # graph only: no GPU needed
    types = {op.type for op in _v1.get_default_graph().get_operations()}
    assert ("MxrecTierSwapInPlace" in types) == in_place
    assert ("MxrecTierSwap" in types) == (not in_place)


def test_eval_lookup_reads_host_rows():
    """Evaluation (is_train=False) sees trained rows wherever they live, and moves nothing."""
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                         device_vocabulary_size=4, host_vocabulary_size=100)
    ids = _v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    loss = tf.reduce_sum(emb * tf.range(1.0, DIM + 1.0))
    grads = tf.gradients(loss, [table.variable])
    train_op = gradient_descent.create_hash_optimizer(1.0).apply_gradients(
        zip(grads, [table.variable]))
    eval_emb = sparse_lookup(table, ids, is_train=False, name="eval")
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for batch in ([1, 2, 3, 4], [5, 6, 7, 8], [1, 9, 9, 10]):
            sess.run(train_op, {ids: batch})
        before = tiers.stats(table)
        got = sess.run(eval_emb, {ids: [1, 2, 5, 9, 11]})
        assert tiers.stats(table)["swap_in_total"] == before["swap_in_total"]
    trained = -np.arange(1.0, DIM + 1.0)
    np.testing.assert_allclose(got, [2 * trained, trained, trained, 2 * trained, 0 * trained])
    assert list(tiers.tier_of(table, [1, 2, 5, 9, 11])) == [0, 1, 1, 0, -1]


def test_ssd_stream_spills_and_reads_back(tmp_path, engine):
    """IDs beyond host memory's share spill to the SSD file, read back exactly, and spill
    again into the records freed by the reads (the file stays within the IDs it ever held)."""
    init()
    table = create_table(tf.int64, 2, "t", _v1.zeros_initializer(), device_vocabulary_size=8,
                         host_vocabulary_size=16, ssd_vocabulary_size=4096,
                         ssd_data_path=str(tmp_path))
    key = table.table_key
    truth = {}
    rng = np.random.default_rng(0)
    device = {}  # row -> ID as the engine planned it
    for step in range(700):
        if step < 200:  # new IDs, far more than host memory holds
            batch = rng.choice(100_000, size=6, replace=False).astype(np.int64)
        else:  # read back, swap out again: freed records, reused
            batch = rng.choice(sorted(truth), size=6, replace=False).astype(np.int64)
        (rows, _, reused), = engine.process([key], [batch], True, step)
        current = np.stack([truth.get(device.get(int(r)), np.zeros(2, np.float32))
                            for r in reused]) if len(reused) else np.zeros((0, 2), np.float32)
        incoming, fresh = engine.tier_swap(key, "embedding", reused, current)
        for i, row in enumerate(reused):
            new_id = int(batch[list(rows).index(row)])
            if not fresh[i]:
                np.testing.assert_array_equal(incoming[i], truth[new_id])
            else:
                assert new_id not in truth
        for i, row in enumerate(rows):
            device[int(row)] = int(batch[i])
            truth[int(batch[i])] = np.array([batch[i], step], np.float32)
    stats = tiers.stats(table)
    assert stats["ssd_rows"] > 1000 and stats["host_rows"] <= 16, stats
    # Some 3000 rows go back to disk after step 200: without reuse of the records they
    # freed, the file would hold about four times the IDs; with it, at most 4/3 of the
    # rows it holds at its peak (the holes left for spills to go to the file's end).
    assert stats["ssd_record_bytes"] == 16 + 2 * 4, stats
    assert stats["ssd_file_bytes"] <= (len(truth) * 4 // 3 + 1) * stats["ssd_record_bytes"], \
        stats
    # The write statistics: every spilled row in one record, written in runs, and the
    # pages those runs touched.
    assert stats["ssd_spilled_records"] >= stats["ssd_rows"], stats
    assert stats["ssd_write_bytes"] == stats["ssd_spilled_records"] * stats["ssd_record_bytes"]
    assert 0 < stats["ssd_write_runs"] <= stats["ssd_spilled_records"], stats
    assert stats["ssd_write_bytes"] <= stats["ssd_write_pages"] * 4096, stats
    assert stats["ssd_write_pages"] <= stats["ssd_spilled_records"] * 2, stats
    # The plans' records were hinted to the kernel ahead of their steps (the hints' page
    # runs themselves: tests/cc/ssd_tier_test.cc).
    assert 0 < stats["ssd_read_ahead_runs"] <= stats["ssd_read_ahead_records"], stats
    ids, values = engine.tier_export(key, "embedding")
    for i, value in zip(ids, values):
        np.testing.assert_array_equal(value, truth[int(i)])
    assert len(ids) + 8 == len(truth)



def test_ssd_resident_ids_cost_only_the_id_map(tmp_path, engine):
    """Host memory the engine holds per SSD-resident ID (docs/TIERS.md, "Memory per ID"):
    the ID map's bytes, at most 47 per ID with the tier record, and nothing in the tier
    but a bit per record (its record number in the file is the tier record's: no index by
    ID), while 30,000 more IDs go to disk; and the file holds one record per row on disk."""
    key = "test_tiers_ram_per_ssd_id/t"
    engine.create_table(key=key, name="ram_per_ssd_id", dim=4, capacity=512,
                        host_capacity=1024, ssd_capacity=100_000, ssd_path=str(tmp_path))
    try:
        engine.tier_register(key, "slot")
        device = np.zeros((512, 4), np.float32)
        seen = []
        for step in range(120):
            ids = np.arange(step * 500, step * 500 + 500, dtype=np.int64) * 7919 + 1
            (_, _, reused), = engine.process([key], [ids], True, step)
            for component in ("embedding", "slot"):
                engine.tier_swap(key, component, reused, device[reused])
            if 50 <= step < 60 or 110 <= step < 120:
                seen.append((engine.tier_stats(key), engine.stats(key)["id_map_bytes"]))
        (tier_half, _), (tier_all, map_all) = seen[9], seen[-1]
        assert tier_all["ssd_rows"] - tier_half["ssd_rows"] > 29_000, seen
        # The SSD records' live bits: 1 per record (the vector grows by doubling). Each
        # half's most: the spill order's entries are dropped when the writer catches up, so
        # one moment's figure may sit below its neighbours'.
        most = [max(tier["host_bytes"] for tier, _ in half) for half in (seen[:10], seen[10:])]
        assert most[1] - most[0] <= 60_000 // 4, seen
        assert map_all <= 47 * 60_000, seen
        record = tier_all["ssd_record_bytes"]
        assert record == 16 + 2 * 4 * 4, seen
        assert tier_all["ssd_file_bytes"] <= (tier_all["ssd_rows"] + 1024) * record, seen
    finally:
        engine.drop_prefix(key)

def _apply_swap(engine, key, component, plan, truth, device):
    """Applies `plan` for one component: checks the values that come back against `truth`
    (ID -> last trained value), then "trains" the batch: its IDs get new values."""
    applied_step, batch, rows, reused = plan
    current = np.stack([truth.get(device.get(int(r)), np.zeros(2, np.float32))
                        for r in reused]) if len(reused) else np.zeros((0, 2), np.float32)
    incoming, fresh = engine.tier_swap(key, component, reused, current)
    checked = 0
    for i, row in enumerate(reused):
        new_id = int(batch[list(rows).index(row)])
        if fresh[i]:
            assert new_id not in truth, (component, applied_step, new_id)
        else:
            np.testing.assert_array_equal(incoming[i], truth[new_id], err_msg=component)
            checked += 1
    sign = 1.0 if component == "embedding" else -1.0
    for i, row in enumerate(rows):
        device[int(row)] = int(batch[i])
        truth[int(batch[i])] = np.array([batch[i], sign * applied_step], np.float32)
    return checked


@pytest.fixture(params=["serial", "parallel"])
def swap_threads(request, engine):
    """Swaps copied on the calling thread, or split over two pool threads at any size."""
    if request.param == "parallel":  # the test's init() gives the pool two threads
        engine.set_tier_parallel_min_rows(1)
    yield request.param
    engine.set_tier_parallel_min_rows(1 << 15)


@pytest.mark.parametrize("ahead", [1, 3])
def test_plans_applied_behind_the_key_stage(tmp_path, engine, ahead, swap_threads):
    """As with prefetch: the key stage plans `ahead` batches before the step applies their
    swaps, and the optimizer slot applies each plan one batch after the embedding (as with
    two lookups of a table in one step). Host slots spill to disk while the plans that chose
    them are pending, later plans read them back, IDs evicted meanwhile restart from the
    initializer, and every value that comes back is the one last trained."""
    init(key_process_thread_num=2 if swap_threads == "parallel" else 1)
    table = create_table(tf.int64, 2, "t", _v1.zeros_initializer(), device_vocabulary_size=8,
                         host_vocabulary_size=4, ssd_vocabulary_size=4096,
                         ssd_data_path=str(tmp_path))
    key = table.table_key
    engine.tier_register(key, "opt/slot")
    rng = np.random.default_rng(ahead)
    pool = np.arange(300, dtype=np.int64)
    weights = 1.0 / (pool + 1.0)
    truth = {"embedding": {}, "opt/slot": {}}   # ID -> last trained value
    device = {"embedding": {}, "opt/slot": {}}  # row -> ID whose value the row holds now
    last_planned = {}  # ID -> step of the last batch that held it
    planned, slot_lag = [], []
    steps, max_age = 400, 40
    checked = 0
    for step in range(steps + ahead + 1):
        if step < steps:
            batch = rng.choice(pool, size=4, replace=False, p=weights / weights.sum())
            (rows, _, reused), = engine.process([key], [batch], True, step)
            planned.append((step, batch, rows, reused))
            for i in batch:
                last_planned[int(i)] = step
            if step % 50 == 49:
                # The IDs of pending batches are younger than max_age: none is in flight.
                removed = engine.evict(key, max_age)
                old = {i for i, seen in last_planned.items() if seen < step - max_age}
                assert removed == len(old)
                for i in old:
                    truth["embedding"].pop(i, None)
                    truth["opt/slot"].pop(i, None)
                    del last_planned[i]
        if step >= ahead and planned:
            plan = planned.pop(0)
            checked += _apply_swap(engine, key, "embedding", plan, truth["embedding"],
                                   device["embedding"])
            slot_lag.append(plan)
        if len(slot_lag) > 1 or (slot_lag and not planned):
            checked += _apply_swap(engine, key, "opt/slot", slot_lag.pop(0), truth["opt/slot"],
                                   device["opt/slot"])
    assert not planned and not slot_lag
    stats = tiers.stats(table)
    assert checked > 400 and stats["ssd_rows"] > 0 and stats["pending_plans"] == 0, stats
    device_ids, device_rows = engine.export_rows(key)
    for component in ("embedding", "opt/slot"):
        ids, values = engine.tier_export(key, component)
        assert sorted(ids.tolist() + device_ids.tolist()) == sorted(truth[component])
        for i, value in zip(ids, values):
            np.testing.assert_array_equal(value, truth[component][int(i)])
        for i, row in zip(device_ids, device_rows):
            assert device[component][int(row)] == int(i)


# --- misconfiguration -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"host_vocabulary_size": -1}, "host_vocabulary_size must be an int >= 0"),
    ({"host_vocabulary_size": 1.5}, "host_vocabulary_size must be an int >= 0"),
    ({"ssd_vocabulary_size": 10}, "needs host_vocabulary_size > 0"),
    ({"host_vocabulary_size": 10, "ssd_vocabulary_size": 10, "ssd_data_path": "/no/such/dir"},
     "not an existing directory"),
])
def test_bad_tier_settings(kwargs, match):
    init()
    with pytest.raises(ValueError, match=match):
        create_table(tf.int64, DIM, "t", _v1.zeros_initializer(), device_vocabulary_size=4,
                     **kwargs)


def _one_table_step(device, host, lookups=1):
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, DIM, "small", _v1.zeros_initializer(),
                         device_vocabulary_size=device, host_vocabulary_size=host)
    ids = _v1.placeholder(tf.int64, [None])
    emb = [sparse_lookup(table, ids, name=f"l{i}") for i in range(lookups)]
    loss = tf.add_n([tf.reduce_sum(e) for e in emb])
    grads = tf.gradients(loss, [table.variable])
    return ids, tf.group(gradient_descent.create_hash_optimizer(0.1).apply_gradients(
        zip(grads, [table.variable])))


def test_device_cache_smaller_than_a_step_is_an_error():
    ids, train_op = _one_table_step(device=4, host=100, lookups=2)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(train_op, {ids: [1, 2]})
        with pytest.raises(tf.errors.ResourceExhaustedError,
                           match=r"'small'.*device cache.*device_vocabulary_size is 4"):
            sess.run(train_op, {ids: [3, 4, 5]})


def test_total_capacity_exhausted_is_an_error():
    ids, train_op = _one_table_step(device=4, host=6)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(train_op, {ids: [1, 2, 3, 4]})
        sess.run(train_op, {ids: [5, 6, 7, 8]})
        with pytest.raises(tf.errors.ResourceExhaustedError,
                           match=r"'small' is full.*4 device_vocabulary_size \+ 6 "
                                 r"host_vocabulary_size"):
            sess.run(train_op, {ids: [9, 10, 11]})
        # Nothing trained is lost: the known IDs still train.
        sess.run(train_op, {ids: [1, 2, 9, 10]})


def test_full_ssd_tier_is_an_error_and_loses_nothing(tmp_path):
    """With host memory and disk full, a batch of new IDs is refused with the numbers; every
    value already trained still reads back (from the device, host memory and disk)."""
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, DIM, "small", _v1.zeros_initializer(),
                         device_vocabulary_size=2, host_vocabulary_size=2,
                         ssd_vocabulary_size=3, ssd_data_path=str(tmp_path))
    ids = _v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(sparse_lookup(table, ids) * tf.range(1.0, DIM + 1.0))
    train_op = gradient_descent.create_hash_optimizer(1.0).apply_gradients(
        zip(tf.gradients(loss, [table.variable]), [table.variable]))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for batch in ([1, 2], [3, 4], [5, 6], [7]):
            sess.run(train_op, {ids: batch})
        assert tiers.stats(table)["ssd_rows"] > 0
        with pytest.raises(tf.errors.ResourceExhaustedError,
                           match=r"'small' is full: 7 IDs.*2 device_vocabulary_size \+ 2 "
                                 r"host_vocabulary_size \+ 3 ssd_vocabulary_size = 7"):
            sess.run(train_op, {ids: [8]})
        exported = tiers.export_values(sess, table, slots=False)["embedding"]
    assert exported[0].tolist() == [1, 2, 3, 4, 5, 6, 7]
    np.testing.assert_allclose(exported[1], np.tile(-np.arange(1.0, DIM + 1.0), (7, 1)))


def test_host_tier_smaller_than_a_batch_with_ssd_tier_is_refused(tmp_path):
    """With an SSD tier, the rows a batch moves out of the device cache wait in host memory
    until they are spilled: a batch moving more rows out than host_vocabulary_size is
    refused with the table, both numbers and the setting; batches that fit train, before
    and after, and nothing trained is lost."""
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, DIM, "small", _v1.zeros_initializer(),
                         device_vocabulary_size=4, host_vocabulary_size=2,
                         ssd_vocabulary_size=100, ssd_data_path=str(tmp_path))
    ids = _v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(sparse_lookup(table, ids) * tf.range(1.0, DIM + 1.0))
    train_op = gradient_descent.create_hash_optimizer(1.0).apply_gradients(
        zip(tf.gradients(loss, [table.variable]), [table.variable]))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(train_op, {ids: [1, 2, 3]})  # into free device rows: nothing leaves
        # 4 IDs for 1 free row: 3 rows leave the device cache, for a host tier of 2.
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"'small': host_vocabulary_size \(2\) is smaller than the rows "
                                 r"one batch needs.*moves 3 rows out.*Raise "
                                 r"host_vocabulary_size.*at least 3"):
            sess.run(train_op, {ids: [4, 5, 6, 7]})
        for batch in ([4, 5], [6, 7], [8, 9], [1, 2], [3]):
            sess.run(train_op, {ids: batch})
        assert tiers.stats(table)["ssd_rows"] > 0
        exported = tiers.export_values(sess, table, slots=False)["embedding"]
    assert exported[0].tolist() == list(range(1, 10))
    # IDs 1, 2 and 3 trained twice, read back from host memory or disk the second time.
    want = np.tile(-np.arange(1.0, DIM + 1.0), (9, 1))
    want[:3] *= 2
    np.testing.assert_allclose(exported[1], want)


def test_eviction_removes_host_tier_rows():
    ids, train_op = _one_table_step(device=2, host=10)
    table = tf.compat.v1.get_default_graph().get_collection("mxrec_sparse_tables")[0]._mxrec_table
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for batch in ([1, 2], [3, 4], [5, 6]):
            sess.run(train_op, {ids: batch})
        assert tiers.stats(table)["tier_ids"] == 4
        table.shrink(1)  # every ID was seen since: all restart at age 0
        assert table.shrink(1) == 6
        stats = tiers.stats(table)
        assert stats["tier_ids"] == 0 and stats["host_rows"] == 0 and stats["device_rows"] == 0


def test_export_state_of_tiered_table_has_tier_fields(engine):
    # Checkpoints of tiered tables: tests/test_tier_checkpoint.py.
    init()
    table = create_table(tf.int64, DIM, "t", _v1.zeros_initializer(), device_vocabulary_size=4,
                         host_vocabulary_size=10)
    state = engine.export_state(table.table_key)
    assert len(state["in_host"]) == 0 and state["tier_values"].shape[0] == 0

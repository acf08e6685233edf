"""Checkpoints of tables with a host (and SSD) tier: every ID's row is saved wherever it lives
(device cache, host memory, disk) with its optimizer slots, and a restore trains on exactly as
if training never stopped; eviction removes rows from every tier."""

import time

import numpy as np
import pytest
import tensorflow as tf
from support import TIER_OPTIMIZERS

from mxrec._lib import loader
from mxrec.core import tiers
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.graph.modifier import modify_graph_and_start_emb_cache
from mxrec.saver.checkpoint import Saver
from mxrec.saver.warm_start import WarmStart
from mxrec.util.initialize import get_initializer, init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
BATCH = 8
STEPS = 24
SPLIT = 12
DIM = 4
IDS = 300
OPTIMIZERS = TIER_OPTIMIZERS


def _data():
    rng = np.random.default_rng(5)
    n = BATCH * STEPS
    ids = (rng.zipf(1.3, size=(n, 3)) % IDS).astype(np.int64)
    labels = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    return ids, labels


def _build(optimizer, skip=0, ssd_path=None, modify_graph=False, prefetch=1):
    """The model on batches [skip:]; a device cache of 20 rows (about 7% of the IDs)."""
    init(prefetch_batch_number=prefetch)
    ids, labels = _data()
    dataset = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(BATCH).skip(skip)
    iterator = _v1.data.make_initializable_iterator(dataset)
    features, label = iterator.get_next()
    kwargs = dict(host_vocabulary_size=1000)
    if ssd_path is not None:  # host memory holds 40 rows, the rest spills to disk
        kwargs = dict(host_vocabulary_size=40, ssd_vocabulary_size=1000, ssd_data_path=ssd_path)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.05),
                         device_vocabulary_size=20, **kwargs)
    emb = sparse_lookup(table, features, modify_graph=modify_graph, name="lookup")
    flat = tf.reshape(emb, [-1, 3 * DIM])
    kernel = _v1.get_variable("dense/kernel", [3 * DIM, 1],
                              initializer=_v1.glorot_uniform_initializer(seed=3))
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=label, logits=tf.matmul(flat, kernel)))
    dense, sparse = get_dense_and_sparse_variable()
    train_op = tf.group(
        _v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
        OPTIMIZERS[optimizer]().apply_gradients(zip(tf.gradients(loss, sparse), sparse)))
    if modify_graph:
        modify_graph_and_start_emb_cache()
    start = get_initializer(True) if modify_graph else iterator.initializer
    return table, train_op, start, kernel


def _state(sess, table, kernel):
    exported = tiers.export_values(sess, table)
    ids = exported["embedding"][0]
    return ({c: dict(zip(ids.tolist(), values)) for c, (ids, values) in exported.items()},
            sess.run(kernel), dict(zip(ids.tolist(), tiers.tier_of(table, ids).tolist())))


def _residency(table):
    """IDs with a device row: with the cache order restored, the step after a restore
    swaps out the same victims as the straight run."""
    return sorted(loader.engine().export_rows(table.table_key)[0].tolist())


def _assert_same(got, want):
    rows, kernel, residency = got[:3]
    want_rows, want_kernel, want_residency = want[:3]
    assert residency == want_residency
    if len(got) > 3 and len(want) > 3:
        assert got[3] == want[3], "the step after the restore chose other swap victims"
    assert sorted(rows) == sorted(want_rows)
    for component, values in want_rows.items():
        assert sorted(rows[component]) == sorted(values), component
        for key, value in values.items():
            np.testing.assert_allclose(rows[component][key], value, atol=1e-6,
                                       err_msg=f"{component}/{key}")
    np.testing.assert_allclose(kernel, want_kernel, atol=1e-6)


_STRAIGHT = {}


def _straight(optimizer, ssd_path):
    key = (optimizer, ssd_path is not None)
    if key not in _STRAIGHT:
        with tf.Graph().as_default():
            table, train_op, start, kernel = _build(optimizer, ssd_path=ssd_path)
            with _v1.Session() as sess:
                sess.run(_v1.global_variables_initializer())
                sess.run(start)
                for step in range(1, STEPS + 1):
                    sess.run(train_op)
                    if step == SPLIT + 1:
                        after_one = _residency(table)
                _STRAIGHT[key] = _state(sess, table, kernel) + (after_one,)
        terminate_config_initializer()
    return _STRAIGHT[key]


def _train_until_split(optimizer, save, ssd_path=None):
    """Trains the first SPLIT steps in a graph of their own; returns save(sess)."""
    with tf.Graph().as_default():
        _, train_op, start, _ = _build(optimizer, ssd_path=ssd_path)
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            sess.run(start)
            for _ in range(SPLIT):
                sess.run(train_op)
            result = save(sess)
    terminate_config_initializer()
    return result


def _train_from_split(optimizer, load, ssd_path=None, **build):
    """Builds the model on batches [SPLIT:], runs load(sess, table) before its first batch,
    trains the rest; returns _state()."""
    table, train_op, start, kernel = _build(optimizer, skip=SPLIT, ssd_path=ssd_path, **build)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        load(sess, table)
        sess.run(start)
        for _ in range(STEPS - SPLIT):
            sess.run(train_op)
        return _state(sess, table, kernel)


def _tf_save(tmp_path):
    return lambda sess: _v1.train.Saver().save(sess, str(tmp_path / "model"))


def _save_then_resume(optimizer, kind, ckpt, ssd_path):
    with tf.Graph().as_default():
        table, train_op, start, _ = _build(optimizer, ssd_path=ssd_path)
        saver = Saver(str(ckpt))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            sess.run(start)
            for step in range(1, SPLIT + 1):
                sess.run(train_op)
                if kind == "delta" and step in (4, 8):
                    saver.save(sess, step, kind="full" if step == 4 else "delta")
            saver.save(sess, SPLIT, kind=kind)
            stats = tiers.stats(table)
    terminate_config_initializer()
    assert stats["tier_ids"] > 0
    if ssd_path is not None:
        assert stats["ssd_rows"] > 0
    with tf.Graph().as_default():
        table, train_op, start, kernel = _build(optimizer, skip=SPLIT, ssd_path=ssd_path)
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            sess.run(start)
            assert Saver(str(ckpt)).restore(sess) == SPLIT
            restored = tiers.stats(table)
            assert restored["tier_ids"] == stats["tier_ids"]
            assert restored["device_rows"] == stats["device_rows"]
            for step in range(1, STEPS - SPLIT + 1):
                sess.run(train_op)
                if step == 1:
                    after_one = _residency(table)
            state = _state(sess, table, kernel) + (after_one,)
    terminate_config_initializer()
    return state


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["full", "delta"])
@pytest.mark.parametrize("ssd", [False, True])
def test_save_restore_continue_equals_straight_run(tmp_path, optimizer, kind, ssd):
    ssd_path = None
    if ssd:
        ssd_path = str(tmp_path / "ssd")
        (tmp_path / "ssd").mkdir()
    got = _save_then_resume(optimizer, kind, tmp_path / "ckpt", ssd_path)
    _assert_same(got, _straight(optimizer, ssd_path))


def test_delta_holds_ids_whose_tier_changed(tmp_path):
    table, train_op, start, _ = _build("sgd")
    saver = Saver(str(tmp_path))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(start)
        sess.run(train_op)
        saver.save(sess, 1)
        for _ in range(5):
            sess.run(train_op)
        saver.save(sess, 6, kind="delta")
    delta = saver.serving_delta(6)["t"]
    _, arrays = saver._read_version("delta", 6)  # pylint: disable=protected-access
    in_host = arrays["table-000.npz"]["host/in_host"].astype(bool)
    assert in_host.any()  # IDs swapped out since step 1 are in the delta, with their values
    assert len(delta["ids"]) == len(delta["embeddings"])


def test_tf_saver_round_trip_continues_exactly(tmp_path):
    optimizer = "adagrad"
    path = _train_until_split(optimizer, _tf_save(tmp_path))
    reader = tf.train.load_checkpoint(path)
    assert reader.get_tensor("t/mxrec_host/in_host").sum() > 0
    assert reader.get_tensor("t/mxrec_host/tier_values").shape[1] == 2  # embedding + accumulator
    got = _train_from_split(optimizer, lambda sess, _: _v1.train.Saver().restore(sess, path))
    _assert_same(got, _straight(optimizer, None))


@pytest.mark.parametrize("ssd", [False, True])
def test_warm_start_loads_host_tier_rows(tmp_path, ssd):
    """WarmStart of a tiered table from a tiered checkpoint brings the host-tier (and disk)
    rows and slots along: training on equals the straight run."""
    optimizer = "adagrad"
    ssd_path = None
    if ssd:
        ssd_path = str(tmp_path / "ssd")
        (tmp_path / "ssd").mkdir()
    path = _train_until_split(optimizer, _tf_save(tmp_path), ssd_path)
    def load(sess, table):
        WarmStart(path).run(sess)
        assert tiers.stats(table)["tier_ids"] > 0

    _assert_same(_train_from_split(optimizer, load, ssd_path), _straight(optimizer, ssd_path))


def test_warm_start_of_host_tier_rows_into_a_table_without_tier_is_refused(tmp_path):
    path = _train_until_split("sgd", _tf_save(tmp_path))
    init()
    create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.05), device_vocabulary_size=20)
    with pytest.raises(ValueError, match=r"'t' holds \d+ IDs in the host tier.*"
                                         r"host_vocabulary_size"):
        WarmStart(path, "t")


def _wait_for_pending_plans(table):
    deadline = time.time() + 10
    while tiers.stats(table)["pending_plans"] == 0 and time.time() < deadline:
        time.sleep(0.05)
    assert tiers.stats(table)["pending_plans"] > 0


@pytest.mark.parametrize("kind", ["full", "delta", "tf"])
def test_save_with_planned_batches_pending_continues_exactly(tmp_path, kind):
    """Saved while the graph modifier's prefetched batches are planned but not trained: the
    checkpoint holds each ID where its values are, and training on from it gives the values
    of the straight run (the cache's choices may differ: the planned batches were counted)."""
    optimizer = "adagrad"
    with tf.Graph().as_default():
        table, train_op, start, _ = _build(optimizer, modify_graph=True, prefetch=2)
        saver = Saver(str(tmp_path))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            sess.run(start)
            for step in range(1, SPLIT + 1):
                sess.run(train_op)
                if kind == "delta" and step == 6:
                    _wait_for_pending_plans(table)
                    saver.save(sess, step)
            _wait_for_pending_plans(table)
            if kind == "tf":
                path = _v1.train.Saver().save(sess, str(tmp_path / "model"))
            else:
                saver.save(sess, SPLIT, kind=kind)
    terminate_config_initializer()
    def load(sess, _):
        if kind == "tf":
            _v1.train.Saver().restore(sess, path)
        else:
            assert Saver(str(tmp_path)).restore(sess) == SPLIT

    got = _train_from_split(optimizer, load)
    want = _straight(optimizer, None)
    _assert_same(got[:2] + (None,), want[:2] + (None,))


def test_delta_after_a_save_with_pending_plans_holds_the_ids_they_moved(engine):
    """A save with a plan pending records its victim at the victim's device row; once the
    plan has run, the next delta must hold the victim again (now in the host tier), or full +
    delta would give its row to two IDs."""
    init()
    table = create_table(tf.int64, DIM, "t", _v1.zeros_initializer(), device_vocabulary_size=4,
                         host_vocabulary_size=100)
    key = table.table_key
    engine.process([key], [np.array([1, 2, 3, 4], np.int64)], True, 1)  # fills the cache
    (rows, _, reused), = engine.process([key], [np.array([5, 6], np.int64)], True, 2)
    assert len(reused) == 2  # two victims among 1..4: the plan is pending
    full = engine.export_state(key, 0, 1)
    before = dict(zip(full["keys"].tolist(), full["rows"].tolist()))
    assert before[5] == before[6] == -1 and sorted(r for r in before.values() if r >= 0) == \
        [0, 1, 2, 3]
    engine.tier_swap(key, "embedding", reused, np.zeros((2, DIM), np.float32))  # the step
    delta = engine.export_state(key, full["epoch"], 1)
    merged = dict(before)
    merged.update(zip(delta["keys"].tolist(), delta["rows"].tolist()))
    in_host = dict(zip(delta["keys"].tolist(), delta["in_host"].tolist()))
    owned = [r for r in merged.values() if r >= 0]
    assert sorted(owned) == [0, 1, 2, 3], merged  # no row given to two IDs
    victims = [k for k, r in before.items() if r in set(rows.tolist())]
    assert len(victims) == 2 and all(in_host[v] == 1 for v in victims), (victims, in_host)


def test_eviction_removes_rows_from_every_tier(tmp_path):
    table, train_op, start, _ = _build("adagrad", ssd_path=str(tmp_path))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(start)
        for _ in range(STEPS):
            sess.run(train_op)
        before = tiers.stats(table)
        assert before["ssd_rows"] > 0 and before["host_rows"] > 0 and before["device_rows"] > 0
        table.shrink(1)  # every ID was seen since: all restart at age 0
        removed = table.shrink(1)
        after = tiers.stats(table)
        assert removed == before["device_rows"] + before["tier_ids"]
        assert after["tier_ids"] == 0 and after["host_rows"] == 0 and after["ssd_rows"] == 0
        assert after["device_rows"] == 0
        assert all(len(ids) == 0 for ids, _ in tiers.export_values(sess, table).values())


def test_restore_into_graph_modifier_with_prefetch_continues_exactly(tmp_path):
    """Saved on the direct path, restored before the prefetching iterator starts, trained on
    through the graph modifier with prefetch 2: the same as never stopping."""
    optimizer = "lazy_adam"
    _train_until_split(optimizer, lambda sess: Saver(str(tmp_path)).save(sess, SPLIT))
    got = _train_from_split(optimizer, lambda sess, _: Saver(str(tmp_path)).restore(sess),
                            modify_graph=True, prefetch=2)
    _assert_same(got, _straight(optimizer, None))


def test_restore_while_batches_are_planned_fails_the_next_step(tmp_path):
    """A restore drops the batches planned against the state it replaces; a step that
    reads one is an error that says to restore before the pipeline starts."""
    with tf.Graph().as_default():
        _, train_op, start, _ = _build("sgd")
        saver = Saver(str(tmp_path))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            sess.run(start)
            sess.run(train_op)
            saver.save(sess, 1)
    terminate_config_initializer()
    table, train_op, start, _ = _build("sgd", modify_graph=True, prefetch=2)
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(start)
        for _ in range(4):  # the cache fills: the prefetched batches' plans swap rows
            sess.run(train_op)
        deadline = time.time() + 10
        while tiers.stats(table)["pending_plans"] == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert tiers.stats(table)["pending_plans"] > 0
        Saver(str(tmp_path)).restore(sess)
        # The restore dropped those plans; the prefetching thread may already have planned its
        # next batch against the restored state, so the count is not checked here: the step
        # below reads a batch planned before the restore, and that is the error.
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"'t'.*planned before the table was restored"):
            sess.run(train_op)


def _import_snapshot(engine, key, ids, scale):
    """Restores `ids` (int64) into a table of 2 device rows: the first two on the device, the
    rest in the host tier with the embedding value [id, scale]."""
    n = len(ids)
    host = n - 2
    values = np.stack([ids[2:], np.full(host, scale)], axis=1).astype(np.float32)
    engine.import_state(
        key, keys=ids, rows=np.array([0, 1] + [-1] * host, np.int32),
        counts=np.ones(n, np.float32), last_seen=np.zeros(n, np.int64),
        free_rows=np.zeros(0, np.int32), next_row=2, newest_timestamp=0,
        counting_frozen=False, access_threshold=0.0,
        in_host=np.array([0, 0] + [1] * host, np.uint8), lru_rows=np.array([0, 1], np.int32),
        lru_ages=np.zeros(2, np.uint32), tier_components=["embedding"],
        tier_present=np.ones(host, np.uint32), tier_values=values.reshape(host, 1, 2))


def _host_state(engine, key):
    state = engine.export_state(key)
    del state["epoch"]  # export_state closes a save epoch
    ids, values = engine.tier_export(key)
    return state, dict(zip(ids.tolist(), values.tolist()))


def test_failed_restore_leaves_the_table_as_it_was(tmp_path, engine):
    """A restore whose SSD file cannot be written (ssd_data_path gone) fails with the reason,
    and the table keeps its old state in every tier: host memory, disk and the ID map."""
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    init()
    table = create_table(tf.int64, 2, "t", _v1.zeros_initializer(), device_vocabulary_size=2,
                         host_vocabulary_size=2, ssd_vocabulary_size=10, ssd_data_path=str(ssd))
    key = table.table_key
    _import_snapshot(engine, key, np.arange(1, 8, dtype=np.int64), 1.0)  # 3 on disk
    assert tiers.stats(table)["ssd_rows"] == 3
    state, values = _host_state(engine, key)
    assert values == {i: [float(i), 1.0] for i in range(3, 8)}
    ssd.rename(tmp_path / "elsewhere")  # the old file stays open; a new one cannot be made
    with pytest.raises(ValueError, match=r"'t': ssd_data_path .* is not an existing directory"):
        _import_snapshot(engine, key, np.arange(11, 18, dtype=np.int64), 2.0)
    got_state, got_values = _host_state(engine, key)
    assert got_values == values
    assert got_state.keys() == state.keys()
    for field, value in state.items():
        np.testing.assert_array_equal(got_state[field], value, err_msg=field)
    (tmp_path / "elsewhere").rename(ssd)
    _import_snapshot(engine, key, np.arange(11, 18, dtype=np.int64), 2.0)
    assert _host_state(engine, key)[1] == {i: [float(i), 2.0] for i in range(13, 18)}


def test_restoring_the_current_checkpoint_keeps_a_batch_planned_after_the_save(tmp_path, engine):
    """An Estimator's evaluation restores the checkpoint training has just written while
    training has batches planned ahead. A batch planned after the save moved its IDs to the
    recency list's tail (the one part of the export that planned batches keep), so the
    restore must still see the checkpoint as the current state: the planned batch stays and
    its step commits (importing would drop it: "planned before the table was restored")."""
    with tf.Graph().as_default():
        table, train_op, start, _ = _build("sgd")
        key = table.table_key
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            sess.run(start)
            for _ in range(4):  # the cache of 20 rows fills and swaps
                sess.run(train_op)
            path = _v1.train.Saver().save(sess, str(tmp_path / "model"))
            before = engine.export_state(key)
            # A batch planned ahead of its step (IDs on the device and in the host tier).
            on_device = engine.export_rows(key)[0][:3]
            in_host = before["keys"][before["rows"] < 0][:3]
            (_, _, _, planned), = engine.process(
                [key], [np.concatenate([on_device, in_host]).astype(np.int64)], True, 0,
                deferred=True)
            after = engine.export_state(key)
            assert not np.array_equal(before["lru_rows"], after["lru_rows"]) or \
                not np.array_equal(before["lru_ages"], after["lru_ages"])
            _v1.train.Saver().restore(sess, path)
            assert engine.pending_batches(key) == 1
            engine.commit(key, planned)
            assert engine.pending_batches(key) == 0
    terminate_config_initializer()

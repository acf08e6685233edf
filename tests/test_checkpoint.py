"""Checkpoints: TF Saver with host state, full and delta saves, restore, crash safety."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup
from mxrec.hooks import IncrementalCheckpointHook
from mxrec.optimizers import adagrad, ftrl, gradient_descent, lazy_adam
from mxrec.saver.checkpoint import CheckpointError, Saver
from mxrec.util.initialize import init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(0.1),
    "adagrad": lambda: adagrad.create_hash_optimizer(0.1),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(0.05),
    "ftrl": lambda: ftrl.create_hash_optimizer(0.1, l1_regularization_strength=0.01),
}
VOCAB = 40
BATCH = 16
STEPS = 12


def _batches():
    rng = np.random.default_rng(11)
    ids = rng.integers(-(2**63), 2**63 - 1, size=VOCAB, dtype=np.int64)
    return [ids[rng.zipf(1.6, size=BATCH) % VOCAB] for _ in range(STEPS)]


class Model:
    """A table, a dense weight, and both optimizers; eviction every 4 steps if asked."""

    def __init__(self, optimizer="adagrad", admission=False, capacity=64):
        init(prefetch_batch_number=0)
        self.table = create_table(
            tf.int64, 4, "user", tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3),
            device_vocabulary_size=capacity)
        self.ids = tf.compat.v1.placeholder(tf.int64, [None])
        self.time = tf.compat.v1.placeholder_with_default(tf.constant(0, tf.int64), [])
        add_timestamp(self.time)
        self.admission = admission
        config = ({"access_threshold": 2, "eviction_threshold": 3} if admission else None)
        emb = sparse_lookup(self.table, self.ids, access_and_evict_config=config)
        weight = tf.compat.v1.get_variable("w", [4], initializer=tf.compat.v1.ones_initializer())
        self.loss = tf.reduce_sum(tf.square(tf.reduce_sum(emb * weight, axis=1) - 1.0))
        dense, sparse = get_dense_and_sparse_variable()
        self.train = tf.group(
            OPTIMIZERS[optimizer]().apply_gradients(zip(tf.gradients(self.loss, sparse), sparse)),
            tf.compat.v1.train.AdamOptimizer(0.01).minimize(self.loss, var_list=dense))
        self.eval_ids = tf.compat.v1.placeholder(tf.int64, [None])
        self.eval_emb = sparse_lookup(self.table, self.eval_ids, is_train=False)
        self.weight = weight

    def run(self, sess, batches, first_step):
        for offset, batch in enumerate(batches):
            step = first_step + offset + 1
            sess.run(self.train, {self.ids: batch, self.time: step})
            if self.admission and step % 4 == 0:
                self.table.evict(2)

    def snapshot(self, sess):
        ids, rows = self.table.export_rows()
        return {"ids": ids, "rows": rows, "table": sess.run(self.table.variable),
                "w": sess.run(self.weight), "stats": self.table.stats()}


def _assert_same_model(got, want):
    np.testing.assert_array_equal(got["ids"], want["ids"])
    np.testing.assert_array_equal(got["rows"], want["rows"])
    np.testing.assert_allclose(got["table"][got["rows"]], want["table"][want["rows"]], atol=1e-6)
    np.testing.assert_allclose(got["w"], want["w"], atol=1e-6)
    assert got["stats"]["rows_in_use"] == want["stats"]["rows_in_use"]


def _straight_run(optimizer, admission):
    with tf.Graph().as_default():
        model = Model(optimizer, admission)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            model.run(sess, _batches(), 0)
            result = model.snapshot(sess)
        terminate_config_initializer()
    return result


@pytest.mark.parametrize("admission", [False, True], ids=["device_only", "admission_eviction"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_save_restore_continue_equals_straight_run(tmp_path, optimizer, admission):
    want = _straight_run(optimizer, admission)
    batches = _batches()
    with tf.Graph().as_default():
        model = Model(optimizer, admission)
        saver = Saver(str(tmp_path))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            model.run(sess, batches[:4], 0)
            saver.save(sess, 4)
            model.run(sess, batches[4:7], 4)
            saver.save(sess, 7, kind="delta")
        terminate_config_initializer()
    with tf.Graph().as_default():
        model = Model(optimizer, admission)
        saver = Saver(str(tmp_path))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert saver.restore(sess) == 7
            model.run(sess, batches[7:], 7)
            got = model.snapshot(sess)
        terminate_config_initializer()
    _assert_same_model(got, want)


def test_tf_saver_carries_host_state_into_a_new_process(tmp_path):
    """tf.compat.v1.train.Saver saves the host state; a new process restores and goes on."""
    want = _straight_run("lazy_adam", admission=True)
    script = textwrap.dedent(f"""
        import sys, numpy as np, tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        sys.path.insert(0, {REPO!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_checkpoint import Model, _batches
        mode, path = sys.argv[1], sys.argv[2]
        model = Model("lazy_adam", admission=True)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            if mode == "first":
                sess.run(tf.compat.v1.global_variables_initializer())
                model.run(sess, _batches()[:5], 0)
                saver.save(sess, path)
            else:
                saver.restore(sess, path)
                model.run(sess, _batches()[5:], 5)
                snap = model.snapshot(sess)
                np.savez(path + ".npz", ids=snap["ids"], rows=snap["rows"],
                         table=snap["table"], w=snap["w"],
                         rows_in_use=snap["stats"]["rows_in_use"])
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    path = str(tmp_path / "model")
    for mode in ("first", "second"):
        subprocess.run([sys.executable, "-c", script, mode, path], check=True, env=env,
                       timeout=120)
    got = dict(np.load(path + ".npz"))
    got["stats"] = {"rows_in_use": int(got.pop("rows_in_use"))}
    _assert_same_model(got, want)


def _trained_saver(tmp_path, steps=(3, 6, 9), kinds=("full", "delta", "delta")):
    batches = _batches()
    snapshots = {}
    with tf.Graph().as_default():
        model = Model("adagrad", admission=True)
        saver = Saver(str(tmp_path))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            done = 0
            for step, kind in zip(steps, kinds):
                model.run(sess, batches[done:step], done)
                done = step
                saver.save(sess, step, kind=kind)
                snapshots[step] = model.snapshot(sess)
        terminate_config_initializer()
    return snapshots


def _restored(tmp_path, version=None):
    with tf.Graph().as_default():
        model = Model("adagrad", admission=True)
        saver = Saver(str(tmp_path))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            step = saver.restore(sess, version)
            snap = model.snapshot(sess)
        terminate_config_initializer()
    return step, snap


def test_full_plus_deltas_and_older_versions(tmp_path):
    snapshots = _trained_saver(tmp_path)
    for version in (None, 9, 6, 3):
        step, snap = _restored(tmp_path, version)
        assert step == (version or 9)
        _assert_same_model(snap, snapshots[step])
    with pytest.raises(CheckpointError, match="no checkpoint at step 5"):
        _restored(tmp_path, 5)


def test_delta_size_follows_touched_ids_not_table_size(tmp_path):
    """A delta after touching k IDs holds about k IDs, whatever the table holds."""
    rng = np.random.default_rng(5)
    with tf.Graph().as_default():
        model = Model("sgd", capacity=20_000)
        saver = Saver(str(tmp_path))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(10):
                sess.run(model.train, {model.ids: rng.integers(0, 2**40, size=1500)})
            saver.save(sess, 1)
            sizes = {}
            for step, touched in ((2, 10), (3, 100), (4, 1000)):
                sess.run(model.train, {model.ids: rng.integers(0, 2**40, size=touched)})
                path = saver.save(sess, step, kind="delta")
                sizes[touched] = os.path.getsize(os.path.join(path, "table-000.npz"))
                manifest = __import__("json").load(open(os.path.join(path, "manifest.json")))
                assert manifest["tables"]["user"]["ids"] == touched
        terminate_config_initializer()
    full = os.path.getsize(os.path.join(tmp_path, "full-000000000001", "table-000.npz"))
    assert sizes[10] < sizes[100] < sizes[1000] < full / 5
    assert sizes[10] < full / 100


def _corrupt(path, how):
    target = os.path.join(path, "table-000.npz")
    if how == "truncated":
        data = open(target, "rb").read()
        open(target, "wb").write(data[: len(data) // 2])
    elif how == "corrupted":
        data = bytearray(open(target, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(target, "wb").write(bytes(data))
    elif how == "missing":
        os.remove(target)
    elif how == "incomplete":
        os.remove(os.path.join(path, "manifest.json"))


@pytest.mark.parametrize("how", ["truncated", "corrupted", "missing", "incomplete"])
def test_damaged_files_are_reported_by_name(tmp_path, how):
    _trained_saver(tmp_path, steps=(3,), kinds=("full",))
    version = os.path.join(tmp_path, "full-000000000003")
    _corrupt(version, how)
    with pytest.raises(CheckpointError, match=f"full-000000000003.*{how}"):
        _restored(tmp_path)


def test_delta_without_its_predecessor_is_refused(tmp_path):
    _trained_saver(tmp_path)
    import shutil

    shutil.rmtree(os.path.join(tmp_path, "delta-000000000006"))
    with pytest.raises(CheckpointError, match="follows step 6, which is missing"):
        _restored(tmp_path)


def test_delta_before_any_full_save_is_refused(tmp_path):
    with tf.Graph().as_default():
        Model("sgd")
        saver = Saver(str(tmp_path))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(CheckpointError, match="needs a full save"):
                saver.save(sess, 1, kind="delta")
        terminate_config_initializer()


_KILL_SCRIPT = textwrap.dedent("""
    import os, sys, numpy as np, tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    sys.path.insert(0, sys.argv[2]); sys.path.insert(0, sys.argv[3])
    from test_checkpoint import Model, _batches, _saved_values
    from mxrec.saver.checkpoint import Saver
    model = Model("adagrad", admission=True, capacity=20_000)
    saver = Saver(sys.argv[1], max_to_keep=2)
    rng = np.random.default_rng(int(sys.argv[4]))
    expected = sys.argv[6]

    def save(sess, step, **kwargs):
        # What this step must restore to, written (atomically) before its save starts.
        np.savez(os.path.join(expected, "tmp.npz"), **_saved_values(sess, model))
        os.replace(os.path.join(expected, "tmp.npz"), os.path.join(expected, f"{step}.npz"))
        stale = os.path.join(expected, f"{step - 10}.npz")
        if os.path.exists(stale):
            os.remove(stale)
        saver.save(sess, step, **kwargs)

    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        start = int(sys.argv[5])
        if start:
            start = saver.restore(sess)
        step = start
        save(sess, step + 1); step += 1
        print("ready", flush=True)
        while True:
            # New IDs (never admitted) and IDs from a pool (admitted and trained).
            ids = np.concatenate([rng.integers(0, 2**40, size=2000), rng.integers(0, 4000, 1000)])
            sess.run(model.train, {model.ids: ids})
            step += 1
            save(sess, step, kind="full" if step % 3 == 0 else "delta")
""")


def _saved_values(sess, model):
    """The trained state a save at this step holds: admitted IDs, their rows' values, the
    dense weight."""
    ids, rows = model.table.export_rows()
    order = np.argsort(ids)
    return {"ids": ids[order], "emb": sess.run(model.table.variable)[rows[order]],
            "w": sess.run(model.weight)}


def test_killed_during_save_leaves_a_loadable_version(tmp_path):
    """SIGKILL at random moments while saving: the newest complete version always loads, and
    it holds exactly the values the killed process had at that step."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    rng = np.random.default_rng(1)
    last_step = 0
    expected = tmp_path / "expected"
    expected.mkdir()
    checkpoints = tmp_path / "ckpt"
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILL_SCRIPT, str(checkpoints), REPO,
             os.path.dirname(__file__), str(attempt), str(last_step), str(expected)],
            stdout=subprocess.PIPE, env=env)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(float(rng.uniform(0.2, 1.5)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with tf.Graph().as_default():
            model = Model("adagrad", admission=True, capacity=20_000)
            saver = Saver(str(checkpoints))
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                step = saver.restore(sess)
                got = _saved_values(sess, model)
            terminate_config_initializer()
        assert step >= last_step
        want = np.load(expected / f"{step}.npz")
        assert len(want["ids"]) > 0 or step == 1
        for name in ("ids", "emb", "w"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"step {step}: {name}")
        last_step = step


def test_incremental_hook_saves_and_resumes(tmp_path):
    batches = _batches()
    with tf.Graph().as_default():
        model = Model("lazy_adam")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(model.train, global_step.assign_add(1))
        hook = IncrementalCheckpointHook(str(tmp_path), save_checkpoint_due_time=3600,
                                         save_delta_checkpoints_secs=1e-9)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            for batch in batches[:5]:
                sess.run(train, {model.ids: batch})
        kinds = [kind for kind, _ in Saver(str(tmp_path)).versions()]
        terminate_config_initializer()
    assert kinds[0] == "full" and kinds.count("delta") >= 4
    with tf.Graph().as_default():
        model = Model("lazy_adam")
        tf.compat.v1.train.get_or_create_global_step()
        hook = IncrementalCheckpointHook(str(tmp_path), save_delta_checkpoints_secs=3600)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]):
            assert hook.restored_step == 5
            assert model.table.stats()["rows_in_use"] > 0
        terminate_config_initializer()


def test_delta_checkpoint_updates_a_serving_export(tmp_path):
    """Export at a full save, then apply a later delta: the export serves the newer rows."""
    from mxrec.export import saved_model as serving
    from mxrec.saver import sparse

    batches = _batches()
    with tf.Graph().as_default():
        model = Model("adagrad", admission=True)
        saver = Saver(str(tmp_path / "mxrec"))
        tf_saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            model.run(sess, batches[:4], 0)
            saver.save(sess, 4)
            checkpoint = tf_saver.save(sess, str(tmp_path / "tf" / "model"))
            model.run(sess, batches[4:9], 4)
            saver.save(sess, 9, kind="delta")
            live = sparse.export(session=sess)["user"]
        delta = saver.serving_delta(9)
        terminate_config_initializer()

    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        table = create_table(tf.int64, 4, "user", tf.compat.v1.zeros_initializer(),
                             device_vocabulary_size=64)
        return {"ids": ids}, {"emb": sparse_lookup(table, ids, is_train=False)}

    with tf.Graph().as_default():
        export_dir = serving.export_saved_model(str(tmp_path / "export"), checkpoint, build)
    updated = serving.apply_delta(export_dir, delta, str(tmp_path / "export2"))
    served = serving.exported_tables(updated)["user"]
    want = dict(zip(live["ids"].tolist(), live["embeddings"]))
    got = dict(zip(served["ids"].tolist(), served["embeddings"]))
    assert sorted(got) == sorted(want)
    for key, row in want.items():
        np.testing.assert_allclose(got[key], row, atol=1e-6)


def test_save_persistables_one_saver_per_graph_and_directory(tmp_path):
    from mxrec.saver.checkpoint import save_persistables

    with tf.Graph().as_default() as graph:
        model = Model()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            model.run(sess, _batches()[:2], 0)
            save_persistables(sess, str(tmp_path / "a"), mode=0, step=2)
            ops = len(graph.get_operations())
            model.run(sess, _batches()[2:4], 2)
            save_persistables(sess, str(tmp_path / "a"), mode=2, step=4)  # the same Saver
            assert len(graph.get_operations()) == ops
            want = model.snapshot(sess)
        terminate_config_initializer()
    # A second graph saving into the same directory gets a Saver of its own (not the first
    # graph's, whose ops its session cannot run).
    with tf.Graph().as_default():
        model = Model()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            Saver(str(tmp_path / "a")).restore(sess)
            _assert_same_model(model.snapshot(sess), want)
            model.run(sess, _batches()[4:6], 4)
            save_persistables(sess, str(tmp_path / "a"), mode=0, step=6)
            save_persistables(sess, str(tmp_path / "a"), mode=2, step=7)
            want = model.snapshot(sess)
        terminate_config_initializer()
    with tf.Graph().as_default():
        model = Model()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert Saver(str(tmp_path / "a")).restore(sess) == 7
            _assert_same_model(model.snapshot(sess), want)
        terminate_config_initializer()


def test_save_persistables_and_restore_on_a_finalized_graph(tmp_path):
    from mxrec.saver.checkpoint import save_persistables

    with tf.Graph().as_default() as graph:
        model = Model("lazy_adam")
        step = tf.compat.v1.train.get_or_create_global_step()
        advance = step.assign_add(1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            graph.finalize()
            model.run(sess, _batches()[:3], 0)
            sess.run(advance)
            assert save_persistables(sess, str(tmp_path), mode=1).endswith("full-000000000001")
            model.run(sess, _batches()[3:6], 3)
            sess.run(advance)
            save_persistables(sess, str(tmp_path), mode=2)
            want = model.snapshot(sess)
            # Restoring on the finalized graph too: back to the save, then on.
            model.run(sess, _batches()[6:8], 6)
            assert Saver(str(tmp_path)).restore(sess) == 2
            _assert_same_model(model.snapshot(sess), want)
        terminate_config_initializer()
    with tf.Graph().as_default():
        model = Model("lazy_adam")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert Saver(str(tmp_path)).restore(sess) == 2
            _assert_same_model(model.snapshot(sess), want)
        terminate_config_initializer()


def test_saver_warns_about_tables_of_another_graph(tmp_path):
    init()
    with tf.Graph().as_default():
        create_table(tf.int64, 4, "elsewhere", tf.compat.v1.zeros_initializer(),
                     device_vocabulary_size=8)
    here = create_table(tf.int64, 4, "here", tf.compat.v1.zeros_initializer(),
                        device_vocabulary_size=8)
    sparse_lookup(here, tf.constant([1], tf.int64))
    with pytest.warns(UserWarning, match=r"\['elsewhere'\].*another graph"):
        saver = Saver(str(tmp_path))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.save(sess, 1)
    assert list(saver._read_version("full", 1)[0]["tables"]) == ["here"]


def test_saver_finds_a_table_that_a_later_graph_rebuilt(tmp_path):
    """Paddle's train and test programs (and an Estimator's graphs) build one table twice:
    the Saver of the first graph still saves it."""
    init()
    train_graph = tf.compat.v1.get_default_graph()
    table = create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                         device_vocabulary_size=8)
    emb = sparse_lookup(table, tf.constant([5, 6], tf.int64))
    with tf.Graph().as_default():
        create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer(),
                     device_vocabulary_size=8)
    with train_graph.as_default():
        saver = Saver(str(tmp_path))
    with tf.compat.v1.Session(graph=train_graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(emb)
        saver.save(sess, 1)
    assert saver._read_version("full", 1)[0]["tables"]["t"]["ids"] == 2


def test_last_seen_times_past_float64_come_back_exact(tmp_path):
    """The engine keeps any int64 time exactly; a restore must too (times past 2**53 are
    not float64 integers)."""
    from mxrec._lib import loader

    base = 2**62 + 12_344
    states = []
    for restore in (False, True):
        with tf.Graph().as_default():
            model = Model("adagrad")
            saver = Saver(str(tmp_path))
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                if restore:
                    saver.restore(sess)
                else:
                    for i, batch in enumerate(_batches()[:4]):
                        sess.run(model.train, {model.ids: batch, model.time: base + 2 * i + 1})
                    saver.save(sess, 4)
                states.append(loader.engine().export_state(model.table.table_key, 0))
            terminate_config_initializer()
    want, got = states
    assert want["last_seen"].max() > 2**53 and (want["last_seen"] % 2 == 1).all()
    for field in ("keys", "rows", "counts", "last_seen"):
        np.testing.assert_array_equal(got[field], want[field])

"""WarmStart of mxrec tables and dense variables: by name, regex, list, multi-path, Estimator."""

import numpy as np
import pytest
import tensorflow as tf
from support import needs_estimator

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers.lazy_adam import create_hash_optimizer
from mxrec.saver import sparse
from mxrec.saver.warm_start import WarmStart, from_settings, warm_start, warm_start_model_fn
from mxrec.util import initialize
from mxrec.util.variable import get_dense_and_sparse_variable

TABLES = {"user_table": 4, "item_table": 3, "ctx_table": 2}
VOCAB = 48
DENSE = ("mlp_layer_w", "mlp_layer_b", "other_w")


def _model(features):
    """Three tables, a dense layer; returns (loss, train_op)."""
    init = tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=4)
    tables = {n: create_table(tf.int64, d, n, init, device_vocabulary_size=VOCAB)
              for n, d in TABLES.items()}
    embs = [tf.reshape(sparse_lookup(tables[n], features[n]), [-1, 2 * d])
            for n, d in TABLES.items()]
    x = tf.concat(embs, axis=1)
    width = 2 * sum(TABLES.values())
    w = tf.compat.v1.get_variable("mlp_layer_w", [width, 1],
                                  initializer=tf.compat.v1.glorot_uniform_initializer(seed=5))
    b = tf.compat.v1.get_variable("mlp_layer_b", [1], initializer=tf.zeros_initializer())
    other = tf.compat.v1.get_variable("other_w", [1], initializer=tf.ones_initializer())
    logits = tf.reshape(tf.matmul(x, w) + b, [-1]) * other
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=features["label"], logits=logits))
    dense, sparse_vars = get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse_vars)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            zip(grads[:len(dense)], dense), global_step=global_step),
        create_hash_optimizer(0.05).apply_gradients(zip(grads[len(dense):], sparse_vars)))
    return loss, train_op


def _batch(rng, size=12):
    batch = {n: rng.integers(0, 25, size=[size, 2]).astype(np.int64) * 3 + i
             for i, n in enumerate(TABLES)}
    batch["label"] = rng.integers(0, 2, size=[size]).astype(np.float32)
    return batch


def _placeholders():
    holders = {n: tf.compat.v1.placeholder(tf.int64, [None, 2], name=f"{n}_ids") for n in TABLES}
    holders["label"] = tf.compat.v1.placeholder(tf.float32, [None], name="label")
    return holders


def _train(sess, holders, train_op, seed, steps=4):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        sess.run(train_op, {holders[k]: v for k, v in _batch(rng).items()})


def _make_checkpoint(directory, seed):
    initialize.init()
    try:
        with tf.Graph().as_default():
            holders = _placeholders()
            _, train_op = _model(holders)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                _train(sess, holders, train_op, seed)
                return tf.compat.v1.train.Saver().save(sess, str(directory / "model"))
    finally:
        initialize.terminate_config_initializer()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three checkpoints of the model trained on different data."""
    return [_make_checkpoint(tmp_path_factory.mktemp(f"ws_{i}"), seed=10 + i) for i in range(3)]


def _state(checkpoint):
    """Per table {field: ...} keyed by ID where per-ID, plus dense variables, from a checkpoint."""
    reader = tf.train.load_checkpoint(checkpoint)
    out = {}
    for name in TABLES:
        keys = reader.get_tensor(f"{name}/mxrec_host/keys")
        per_id = {}
        for field in ("rows", "counts", "last_seen"):
            values = reader.get_tensor(f"{name}/mxrec_host/{field}")
            per_id[field] = dict(zip(keys.tolist(), values.tolist()))
        table = reader.get_tensor(name)
        per_id["emb"] = {k: table[r].tolist() for k, r in per_id["rows"].items() if r >= 0}
        for slot in ("LazyAdam", "LazyAdam_1"):
            values = reader.get_tensor(f"{name}/{slot}")
            per_id[slot] = {k: values[r].tolist() for k, r in per_id["rows"].items() if r >= 0}
        per_id["free_rows"] = sorted(reader.get_tensor(f"{name}/mxrec_host/free_rows").tolist())
        per_id["meta"] = reader.get_tensor(f"{name}/mxrec_host/meta").tolist()
        per_id["threshold"] = float(reader.get_tensor(f"{name}/mxrec_host/threshold"))
        out[name] = per_id
    for name in DENSE:
        out[name] = reader.get_tensor(name).tolist()
    return out


@pytest.fixture
def target(mx, make_session, tmp_path):
    """A graph of the same model trained on other data; returns (sess, snapshot_fn, before)."""
    mx()
    holders = _placeholders()
    _, train_op = _model(holders)
    sess = make_session()
    _train(sess, holders, train_op, seed=99, steps=2)
    saver = tf.compat.v1.train.Saver()
    counter = iter(range(100))

    def snapshot():
        return _state(saver.save(sess, str(tmp_path / f"snap_{next(counter)}")))

    return sess, snapshot, snapshot()


def _assert_loaded(after, expected_by_name):
    for name, expected in expected_by_name.items():
        assert after[name] == expected, name


def test_warm_start_by_table_name(target, sources):
    sess, snapshot, before = target
    ws = warm_start(sources[0], "user_table", session=sess)
    after = snapshot()
    src = _state(sources[0])
    assert ws.entries == [(sources[0], ["user_table"], [])]
    _assert_loaded(after, {"user_table": src["user_table"], "item_table": before["item_table"],
                           "ctx_table": before["ctx_table"],
                           **{d: before[d] for d in DENSE}})
    assert src["user_table"] != before["user_table"]


def test_warm_start_by_regex_and_dense_by_regex(target, sources):
    sess, snapshot, before = target
    warm_start(sources[1], "(user|ctx)_table", session=sess)
    warm_start(sources[2], "mlp_layer_.*", session=sess)
    after = snapshot()
    s1, s2 = _state(sources[1]), _state(sources[2])
    _assert_loaded(after, {"user_table": s1["user_table"], "ctx_table": s1["ctx_table"],
                           "item_table": before["item_table"],
                           "mlp_layer_w": s2["mlp_layer_w"], "mlp_layer_b": s2["mlp_layer_b"],
                           "other_w": before["other_w"]})


def test_table_regex_matches_whole_names_only(mx, sources):
    mx()
    _model(_placeholders())
    with pytest.raises(ValueError, match="'user' .* matches no mxrec table"):
        WarmStart(sources[0], "user")
    assert WarmStart(sources[0], "user_.*").entries == [(sources[0], ["user_table"], [])]
    # A str chooses trainable dense variables only (TF's rule); a list any global one.
    assert WarmStart(sources[0], ".*").entries[0][2] == sorted(DENSE)
    assert "global_step" in WarmStart(sources[0], [".*"]).entries[0][2]


def test_warm_start_by_list(target, sources):
    sess, snapshot, before = target
    ws = warm_start(sources[0], ["item_table", "ctx_table", "other_w"], session=sess)
    assert ws.entries == [(sources[0], ["ctx_table", "item_table"], ["other_w"])]
    after = snapshot()
    src = _state(sources[0])
    _assert_loaded(after, {"item_table": src["item_table"], "ctx_table": src["ctx_table"],
                           "user_table": before["user_table"], "other_w": src["other_w"],
                           "mlp_layer_w": before["mlp_layer_w"],
                           "mlp_layer_b": before["mlp_layer_b"]})


def test_multi_path_later_entries_override_earlier(target, sources):
    """The seed's 示例2: all from 1, two tables from 2, mlp_layer_w from 3."""
    sess, snapshot, _ = target
    ws = warm_start(sources, [".*", ["user_table", "item_table"], "mlp_layer_w"],
                    var_name_to_prev_var_name=[{}, {}, {}], session=sess)
    s = [_state(p) for p in sources]
    assert [e[1] for e in ws.entries] == [sorted(TABLES), ["item_table", "user_table"], []]
    after = snapshot()
    _assert_loaded(after, {"user_table": s[1]["user_table"], "item_table": s[1]["item_table"],
                           "ctx_table": s[0]["ctx_table"], "mlp_layer_w": s[2]["mlp_layer_w"],
                           "mlp_layer_b": s[0]["mlp_layer_b"], "other_w": s[0]["other_w"]})


def test_warm_started_model_keeps_training(target, sources):
    """Host state came with the rows: known IDs keep their rows and new IDs get free ones."""
    sess, _, _ = target
    warm_start(sources[0], ".*", session=sess)
    runtime = initialize.get_config_initializer()
    before = {n: dict(zip(*[a.tolist() for a in t.export_rows()]))
              for n, t in runtime.tables.items()}
    graph = sess.graph
    train_op = [op for op in graph.get_operations() if op.type == "NoOp" and
                op.name.startswith("group_deps")][0]
    holders = {n: graph.get_tensor_by_name(f"{n}_ids:0") for n in TABLES}
    holders["label"] = graph.get_tensor_by_name("label:0")
    _train(sess, holders, train_op, seed=10, steps=1)  # the source's first batch: known IDs
    after = {n: dict(zip(*[a.tolist() for a in t.export_rows()]))
             for n, t in runtime.tables.items()}
    assert after == before


def test_dense_renamed_with_prev_var_name(target, sources):
    sess, snapshot, before = target
    warm_start(sources[0], ["other_w"], var_name_to_prev_var_name={"other_w": "mlp_layer_b"},
               session=sess)
    after = snapshot()
    assert after["other_w"] == _state(sources[0])["mlp_layer_b"]
    assert after["mlp_layer_b"] == before["mlp_layer_b"]


def test_errors(target, sources, tmp_path):
    sess, snapshot, before = target
    with pytest.raises(ValueError, match="matches no mxrec table and no variable"):
        WarmStart(sources[0], ["user_table", "no_such_table"])
    with pytest.raises(ValueError, match="list of 2 entries"):
        WarmStart(sources[:2], "user_table")
    with pytest.raises(ValueError, match="cannot be renamed"):
        WarmStart(sources[0], ["user_table"], var_name_to_prev_var_name={"user_table": "x"})
    with pytest.raises(ValueError, match="var_name_to_vocab_info is not supported"):
        WarmStart(sources[0], ["user_table"], var_name_to_vocab_info={"user_table": object()})
    with pytest.raises(TypeError, match="vars_to_warm_start must be"):
        WarmStart(sources[0], [1, 2])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no checkpoint"):
        WarmStart(str(tmp_path / "empty"), "user_table")
    with pytest.raises(ValueError, match="no checkpoint at"):
        WarmStart(str(tmp_path / "nothing"), "user_table")
    assert snapshot() == before  # nothing ran


def test_missing_table_in_checkpoint_names_table_and_checkpoint(mx, make_session, sources):
    mx()
    holders = _placeholders()
    _model(holders)
    extra = create_table(tf.int64, 2, "new_table", tf.zeros_initializer(),
                         device_vocabulary_size=8)
    sparse_lookup(extra, holders["user_table"])
    sess = make_session()
    with pytest.raises(ValueError, match=r"table 'new_table' is not in checkpoint .*ws_0"):
        warm_start(sources[0], ".*", session=sess)
    with pytest.raises(ValueError, match="'new_table' is not in checkpoint"):
        WarmStart(sources[0], "new_table")


def test_shape_mismatch_is_an_error(mx, sources):
    mx()
    create_table(tf.int64, 4, "user_table", tf.zeros_initializer(), device_vocabulary_size=7)
    with pytest.raises(ValueError, match=r"shape \[7, 4\] in the graph but \[48, 4\]"):
        WarmStart(sources[0], "user_table")


def test_scaffold_init_fn_in_monitored_session(mx, sources):
    mx()
    holders = _placeholders()
    _model(holders)
    ws = WarmStart(sources[1], ["ctx_table"])
    scaffold = tf.compat.v1.train.Scaffold(init_fn=ws.init_fn)
    with tf.compat.v1.train.MonitoredSession(
            tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold)) as sess:
        got = sparse.export(["ctx_table"], session=sess._tf_sess())
    want = sparse.export(["ctx_table"], checkpoint=sources[1])
    np.testing.assert_array_equal(got["ctx_table"]["ids"], want["ctx_table"]["ids"])
    np.testing.assert_array_equal(got["ctx_table"]["embeddings"], want["ctx_table"]["embeddings"])


def test_from_settings_accepts_paths_and_settings_like_objects(mx, sources):
    mx()
    _model(_placeholders())

    class Settings:
        ckpt_to_initialize_from = sources
        vars_to_warm_start = ["user_table", "item_table", "ctx_table"]
        var_name_to_vocab_info = [{}, {}, {}]
        var_name_to_prev_var_name = None

    assert [e[1] for e in from_settings(Settings()).entries] == [[n] for n in TABLES]
    Settings.vars_to_warm_start = ["user_table", "item_table"]
    with pytest.raises(ValueError, match="list of 3 entries"):
        from_settings(Settings())
    Settings.vars_to_warm_start = ["user_table"] * 3
    assert [e[1] for e in from_settings(Settings()).entries] == [["user_table"]] * 3
    assert [e[1] for e in from_settings(sources[0]).entries] == [sorted(TABLES)]
    with pytest.raises(TypeError, match="WarmStartSettings"):
        from_settings(3)


def _input_fn(seed, steps):
    def fn():
        rng = np.random.default_rng(seed)
        batches = [_batch(rng) for _ in range(steps)]
        data = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        labels = data.pop("label")
        return tf.data.Dataset.from_tensor_slices((data, labels)).batch(12)
    return fn


def _estimator_model_fn(features, labels, mode):
    features = dict(features, label=labels)
    loss, train_op = _model(features)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class _Capture(tf.compat.v1.train.SessionRunHook):
    """Reads the tables and a dense variable right after the session is created."""

    def __init__(self):
        self.tables = None
        self.dense = None
        self._variable = None

    def begin(self):
        self._variable, = [v for v in tf.compat.v1.global_variables()
                           if v.op.name == "mlp_layer_w"]

    def after_create_session(self, session, coord):
        del coord
        self.tables = sparse.export(session=session)
        self.dense = session.run(self._variable)


@needs_estimator
def test_estimator_warm_start_multi_path_and_resume(mx, sources, tmp_path):
    mx()
    settings = tf.estimator.WarmStartSettings(
        ckpt_to_initialize_from=sources,
        vars_to_warm_start=[".*", ["user_table", "item_table"], "mlp_layer_w"],
        var_name_to_vocab_info=None, var_name_to_prev_var_name=[{}, {}, {}])
    estimator = tf.estimator.Estimator(
        warm_start_model_fn(_estimator_model_fn, settings), model_dir=str(tmp_path / "est"),
        config=tf.estimator.RunConfig(tf_random_seed=1, log_step_count_steps=None))
    first = _Capture()
    estimator.train(_input_fn(seed=5, steps=2), hooks=[first])
    want = {n: sparse.export([n], checkpoint=sources[i])[n]
            for n, i in (("user_table", 1), ("item_table", 1), ("ctx_table", 0))}
    for name, arrays in want.items():
        np.testing.assert_array_equal(first.tables[name]["ids"], arrays["ids"])
        np.testing.assert_array_equal(first.tables[name]["embeddings"], arrays["embeddings"])
    np.testing.assert_array_equal(first.dense,
                                  tf.train.load_checkpoint(sources[2]).get_tensor("mlp_layer_w"))

    # Resuming from model_dir restores the Estimator's own checkpoint, not the warm start.
    own = sparse.export(checkpoint=str(tmp_path / "est"))
    second = _Capture()
    estimator.train(_input_fn(seed=6, steps=1), hooks=[second])
    for name in TABLES:
        np.testing.assert_array_equal(second.tables[name]["ids"], own[name]["ids"])
        np.testing.assert_array_equal(second.tables[name]["embeddings"], own[name]["embeddings"])


@needs_estimator
def test_estimator_wrapper_keeps_user_scaffold_init_fn(mx, sources, tmp_path):
    mx()
    calls = []

    def model_fn(features, labels, mode, params):
        del params
        spec = _estimator_model_fn(features, labels, mode)
        return spec._replace(scaffold=tf.compat.v1.train.Scaffold(
            init_fn=lambda scaffold, sess: calls.append("user")))

    settings = tf.estimator.WarmStartSettings(sources[0], ["ctx_table"])
    estimator = tf.estimator.Estimator(warm_start_model_fn(model_fn, settings),
                                       model_dir=str(tmp_path / "est"), params={"a": 1})
    capture = _Capture()
    estimator.train(_input_fn(seed=5, steps=1), hooks=[capture])
    assert calls == ["user"]
    np.testing.assert_array_equal(capture.tables["ctx_table"]["ids"],
                                  sparse.export(["ctx_table"], checkpoint=sources[0])
                                  ["ctx_table"]["ids"])

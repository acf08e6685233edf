"""sparse.export, the serving SavedModel (core ops only, loads without mxrec) and apply_delta."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.export import saved_model as serving
from mxrec.optimizers.lazy_adam import create_hash_optimizer
from mxrec.saver import sparse
from mxrec.util.variable import get_dense_and_sparse_variable

DIMS = {"user_table": 4, "item_table": 3}
VOCAB = 64
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(ids, is_train):
    """Two tables and a two-layer net. Returns (tables, logits [B], user [B, 2, 4], item [B, 3])."""
    init = tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=1)
    tables = {name: create_table(tf.int64, dim, name, init, device_vocabulary_size=VOCAB)
              for name, dim in DIMS.items()}
    user = sparse_lookup(tables["user_table"], ids["user"], is_train=is_train)  # [B, 2, 4]
    item = sparse_lookup(tables["item_table"], ids["item"], is_train=is_train)  # [B, 3]
    x = tf.concat([tf.reshape(user, [-1, 2 * DIMS["user_table"]]), item], axis=1)
    return tables, _mlp(x), user, item


def _dense(x, units, name, seed):
    kernel = tf.compat.v1.get_variable(
        f"{name}/kernel", [x.shape[1], units],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
    bias = tf.compat.v1.get_variable(f"{name}/bias", [units], initializer=tf.zeros_initializer())
    return tf.matmul(x, kernel) + bias


def _mlp(x):
    """x [B, 11] -> logits [B]; one set of variables however often it is called."""
    with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
        hidden = tf.nn.relu(_dense(x, 8, "hidden", seed=2))
        return tf.reshape(_dense(hidden, 1, "out", seed=3), [-1])


def _placeholders():
    return {"user": tf.compat.v1.placeholder(tf.int64, [None, 2], name="user_ids"),
            "item": tf.compat.v1.placeholder(tf.int64, [None], name="item_ids")}


def _train_batches(steps=6, batch=16, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield (rng.integers(0, 40, size=[batch, 2]) * 7 + 3,
               rng.integers(0, 30, size=[batch]) * 11 - 5,
               rng.integers(0, 2, size=[batch]).astype(np.float32))


@pytest.fixture
def trained(mx, make_session, tmp_path):
    """A model trained a few steps and saved; returns (sess, tables, fetches, ckpt)."""
    mx()
    ids = _placeholders()
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    tables, logits, _, _ = _model(ids, is_train=True)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    dense, sparse_vars = get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense + sparse_vars)
    train_op = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.05).apply_gradients(zip(grads[:len(dense)], dense)),
        create_hash_optimizer(0.05).apply_gradients(zip(grads[len(dense):], sparse_vars)))
    _, eval_logits = _model_eval(ids)
    sess = make_session()
    for user, item, label in _train_batches():
        sess.run(train_op, {ids["user"]: user, ids["item"]: item, labels: label})
    ckpt = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "ckpt" / "model"), global_step=6)
    return sess, tables, ids, eval_logits, ckpt


def _model_eval(ids):
    """The same net on is_train=False lookups (tables already created: reuse them)."""
    from mxrec.util.initialize import get_config_initializer

    runtime = get_config_initializer()
    user = sparse_lookup(runtime.tables["user_table"], ids["user"], is_train=False,
                         name="user_eval")
    item = sparse_lookup(runtime.tables["item_table"], ids["item"], is_train=False,
                         name="item_eval")
    x = tf.concat([tf.reshape(user, [-1, 2 * DIMS["user_table"]]), item], axis=1)
    return None, _mlp(x)


def _build_serving():
    ids = _placeholders()
    _, logits, user, item = _model(ids, is_train=False)
    return ids, {"prob": tf.sigmoid(logits), "logits": logits, "user_emb": user,
                 "item_emb": item}


def _query_batch(tables):
    """Known IDs of each table, unseen ones and a mix, [B, 2] and [B]."""
    known_user = tables["user_table"].export_rows()[0]
    known_item = tables["item_table"].export_rows()[0]
    user = np.stack([known_user[:6], np.array([10**12, -8, known_user[0], 10**12 + 1,
                                               known_user[1], -9])], axis=1)
    item = np.array([known_item[0], 999_999, known_item[2], known_item[3], -1234, known_item[1]])
    return user.astype(np.int64), item.astype(np.int64)


_LOADER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    export_dir, use_v2 = sys.argv[1], sys.argv[4] == "1"
    user = np.array(json.loads(sys.argv[2]), np.int64)
    item = np.array(json.loads(sys.argv[3]), np.int64)
    if use_v2:
        model = tf.saved_model.load(export_dir)
        fn = model.signatures["serving_default"]
        out = fn(user=tf.constant(user), item=tf.constant(item))
        logits = out["logits"].numpy()
        op_types = sorted({op.type for op in fn.graph.get_operations()})
    else:
        tf.compat.v1.disable_eager_execution()
        with tf.compat.v1.Session(graph=tf.Graph()) as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
            sig = meta.signature_def["serving_default"]
            logits = sess.run(sig.outputs["logits"].name, {sig.inputs["user"].name: user,
                                                           sig.inputs["item"].name: item})
            op_types = sorted({n.op for n in meta.graph_def.node})
    print(json.dumps({"logits": logits.tolist(), "op_types": op_types,
                      "mxrec_loaded": any(m.startswith("mxrec") for m in sys.modules)}))
""")


def _predict_in_fresh_process(export_dir, user, item, use_v2):
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", _LOADER, str(export_dir), json.dumps(user.tolist()),
         json.dumps(item.tolist()), "1" if use_v2 else "0"],
        env=env, capture_output=True, text=True, timeout=120, cwd=str(export_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_sparse_export_live_and_from_checkpoint(trained):
    sess, tables, _, _, ckpt = trained
    live = sparse.export(session=sess)
    offline = sparse.export(checkpoint=ckpt)
    assert sorted(live) == sorted(offline) == sorted(DIMS)
    for name, table in tables.items():
        ids, rows = table.export_rows()
        values = sess.run(table.variable)
        np.testing.assert_array_equal(live[name]["ids"], ids)
        np.testing.assert_array_equal(live[name]["embeddings"], values[rows])
        np.testing.assert_array_equal(offline[name]["ids"], ids)
        np.testing.assert_array_equal(offline[name]["embeddings"], values[rows])
        assert live[name]["embeddings"].dtype == np.float32
        assert live[name]["embeddings"].shape == (len(ids), DIMS[name])
    only = sparse.export([tables["item_table"]], session=sess)
    assert list(only) == ["item_table"]
    with sess.as_default():
        assert list(sparse.export("user_table")) == ["user_table"]
    # A checkpoint directory means its latest checkpoint.
    by_dir = sparse.export(["user_table"], checkpoint=os.path.dirname(ckpt))
    np.testing.assert_array_equal(by_dir["user_table"]["ids"], offline["user_table"]["ids"])


def test_sparse_export_errors(trained, tmp_path):
    sess, _, _, _, ckpt = trained
    with pytest.raises(ValueError, match="no table named"):
        sparse.export(["nope"], session=sess)
    with pytest.raises(ValueError, match="'nope' is not in checkpoint"):
        sparse.export(["nope"], checkpoint=ckpt)
    with pytest.raises(ValueError, match="either session or checkpoint"):
        sparse.export(session=sess, checkpoint=ckpt)
    with pytest.raises(ValueError, match="no default session"):
        sparse.export()
    with pytest.raises(ValueError, match="holds no checkpoint"):
        sparse.export(checkpoint=str(tmp_path))
    with pytest.raises(TypeError, match="tables or table names"):
        sparse.export([3], session=sess)


def test_saved_model_serves_without_mxrec(trained, tmp_path):
    sess, tables, ids, eval_logits, ckpt = trained
    user, item = _query_batch(tables)
    expected = sess.run(eval_logits, {ids["user"]: user, ids["item"]: item})
    export_dir = serving.export_saved_model(str(tmp_path / "export" / "1"), ckpt, _build_serving)
    # The training process's tables are untouched by the export.
    assert sess.run(eval_logits, {ids["user"]: user, ids["item"]: item}).tolist() == \
        expected.tolist()

    for use_v2 in (False, True):
        got = _predict_in_fresh_process(export_dir, user, item, use_v2)
        assert not got["mxrec_loaded"]
        assert not [t for t in got["op_types"] if t.startswith("Mxrec")], got["op_types"]
        assert "HashTableV2" in got["op_types"] or use_v2
        np.testing.assert_allclose(got["logits"], expected, atol=1e-6, rtol=0)

    exported = serving.exported_tables(export_dir)
    live = sparse.export(session=sess)
    for name in DIMS:
        np.testing.assert_array_equal(exported[name]["ids"], live[name]["ids"])
        np.testing.assert_array_equal(exported[name]["embeddings"], live[name]["embeddings"])


def test_unseen_ids_look_up_as_zeros_in_process(trained, tmp_path):
    _, tables, _, _, ckpt = trained
    export_dir = serving.export_saved_model(str(tmp_path / "e"), ckpt, _build_serving)
    known = tables["item_table"].export_rows()[0]
    values = serving.exported_tables(export_dir)["item_table"]
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        emb = meta.signature_def["serving_default"].outputs["item_emb"].name
        got = sess.run(emb, {"item_ids:0": np.array([known[1], 77777, known[0]], np.int64),
                             "user_ids:0": np.zeros([3, 2], np.int64)})
    np.testing.assert_array_equal(got[0], values["embeddings"][1])
    np.testing.assert_array_equal(got[1], np.zeros(DIMS["item_table"], np.float32))
    np.testing.assert_array_equal(got[2], values["embeddings"][0])


def test_serving_default_value_in_the_export(trained, tmp_path):
    """sparse_lookup(serving_default_value=...) gives unseen IDs that value when serving."""
    _, tables, _, _, ckpt = trained
    default = np.array([0.5, -0.5, 2.0], np.float32)

    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="item_ids")
        table = create_table(tf.int64, DIMS["item_table"], "item_table",
                             tf.zeros_initializer(), device_vocabulary_size=VOCAB)
        return {"item": ids}, {"emb": sparse_lookup(table, ids, is_train=False,
                                                    serving_default_value=default)}

    export_dir = serving.export_saved_model(str(tmp_path / "e"), ckpt, build)
    known = tables["item_table"].export_rows()[0]
    values = serving.exported_tables(export_dir)["item_table"]
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        emb = meta.signature_def["serving_default"].outputs["emb"].name
        got = sess.run(emb, {"item_ids:0": np.array([known[1], 77777], np.int64)})
    np.testing.assert_array_equal(got[0], values["embeddings"][1])
    np.testing.assert_array_equal(got[1], default)


def test_apply_delta_changes_exactly_the_intended_rows(trained, tmp_path):
    sess, tables, _, _, ckpt = trained
    export_dir = serving.export_saved_model(str(tmp_path / "1"), ckpt, _build_serving)
    before = serving.exported_tables(export_dir)
    user = before["user_table"]
    changed, removed = user["ids"][[1, 4]], user["ids"][[0, 7]]
    new_ids = np.array([5_000_001, 5_000_002], np.int64)
    delta_emb = np.arange(16, dtype=np.float32).reshape(4, 4) / 10
    delta = {"user_table": {"ids": np.concatenate([changed, new_ids]), "embeddings": delta_emb,
                            "removed": removed}}
    out = serving.apply_delta(export_dir, delta, str(tmp_path / "2"))
    after = serving.exported_tables(out)

    np.testing.assert_array_equal(after["item_table"]["ids"], before["item_table"]["ids"])
    np.testing.assert_array_equal(after["item_table"]["embeddings"],
                                  before["item_table"]["embeddings"])
    expect = {int(k): row for k, row in zip(user["ids"], user["embeddings"])}
    for k in removed:
        del expect[int(k)]
    for k, row in zip(np.concatenate([changed, new_ids]), delta_emb):
        expect[int(k)] = row
    got = {int(k): row for k, row in zip(after["user_table"]["ids"],
                                          after["user_table"]["embeddings"])}
    assert sorted(got) == sorted(expect)
    for k in expect:
        np.testing.assert_array_equal(got[k], expect[k])

    # The new export serves the delta: changed and new rows, zeros for the removed IDs.
    with tf.compat.v1.Session(graph=tf.Graph()) as s:
        meta = tf.compat.v1.saved_model.loader.load(s, ["serve"], out)
        emb = meta.signature_def["serving_default"].outputs["user_emb"].name
        query = np.array([[changed[0], new_ids[1]], [removed[0], user["ids"][2]]], np.int64)
        rows = s.run(emb, {"user_ids:0": query, "item_ids:0": np.zeros([2], np.int64)})
    np.testing.assert_array_equal(rows[0, 0], delta_emb[0])
    np.testing.assert_array_equal(rows[0, 1], delta_emb[3])
    np.testing.assert_array_equal(rows[1, 0], np.zeros(4, np.float32))
    np.testing.assert_array_equal(rows[1, 1], user["embeddings"][2])
    # Dense variables are carried over unchanged.
    old_reader = tf.train.load_checkpoint(os.path.join(export_dir, "variables", "variables"))
    new_reader = tf.train.load_checkpoint(os.path.join(out, "variables", "variables"))
    np.testing.assert_array_equal(old_reader.get_tensor("mlp/hidden/kernel"),
                                  new_reader.get_tensor("mlp/hidden/kernel"))


def test_apply_delta_errors(trained, tmp_path):
    _, _, _, _, ckpt = trained
    export_dir = serving.export_saved_model(str(tmp_path / "1"), ckpt, _build_serving)
    with pytest.raises(ValueError, match="'nope' is not in export"):
        serving.apply_delta(export_dir, {"nope": {}}, str(tmp_path / "2"))
    with pytest.raises(ValueError, match=r"embeddings must be \[1, 4\]"):
        serving.apply_delta(export_dir, {"user_table": {"ids": np.array([1]),
                                                        "embeddings": np.zeros([1, 3])}},
                            str(tmp_path / "2"))
    with pytest.raises(ValueError, match="both changed and removed"):
        serving.apply_delta(export_dir, {"user_table": {"ids": np.array([1]),
                                                        "embeddings": np.zeros([1, 4]),
                                                        "removed": np.array([1])}},
                            str(tmp_path / "2"))
    with pytest.raises(ValueError, match="already exists"):
        serving.apply_delta(export_dir, {}, export_dir)
    assert not os.path.exists(tmp_path / "2")


def test_export_errors(trained, tmp_path):
    _, _, _, _, ckpt = trained
    with pytest.raises(ValueError, match="already exists"):
        serving.export_saved_model(str(tmp_path), ckpt, _build_serving)

    def other_table():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        table = create_table(tf.int64, 4, "other_table", tf.zeros_initializer(),
                             device_vocabulary_size=8)
        return {"ids": ids}, {"emb": sparse_lookup(table, ids)}

    with pytest.raises(ValueError, match="'other_table' is not in checkpoint"):
        serving.export_saved_model(str(tmp_path / "x"), ckpt, other_table)

    def bad_return():
        return tf.constant(1)

    with pytest.raises(TypeError, match=r"\(inputs, outputs\)"):
        serving.export_saved_model(str(tmp_path / "y"), ckpt, bad_return)


def test_not_in_serving_export_outside_export(mx):
    mx()
    assert not serving.in_serving_export()


def test_export_in_a_process_without_init(trained, tmp_path):
    """An offline export (no init() in force) works and leaves no init() behind."""
    sess, tables, ids, eval_logits, ckpt = trained
    user, item = _query_batch(tables)
    expected = sess.run(eval_logits, {ids["user"]: user, ids["item"]: item})
    from mxrec.util import initialize

    initialize.terminate_config_initializer()
    export_dir = serving.export_saved_model(str(tmp_path / "offline"), ckpt, _build_serving)
    assert not initialize.is_initialized()
    with tf.compat.v1.Session(graph=tf.Graph()) as s:
        meta = tf.compat.v1.saved_model.loader.load(s, ["serve"], export_dir)
        logits = s.run(meta.signature_def["serving_default"].outputs["logits"].name,
                       {"user_ids:0": user, "item_ids:0": item})
    np.testing.assert_allclose(logits, expected, atol=1e-6, rtol=0)

"""A model of one's own served by `python -m mxrec.serving`: `versions.export_version` runs
the export into a staging folder and publishes it with its manifest; the predictor serves
it as the training session scores, and still refuses what is not whole or not published."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.export.saved_model import export_saved_model
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.serving import versions
from mxrec.serving.predictor import Predictor
from mxrec.util.variable import get_dense_and_sparse_variable

DIM = 4


def _logits(ids, is_train):
    """ids [B, 2] -> logits [B]; one table, one dense layer."""
    table = create_table(tf.int64, DIM, "items",
                         tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=3),
                         device_vocabulary_size=256)
    emb = tf.reshape(sparse_lookup(table, ids, is_train=is_train), [-1, 2 * DIM])
    with tf.compat.v1.variable_scope("out", reuse=tf.compat.v1.AUTO_REUSE):
        w = tf.compat.v1.get_variable("w", [2 * DIM, 1],
                                      initializer=tf.compat.v1.glorot_uniform_initializer(4))
    return tf.reshape(tf.matmul(emb, w), [-1])


@pytest.fixture
def trained(mx, make_session, tmp_path):
    """(checkpoint prefix, query IDs [8, 2], the training session's eval probabilities)."""
    mx()
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    logits = _logits(ids, True)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                  logits=logits))
    dense, sparse = get_dense_and_sparse_variable()
    train = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
        create_hash_optimizer(0.1).apply_gradients(zip(tf.gradients(loss, sparse), sparse)))
    eval_prob = tf.sigmoid(_logits_eval(ids))
    sess = make_session()
    batch = np.random.default_rng(0).integers(-2**62, 2**62, size=[16, 2])
    for _ in range(5):
        sess.run(train, {ids: batch, labels: (batch[:, 0] % 2).astype(np.float32)})
    query = np.concatenate([batch[:6], [[7, 8], [-2**63, 2**63 - 1]]])  # 2 rows never seen
    expected = sess.run(eval_prob, {ids: query})
    prefix = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "ckpt" / "model"))
    return prefix, query, expected


def _logits_eval(ids):
    # The table of the training graph, looked up again without inserting or counting.
    from mxrec.core.table import graph_tables

    table = graph_tables(tf.compat.v1.get_default_graph())["items"]
    emb = tf.reshape(sparse_lookup(table, ids, is_train=False, name="eval"), [-1, 2 * DIM])
    with tf.compat.v1.variable_scope("out", reuse=True):
        w = tf.compat.v1.get_variable("w")
    return tf.reshape(tf.matmul(emb, w), [-1])


def _build():
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
    return {"ids": ids}, {"prob": tf.sigmoid(_logits(ids, False))}


def _export(prefix):
    return lambda folder: export_saved_model(folder, prefix, _build)


def test_an_exported_version_serves_as_the_session_scores(trained, tmp_path):
    prefix, query, expected = trained
    base = str(tmp_path / "serving")
    assert versions.export_version(base, _export(prefix)) == os.path.join(base, "1")
    manifest = versions.verify(os.path.join(base, "1"))
    assert manifest["kind"] == "full" and "saved_model.pb" in manifest["files"]
    assert versions.export_version(base, _export(prefix)) == os.path.join(base, "2")
    assert versions.export_version(base, _export(prefix), version=10) == os.path.join(base,
                                                                                      "10")
    assert sorted(os.listdir(base)) == ["1", "10", "2"]  # no staging folder left
    predictor = Predictor(base)
    assert predictor.poll() == 10
    outputs, version = predictor.predict({"ids": query})
    assert version == 10
    np.testing.assert_allclose(outputs["prob"], expected, atol=1e-6)
    assert outputs["prob"][-2] == pytest.approx(0.5)  # unseen IDs: zero rows, logit 0
    predictor.close()


def test_refusals_leave_the_base_as_it_was(trained, tmp_path):
    prefix, _, _ = trained
    base = tmp_path / "serving"
    versions.export_version(str(base), _export(prefix), version=3)
    with pytest.raises(ValueError, match="serving version 3 exists already"):
        versions.export_version(str(base), _export(prefix), version=3)
    for bad in (-1, True, "4", 2.0):
        with pytest.raises(ValueError, match="version must be an int >= 0"):
            versions.export_version(str(base), _export(prefix), version=bad)
    with pytest.raises(ValueError, match="wrote no SavedModel"):
        versions.export_version(str(base), lambda folder: os.makedirs(folder))

    def failing(folder):
        os.makedirs(folder)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        versions.export_version(str(base), failing)
    assert sorted(os.listdir(base)) == ["3"]  # nothing staged is left behind
    (tmp_path / "owned").mkdir()
    (tmp_path / "owned" / versions.OWNER_FILE).write_text(json.dumps({"model_id": "m"}))
    with pytest.raises(ValueError, match="belongs to a streaming trainer"):
        versions.export_version(str(tmp_path / "owned"), _export(prefix))
    assert os.listdir(tmp_path / "owned") == [versions.OWNER_FILE]


def test_the_predictor_still_refuses_plain_and_damaged_versions(trained, tmp_path):
    prefix, query, expected = trained
    base = tmp_path / "serving"
    versions.export_version(str(base), _export(prefix))
    export_saved_model(str(base / "2"), prefix, _build)  # written in place: no manifest
    versions.export_version(str(base), _export(prefix))  # 3
    for variables in (base / "3" / "variables").glob("variables.data-*"):  # a bad disk
        data = variables.read_bytes()
        variables.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    predictor = Predictor(str(base))
    assert predictor.poll() == 1
    assert "has no mxrec_version.json" in predictor.refused[2]
    assert "export_version" in predictor.refused[2]
    assert "does not match its SHA-256" in predictor.refused[3]
    codes = {entry["version"]: entry["status"]["error_code"]
             for entry in predictor.status()["model_version_status"]}
    assert codes == {"1": "OK", "2": "DATA_LOSS", "3": "DATA_LOSS"}
    np.testing.assert_allclose(predictor.predict({"ids": query})[0]["prob"], expected,
                               atol=1e-6)
    predictor.close()

"""WarmStart and the serving export straight from a checkpoint of mxrec's Saver written by
several ranks, against one process trained on the same global batches.

examples/multiworker/train.py (the model of tests/test_multiworker.py: one sharded table
"emb", a dense weight "w", Adagrad, admission after 2 occurrences) trains 10 steps on 4 ranks
with a full save at step 6 and a delta at step 10. From that directory:
- WarmStart on 1 process and on 2 ranks, each training on to step 20, equals 20 straight
  steps of one process (IDs, rows, admission counts and Adagrad slots all carry over);
- the serving export holds exactly the table one process has after 10 steps and predicts
  what NumPy computes from that process's table and weight;
and the damaged versions (a rank file missing, a rank count that does not match the files)
are refused with errors that name them.
"""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from test_multiworker import _shards, _train

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.export import saved_model as serving
from mxrec.saver import checkpoint, sparse
from mxrec.saver.manifest import CheckpointError
from mxrec.saver.warm_start import WarmStart

COMMON = ["--optimizer", "adagrad", "--threshold", "2", "--steps", "20"]
DIM, FEATURES = 8, 4


def _check(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _assert_same(want, want_w, got, got_w, label):
    assert sorted(got) == sorted(want), label
    assert len(want) > 50
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=f"{label} {key}")
    for w in got_w:
        np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-5, err_msg=label)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process straight to 20 (and stopped at 10), and 4 ranks to 10 saving at 6 and 10."""
    root = tmp_path_factory.mktemp("warm")
    _check(_train(1, root / "straight", COMMON))
    _check(_train(1, root / "one-at-10", COMMON + ["--stop_at", "10"]))
    _check(_train(4, root / "unused", COMMON + ["--ckpt", str(root / "ckpt4"), "--full_at", "6",
                                                "--delta_at", "10", "--stop_at", "10"]))
    return root


def test_warm_start_from_four_ranks_on_one_and_on_two(runs, tmp_path):
    want, (want_w,) = _shards(runs / "straight", 1)
    for ranks in (1, 2):
        out = tmp_path / f"warm-{ranks}"
        _check(_train(ranks, out, COMMON + ["--warm_start", str(runs / "ckpt4")]))
        got, got_w = _shards(out, ranks)  # each rank holds only the IDs it owns
        _assert_same(want, want_w, got, got_w, f"warm start on {ranks} rank(s)")


def test_warm_start_of_a_dynamic_table_from_two_ranks(tmp_path):
    args = ["--optimizer", "adagrad", "--dynamic", "--steps", "20"]
    _check(_train(1, tmp_path / "straight", args))
    _check(_train(2, tmp_path / "unused", args + ["--ckpt", str(tmp_path / "ckpt"),
                                                  "--full_at", "6", "--delta_at", "10",
                                                  "--stop_at", "10"]))
    _check(_train(1, tmp_path / "warm", args + ["--warm_start", str(tmp_path / "ckpt")]))
    want, (want_w,) = _shards(tmp_path / "straight", 1)
    got, got_w = _shards(tmp_path / "warm", 1)
    _assert_same(want, want_w, got, got_w, "dynamic table warm-started from 2 ranks")


def _build_serving():
    ids = tf.compat.v1.placeholder(tf.int64, [None, FEATURES], name="ids")
    table = create_table(tf.int64, DIM, "emb", tf.compat.v1.constant_initializer(0.05),
                         device_vocabulary_size=512)
    emb = sparse_lookup(table, ids, is_train=False)
    weights = tf.compat.v1.get_variable("w", [DIM, 1])
    score = tf.sigmoid(tf.matmul(tf.reduce_sum(emb, 1), weights))
    return {"ids": ids}, {"score": score}


def _predict(export_dir, ids):
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        score = meta.signature_def["serving_default"].outputs["score"].name
        return sess.run(score, {"ids:0": ids})


def test_serving_export_from_four_ranks_equals_one_process(mx, runs, tmp_path):
    mx()
    want, (want_w,) = _shards(runs / "one-at-10", 1)
    export_dir = serving.export_saved_model(str(tmp_path / "1"), str(runs / "ckpt4"),
                                            _build_serving)
    table = serving.exported_tables(export_dir)["emb"]
    assert sorted(table["ids"].tolist()) == sorted(want)
    for key, value in zip(table["ids"].tolist(), table["embeddings"]):
        np.testing.assert_allclose(value, want[key], rtol=0, atol=1e-5)
    # The NumPy export reads the same directory the same way.
    arrays = sparse.export(checkpoint=str(runs / "ckpt4"))["emb"]
    order = np.argsort(table["ids"])
    np.testing.assert_array_equal(arrays["ids"], table["ids"][order])
    np.testing.assert_array_equal(arrays["embeddings"], table["embeddings"][order])
    # The same from the delta's version folder.
    version = serving.export_saved_model(str(tmp_path / "2"),
                                         str(runs / "ckpt4" / "delta-000000000010"),
                                         _build_serving)
    np.testing.assert_array_equal(serving.exported_tables(version)["emb"]["embeddings"],
                                  table["embeddings"])
    # Predictions: known IDs, an unseen one (zeros), against NumPy on one process's table.
    known = np.array(sorted(want), np.int64)
    rng = np.random.default_rng(3)
    ids = rng.choice(known, size=(32, FEATURES))
    ids[0, 0] = 123456789  # never seen
    rows = np.array([[want.get(int(k), np.zeros(DIM)) for k in row] for row in ids])
    expected = 1 / (1 + np.exp(-(rows.sum(1) @ want_w)))
    np.testing.assert_allclose(_predict(export_dir, ids), expected, rtol=0, atol=1e-5)
    # The serving delta of the sharded delta version: the whole table's changed IDs.
    delta = checkpoint.serving_delta(str(runs / "ckpt4"), 10)["emb"]
    assert len(delta["ids"]) == len(np.unique(delta["ids"])) > 0
    for key, value in zip(delta["ids"].tolist(), delta["embeddings"]):
        np.testing.assert_allclose(value, want[key], rtol=0, atol=1e-5)


def _damaged(runs, tmp_path, damage):
    directory = tmp_path / "damaged"
    shutil.copytree(runs / "ckpt4", directory)
    damage(directory / "delta-000000000010")
    return str(directory)


def _warm_start_graph(directory):
    tf.compat.v1.placeholder(tf.int64, [None, FEATURES])
    create_table(tf.int64, DIM, "emb", tf.compat.v1.constant_initializer(0.05),
                 device_vocabulary_size=512)
    tf.compat.v1.get_variable("w", [DIM, 1])
    return WarmStart(directory)


def test_a_missing_rank_file_is_refused(mx, make_session, runs, tmp_path):
    mx()
    directory = _damaged(runs, tmp_path,
                         lambda version: (version / "table-000-rank00002.npz").unlink())
    with pytest.raises(CheckpointError, match="table-000-rank00002.npz is missing"):
        serving.export_saved_model(str(tmp_path / "e"), directory, _build_serving)
    warm = _warm_start_graph(directory)
    with pytest.raises(CheckpointError, match="table-000-rank00002.npz is missing"):
        warm.run(make_session())


def test_a_rank_count_that_does_not_match_the_files_is_refused(mx, runs, tmp_path):
    mx()

    def claim_three_ranks(version):
        manifest = json.loads((version / "manifest.json").read_text())
        manifest["ranks"] = 3
        (version / "manifest.json").write_text(json.dumps(manifest))

    directory = _damaged(runs, tmp_path, claim_three_ranks)
    message = ("table 'emb' has 4 rank file.* but the manifest says it was saved by 3 ranks")
    with pytest.raises(CheckpointError, match=message):
        serving.export_saved_model(str(tmp_path / "e"), directory, _build_serving)
    with pytest.raises(CheckpointError, match=message):  # found before anything is loaded
        _warm_start_graph(directory)


def test_warm_start_names_a_table_the_checkpoint_lacks(mx, runs):
    mx()
    tf.compat.v1.get_variable("w", [DIM, 1])
    create_table(tf.int64, DIM, "other", tf.compat.v1.constant_initializer(0.0),
                 device_vocabulary_size=64)
    with pytest.raises(ValueError, match=r"table 'other' is not in checkpoint .*ckpt4.*"
                                         r"step 10.*tables there: \['emb'\]"):
        WarmStart(str(runs / "ckpt4"), "other")

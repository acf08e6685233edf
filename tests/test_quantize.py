"""int8 serving: export_saved_model(quantize="int8"), apply_delta on an int8 export, the
streaming trainer's --serving-quantize (deltas in the same form, applied in place by the
predictor), against a NumPy quantizer written here from the definition."""

import os
import posixpath
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import test_serving_export
from serving_streams import MODEL, hashed, read_rows, request, train, write
from test_serving_export import DIMS, _build_serving, _predict_in_fresh_process, _query_batch

from mxrec.export import quantize as quantizer
from mxrec.export import saved_model as serving
from mxrec.serving import versions
from mxrec.serving.predictor import DELTA_FILE, Predictor, read_delta
from mxrec.serving.server import ModelServer
from mxrec.streaming import trainer as streaming_trainer
from mxrec.streaming.trainer import StreamConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A model trained a few steps and saved (sess, tables, ids, eval logits, checkpoint).
trained = test_serving_export.trained


def reference_quantize(rows):
    """Per row: offset = min, scale = (max - min) / 255 (float32), q = round((x - min) / scale)
    half to even, in float64 from the float32 scale; a constant row has scale 0 and q 0."""
    rows = np.asarray(rows, np.float32)
    codes = np.zeros(rows.shape, np.uint8)
    scale_offset = np.zeros([len(rows), 2], np.float32)
    for i, row in enumerate(rows):
        low, high = float(row.min()), float(row.max())
        scale = np.float32((high - low) / 255.0)
        scale_offset[i] = scale, row.min()
        if scale > 0:
            q = np.round((row.astype(np.float64) - low) / np.float64(scale))
            codes[i] = np.clip(q, 0, 255)
    return codes, scale_offset


def reference_dequantize(codes, scale_offset):
    return (codes.astype(np.float32) * scale_offset[:, :1]) + scale_offset[:, 1:]


def _error_bound(rows, scale_offset):
    """|x - dq(q(x))| allowed per element: half a step, plus the float32 rounding of the
    multiply-add (2 ulps of the row's largest magnitude)."""
    magnitude = np.abs(rows).max(axis=1, keepdims=True)
    return scale_offset[:, :1] / 2 * (1 + 1e-6) + 2 * np.spacing(magnitude)


def _lookups_and_logits(export_dir, user, item):
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        outputs = meta.signature_def["serving_default"].outputs
        return sess.run({k: outputs[k].name for k in ("user_emb", "item_emb", "logits")},
                        {"user_ids:0": user, "item_ids:0": item})


def _lipschitz(ckpt):
    """A bound of |logits(x) - logits(x')| / |x - x'|_2 for the test model's MLP (relu is
    1-Lipschitz): the product of its kernels' spectral norms."""
    reader = tf.train.load_checkpoint(ckpt)
    return (np.linalg.norm(reader.get_tensor("mlp/hidden/kernel"), 2)
            * np.linalg.norm(reader.get_tensor("mlp/out/kernel"), 2))


def test_reference_quantizer_agrees_and_bounds_the_error():
    rng = np.random.default_rng(3)
    rows = np.concatenate([rng.normal(0, 0.1, [200, 16]), rng.uniform(-1e6, 1e6, [5, 16]),
                           np.full([2, 16], 0.25), [np.linspace(-1, 1, 16)]]).astype(np.float32)
    codes, scale_offset = quantizer.quantize_rows(rows)
    want_codes, want_scale_offset = reference_quantize(rows)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(scale_offset, want_scale_offset)
    assert codes.dtype == np.uint8 and scale_offset.dtype == np.float32
    back = quantizer.dequantize_rows(codes, scale_offset)
    np.testing.assert_array_equal(back, reference_dequantize(want_codes, want_scale_offset))
    assert (np.abs(back - rows) <= _error_bound(rows, scale_offset)).all()
    np.testing.assert_array_equal(back[205:207], rows[205:207])  # constant rows: exact
    # Every row uses both ends of the code range (unless constant).
    assert (codes[:205].min(axis=1) == 0).all() and (codes[:205].max(axis=1) == 255).all()
    # A row whose span float32 cannot hold, or that is not finite, is refused by name.
    for bad in ([3e38, -3e38, 0], [0, np.nan, 1], [0, np.inf, 1]):
        with pytest.raises(ValueError, match="row 1 spans .* int8 serving cannot hold it"):
            quantizer.quantize_rows(np.array([[0, 0, 0], bad], np.float32))


def test_int8_export_answers_within_the_bound_of_float32(trained, tmp_path):
    sess, tables, ids, eval_logits, ckpt = trained
    user, item = _query_batch(tables)
    float_dir = serving.export_saved_model(str(tmp_path / "f32" / "1"), ckpt, _build_serving)
    int8_dir = serving.export_saved_model(str(tmp_path / "int8" / "1"), ckpt, _build_serving,
                                          quantize="int8")
    exact = serving.exported_tables(float_dir)
    quantized = serving.exported_tables(int8_dir)
    for name in DIMS:
        np.testing.assert_array_equal(quantized[name]["ids"], exact[name]["ids"])
        codes, scale_offset = reference_quantize(exact[name]["embeddings"])
        np.testing.assert_array_equal(quantized[name]["quantized"], codes)
        np.testing.assert_array_equal(quantized[name]["scale_offset"], scale_offset)
    got, want = (_lookups_and_logits(d, user, item) for d in (int8_dir, float_dir))

    # The looked-up rows, each against the reference quantizer's row of its ID (unseen IDs:
    # zeros); the logits within the bound the rows' errors give through the MLP.
    squared_error = np.zeros(len(item))
    for name, key, looked_up in (("user_table", "user_emb", user), ("item_table", "item_emb",
                                                                    item)):
        table = exact[name]
        codes, scale_offset = reference_quantize(table["embeddings"])
        rows = {int(i): r for i, r in zip(table["ids"], reference_dequantize(codes,
                                                                             scale_offset))}
        half_step = {int(i): b for i, b in zip(table["ids"], _error_bound(table["embeddings"],
                                                                         scale_offset))}
        flat = looked_up.reshape(-1)
        expected = np.stack([rows.get(int(i), np.zeros(DIMS[name], np.float32)) for i in flat])
        np.testing.assert_array_equal(got[key].reshape(len(flat), -1), expected)
        bound = np.stack([np.broadcast_to(half_step.get(int(i), 0.0), [DIMS[name]])
                          for i in flat])
        error = np.abs(got[key] - want[key]).reshape(len(flat), -1)
        assert (error <= bound).all()
        squared_error += (bound ** 2).reshape(len(item), -1).sum(axis=1)
    logit_bound = _lipschitz(ckpt) * np.sqrt(squared_error) + 1e-6
    assert (np.abs(got["logits"] - want["logits"]) <= logit_bound).all()
    assert np.abs(got["logits"] - want["logits"]).max() > 0  # rows did change

    # Served without mxrec (TF's own loader), and by the predictor over REST.
    fresh = _predict_in_fresh_process(int8_dir, user, item, use_v2=True)
    assert not fresh["mxrec_loaded"]
    np.testing.assert_allclose(fresh["logits"], got["logits"], atol=1e-6, rtol=0)
    versions.export_version(str(tmp_path / "served"), lambda folder: serving.export_saved_model(
        folder, ckpt, _build_serving, quantize="int8"))
    predictor = Predictor(str(tmp_path / "served"))
    assert predictor.poll() == 1, predictor.refused
    server = ModelServer(predictor, "ctr", port=0, poll_interval=None).start()
    try:
        code, _, body = request(server.port, "POST", "/v1/models/ctr:predict", {
            "inputs": {"user": user.tolist(), "item": item.tolist()}})
    finally:
        server.stop()
        predictor.close()
    assert code == 200, body
    served = np.array(body["outputs"]["logits"], np.float32)
    np.testing.assert_allclose(served, got["logits"], atol=1e-6, rtol=0)
    assert (np.abs(served - want["logits"]) <= logit_bound + 1e-6).all()


def test_apply_delta_to_int8_export_equals_quantizing_the_float_result(trained, tmp_path):
    _, _, _, _, ckpt = trained
    float_dir = serving.export_saved_model(str(tmp_path / "f1"), ckpt, _build_serving)
    int8_dir = serving.export_saved_model(str(tmp_path / "q1"), ckpt, _build_serving,
                                          quantize="int8")
    user = serving.exported_tables(float_dir)["user_table"]
    rng = np.random.default_rng(5)
    changed = np.concatenate([user["ids"][[1, 4]], [5_000_001, 5_000_002]]).astype(np.int64)
    delta = {"user_table": {"ids": changed, "removed": user["ids"][[0, 7]],
                            "embeddings": rng.normal(0, 1, [4, 4]).astype(np.float32)}}
    float_after = serving.exported_tables(serving.apply_delta(float_dir, delta,
                                                              str(tmp_path / "f2")))
    int8_after = serving.exported_tables(serving.apply_delta(int8_dir, delta,
                                                             str(tmp_path / "q2")))
    for name in DIMS:
        want = float_after[name]
        got = int8_after[name]
        np.testing.assert_array_equal(got["ids"], want["ids"])
        codes, scale_offset = reference_quantize(want["embeddings"])
        np.testing.assert_array_equal(got["quantized"], codes)
        np.testing.assert_array_equal(got["scale_offset"], scale_offset)
    with pytest.raises(ValueError, match=r"embeddings must be \[1, 4\]"):
        serving.apply_delta(int8_dir, {"user_table": {"ids": np.array([3], np.int64),
                                                      "embeddings": np.zeros([1, 3])}},
                            str(tmp_path / "q3"))
    with pytest.raises(serving.NonFiniteError):
        serving.apply_delta(int8_dir, {"user_table": {
            "ids": np.array([3], np.int64),
            "embeddings": np.array([[0, np.nan, 1, 2]], np.float32)}}, str(tmp_path / "q4"))
    assert not os.path.exists(tmp_path / "q3") and not os.path.exists(tmp_path / "q4")


@pytest.mark.one_tf
@pytest.mark.parametrize("bad", ["int4", "INT8", "float16", 8, ""])
def test_bad_quantize_values_are_refused_naming_the_accepted_ones(tmp_path, bad):
    # Refused before the checkpoint is opened: this one does not exist.
    with pytest.raises(ValueError, match=r"quantize must be None \(float32 rows\) or one of "
                                         r"\['int8'\]"):
        serving.export_saved_model(str(tmp_path / "e"), str(tmp_path / "none"), _build_serving,
                                   quantize=bad)
    assert not os.path.exists(tmp_path / "e")
    with pytest.raises(ValueError, match=r"serving_quantize: quantize must be None"):
        StreamConfig(data=str(tmp_path), schema=None, workdir=str(tmp_path / "w"),
                     serving_quantize=bad)


@pytest.mark.one_tf
def test_cli_refuses_an_unknown_serving_quantize(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mxrec.streaming", "train", "--data", str(tmp_path),
         "--model-dir", str(tmp_path / "m"), "--serving-quantize", "int4"],
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 2
    assert "--serving_quantize: invalid choice: 'int4' (choose from 'none', 'int8')" in \
        done.stderr or "--serving-quantize: invalid choice" in done.stderr, done.stderr


PARTITIONS = [f"20240101/{hour:02d}" for hour in range(3)]


def _full_int8_export(trainer, checkpoint_version, export_dir):
    """A full int8 export of a checkpoint version, built as the trainer builds its versions
    (the default signature)."""
    def build():
        inputs = streaming_trainer._serving_inputs(trainer.config.schema)
        logits = trainer.model_fn(dict(inputs), False)
        return inputs, {"prob": tf.sigmoid(logits), "logits": logits}

    base, version = os.path.split(export_dir)
    with tf.Graph().as_default():
        return versions.export_version(base, lambda folder: serving.export_saved_model(
            folder, checkpoint_version, build, quantize="int8",
            signature_name=streaming_trainer.DEFAULT_SIGNATURE), version=int(version))


def test_streaming_int8_deltas_equal_full_exports_and_apply_in_place(tmp_path):
    write(tmp_path / "data", PARTITIONS, rows=80)
    query = hashed(read_rows(str(tmp_path / "data" / PARTITIONS[-1]))[:16])
    export = tmp_path / "export"
    trainer, entries = train(tmp_path / "data", tmp_path / "work", export, model=MODEL,
                             full_every=3, serving_quantize="int8")
    assert [e["checkpoint"] for e in entries] == ["full", "delta", "delta"]
    for version in (1, 2, 3):
        manifest = versions.read_manifest(str(export / str(version)))
        assert manifest["quantize"] == "int8"
        assert manifest["kind"] == ("full" if version == 1 else "delta")
    # The delta file is in the quantized form: codes and (scale, offset) per row.
    tables, _ = read_delta(str(export / "3" / DELTA_FILE))
    dims = {name: t["embeddings"].shape[1]
            for name, t in serving.exported_tables(str(export / "1")).items()}
    assert sorted(dims.values()) == [1, 4]  # the wide table stays float32
    for name, delta in tables.items():
        if dims[name] == 1:
            assert sorted(delta) == ["embeddings", "ids", "removed"]
            continue
        assert "embeddings" not in delta, name
        assert delta["quantized"].dtype == np.uint8
        assert delta["scale_offset"].shape == (len(delta["ids"]), 2)

    # The version built by deltas equals a full int8 export of the same checkpoint.
    checkpoint = posixpath.join(trainer.config.checkpoint_dir, "delta-000000000003")
    full_dir = _full_int8_export(trainer, checkpoint, str(tmp_path / "full" / "3"))
    by_delta = serving.exported_tables(str(export / "3"))
    full = serving.exported_tables(full_dir)
    assert sorted(by_delta) == sorted(full)
    for name in full:
        order = np.argsort(by_delta[name]["ids"])
        np.testing.assert_array_equal(by_delta[name]["ids"][order], full[name]["ids"])
        for field in ("quantized", "scale_offset") if dims[name] > 1 else ("embeddings",):
            np.testing.assert_array_equal(by_delta[name][field][order], full[name][field])

    # The predictor follows the versions, applying the quantized deltas in place, and
    # answers as a fresh load of the full export.
    follow = tmp_path / "follow"
    follow.mkdir()
    predictor = Predictor(str(follow))
    for version in (1, 2, 3):
        os.symlink(export / str(version), follow / str(version))
        assert predictor.poll() == version, predictor.refused
    fresh = Predictor(str(tmp_path / "full"))
    assert fresh.poll() == 3
    np.testing.assert_array_equal(predictor.predict(query)[0]["prob"],
                                  fresh.predict(query)[0]["prob"])
    predictor.close()
    fresh.close()

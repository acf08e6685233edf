"""mk.export_serving in eager mode: the SavedModel serves what the trained Keras model
predicts (tf.saved_model.load and mxrec.serving's predictor), holds no mxrec op, serves an
older checkpoint's state when given one, and refuses what it cannot export (run by
tests/test_keras_eager.py)."""

import os
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from _support import fresh  # noqa: E402, F401 (autouse: init() and a clean session per test)

import mxrec.keras as mk  # noqa: E402
from mxrec.serving.predictor import ModelInstance  # noqa: E402

ATOL = 1e-6


def _model(tiered=False):
    """One-hot IDs of `user` (admission, a serving default, a padding key), multi-hot IDs of
    `item` combined by a mean, dense features; a hidden layer and a logit. tiered: both
    tables hold 30 device rows over a host tier (the training IDs do not fit the device)."""
    sizes = dict(device_vocabulary_size=30, host_vocabulary_size=100) if tiered else dict(
        device_vocabulary_size=60)
    user = mk.Embedding(4, "user", access_threshold=2, serving_default_value=0.25,
                        padding_keys=[-1], **sizes)
    item = mk.Embedding(3, "item", combiner="mean", **sizes)
    ids = tf.keras.Input([2], dtype=tf.int64, name="user_ids")
    items = tf.keras.Input([3], dtype=tf.int64, name="item_ids")
    dense = tf.keras.Input([2], name="dense")
    x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(user(ids)), item(items), dense])
    hidden = tf.keras.layers.Dense(5, activation="relu", name="hidden")(x)
    out = tf.keras.layers.Dense(1, name="logit")(hidden)
    model = tf.keras.Model([ids, items, dense], out)
    model.compile(optimizer=mk.optimizers.Adagrad(0.1), loss="mse")
    return model


def _batch(rng, n, high):
    user = rng.integers(0, high, (n, 2)).astype(np.int64)
    user[0, 0] = -1  # the padding key
    return (user, rng.integers(0, high, (n, 3)).astype(np.int64),
            rng.normal(size=(n, 2)).astype(np.float32))


def _fit(model, rng, steps=8):
    x = _batch(rng, steps * 8, 40)
    model.fit(x, rng.normal(size=(steps * 8, 1)).astype(np.float32), batch_size=8,
              shuffle=False, verbose=0)


def _served(export_dir, query):
    feeds = dict(user_ids=query[0], item_ids=query[1], dense=query[2])
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    loaded = signature(**{k: tf.constant(v) for k, v in feeds.items()})
    assert sorted(loaded) == ["logit"]
    predicted = ModelInstance(export_dir).predict(feeds)
    assert sorted(predicted) == ["logit"]
    return loaded["logit"].numpy(), predicted["logit"]


def _ops(export_dir):
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    return ({n.op for n in graph.node}
            | {n.op for fn in graph.library.function for n in fn.node_def})


@pytest.mark.parametrize("tiered", [False, True])
def test_the_export_serves_the_trained_models_predictions(tmp_path, tiered):
    rng = np.random.default_rng(0)
    model = _model(tiered)
    _fit(model, rng)
    if tiered:  # IDs in the host tier: predict reads them there, the export holds them
        item = model.get_layer("item")
        assert item.tier_stats()["tier_ids"] > 0
        ids, _ = item.export_values()["embedding"]
        assert len(ids) > 30
    query = _batch(rng, 32, 80)  # seen, unseen and rejected IDs, the padding key
    expected = model.predict(query, verbose=0)
    before = {layer: layer.stats() for layer in model.layers if isinstance(layer, mk.Embedding)}
    export_dir = str(tmp_path / "export" / "1")
    assert mk.export_serving(model, export_dir) == export_dir
    loaded, predicted = _served(export_dir, query)
    np.testing.assert_allclose(loaded, expected, atol=ATOL, rtol=0)
    np.testing.assert_allclose(predicted, expected, atol=ATOL, rtol=0)
    assert not any(op.startswith("Mxrec") for op in _ops(export_dir))
    assert "HashTableV2" in _ops(export_dir)
    # Unseen IDs read the default value: a query of unseen IDs differs from one of zeros.
    unseen = (np.full((2, 2), 10**9, np.int64), query[1][:2], query[2][:2])
    np.testing.assert_allclose(_served(export_dir, unseen)[0], model.predict(unseen, verbose=0),
                               atol=ATOL, rtol=0)
    for layer, stats in before.items():  # exporting inserted and counted nothing
        assert layer.stats()["rows_in_use"] == stats["rows_in_use"]
        assert layer.stats()["ids_seen"] == stats["ids_seen"]
    with pytest.raises(ValueError, match="already exists"):
        mk.export_serving(model, export_dir)


def test_the_export_of_a_checkpoint_serves_its_state(tmp_path):
    rng = np.random.default_rng(1)
    model = _model()
    _fit(model, rng)
    saver = mk.KerasSaver(str(tmp_path / "ckpt"), model, model.optimizer)
    saver.save(kind="full")
    query = _batch(rng, 16, 60)
    then = model.predict(query, verbose=0)
    _fit(model, rng)  # trains on: the model now predicts otherwise
    assert np.abs(model.predict(query, verbose=0) - then).max() > 1e-3
    export_dir = str(tmp_path / "export" / "2")
    mk.export_serving(model, export_dir, checkpoint=str(tmp_path / "ckpt"))
    loaded, predicted = _served(export_dir, query)
    np.testing.assert_allclose(loaded, then, atol=ATOL, rtol=0)
    np.testing.assert_allclose(predicted, then, atol=ATOL, rtol=0)


def test_refusals(tmp_path):
    ids = tf.keras.Input([2], dtype=tf.int64)
    plain = tf.keras.Model(ids, tf.keras.layers.Embedding(10, 2)(ids))
    with pytest.raises(ValueError, match="has no mxrec.keras Embedding"):
        mk.export_serving(plain, str(tmp_path / "a"))
    model = _model()
    _fit(model, np.random.default_rng(2), steps=1)
    mk.KerasSaver(str(tmp_path / "ckpt"), model, None).save(step=1)
    with pytest.raises(ValueError, match="variable 'other/kernel' .*not in checkpoint"):
        mk.export_serving(model, str(tmp_path / "b"), checkpoint=str(tmp_path / "ckpt"),
                          dense_names={"logit/kernel": "other/kernel"})

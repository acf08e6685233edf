"""mk.data.plan_ahead in eager mode: what it refuses, and the step boundary it keeps.

Run by tests/test_keras_eager.py in a process of its own (pytest --noconftest). The
training results with plan_ahead are compared with the Session path in
tests/test_keras_plan_ahead.py.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from _support import fresh  # noqa: E402, F401 (autouse: init() and a clean session per test)

import mxrec.keras as mk  # noqa: E402

WIDTH, STEPS, BATCH = 3, 6, 4


def _model(capacity=100, **kwargs):
    layer = mk.Embedding(2, "user", capacity, embeddings_initializer="zeros", **kwargs)
    ids = tf.keras.Input([WIDTH], dtype=tf.int64, name="ids")
    stamp = tf.keras.Input([], dtype=tf.int64, name="ts")
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(ids, timestamp=stamp)))
    model = tf.keras.Model([ids, stamp], out)
    model.compile(optimizer=mk.optimizers.SGD(0.1),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    return model, layer


def _dataset(offset=0):
    ids = (np.arange(STEPS * BATCH * WIDTH, dtype=np.int64).reshape(STEPS, BATCH, WIDTH)
           + offset)
    labels = np.ones([STEPS, BATCH, 1], np.float32)
    stamps = np.repeat(np.arange(STEPS, dtype=np.int64)[:, None] * 10 + 100, BATCH, axis=1)
    return tf.data.Dataset.from_tensor_slices(((ids, stamps), labels))


def test_refused_arguments_name_the_setting():
    model, _ = _model()
    with pytest.raises(ValueError, match="prefetch must be >= 1"):
        mk.data.plan_ahead(_dataset(), model, prefetch=0)
    for bad in (True, "2", 2.0):
        with pytest.raises(TypeError, match="prefetch must be an int"):
            mk.data.plan_ahead(_dataset(), model, prefetch=bad)
    with pytest.raises(TypeError, match="must be a tf.data.Dataset"):
        mk.data.plan_ahead([1, 2], model)
    ids = tf.keras.Input([WIDTH], dtype=tf.int64)
    plain = tf.keras.Model(ids, tf.keras.layers.Embedding(10, 2)(ids))
    with pytest.raises(ValueError, match="no mxrec.keras Embedding layer"):
        mk.data.plan_ahead(_dataset(), plain)


def test_an_element_the_model_cannot_take_is_refused():
    model, _ = _model()
    strings = tf.data.Dataset.from_tensor_slices(((tf.constant([["a", "b", "c"]]),
                                                   tf.constant([[1]], tf.int64)),
                                                  tf.constant([[1.0]])))
    with pytest.raises(ValueError, match="cannot be called on the dataset's x"):
        mk.data.plan_ahead(strings, model)


def test_evaluation_takes_no_planned_dataset_and_changes_nothing():
    model, layer = _model()
    planned = mk.data.plan_ahead(_dataset(), model)
    before = layer.stats()
    for run in (lambda: model.evaluate(planned, verbose=0),
                lambda: model.predict(planned, verbose=0),
                lambda: model.fit(_dataset(1000), validation_data=planned, verbose=0)):
        with pytest.raises(ValueError, match="without plan_ahead"):
            run()
    assert layer.stats() == before  # nothing was planned, nothing trained
    model.fit(planned, verbose=0)
    assert layer.stats()["train_batches"] == STEPS
    model.evaluate(_dataset(), verbose=0)  # the dataset without plan_ahead evaluates


def test_batches_planned_but_not_trained_are_not_saved():
    """fit stops after 2 of 6 steps (steps_per_epoch) while later batches are planned: the
    tables' state as a checkpoint takes it holds the 2 trained batches only, as that of a
    model that trained those 2 batches without plan_ahead."""
    model, layer = _model()
    model.fit(mk.data.plan_ahead(_dataset(), model, prefetch=3), steps_per_epoch=2,
              verbose=0)
    saved = layer.host_state.arrays()
    tf.keras.backend.clear_session()
    mk.terminate()
    mk.init()
    unplanned, unplanned_layer = _model()
    unplanned.fit(_dataset().take(2), verbose=0)
    expected = unplanned_layer.host_state.arrays()
    assert sorted(saved) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(saved[key], value, err_msg=key)


def test_use_plans_refuses_what_it_cannot_hand_over():
    model, _ = _model()
    planned = mk.data.plan_ahead(_dataset(), model)
    element = next(iter(planned))
    with pytest.raises(ValueError, match="not an element"):
        with mk.data.use_plans(model, next(iter(_dataset()))):
            pass
    with pytest.raises(RuntimeError, match="did not look up"):
        with mk.data.use_plans(model, element):
            pass  # the model is not called: the batch would stay planned
    with pytest.raises(RuntimeError, match="training=False"):
        with mk.data.use_plans(model, element) as (x, _):
            model(list(x), training=False)

"""mxrec.keras in eager mode: lookups against a NumPy reference, and every refusal.

Run by tests/test_keras_eager.py in a process of its own (pytest --noconftest: the suite's
conftest.py turns eager execution off).
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from _support import fresh  # noqa: E402, F401 (autouse: init() and a clean session per test)
from reference import RefKeyStage  # noqa: E402

import mxrec.keras as mk  # noqa: E402

DIM = 3


def _layer(name="t", capacity=50, **kwargs):
    layer = mk.Embedding(DIM, name, capacity, **kwargs)
    values = np.arange(capacity * DIM, dtype=np.float32).reshape(capacity, DIM) / 7.0
    layer.embeddings.assign(values)
    return layer, values


def test_lookup_rows_by_first_occurrence_eager_and_traced():
    layer, values = _layer(padding_keys=[-5])
    ref = RefKeyStage(50, padding_keys=[-5])
    traced = tf.function(lambda ids: layer(ids, training=True))
    for step, ids in enumerate([np.array([[2**62, -5, 7], [7, 0, -(2**63)]], np.int64),
                                np.array([[9, 2**62, -5], [11, 11, 7]], np.int64)]):
        got = (layer(ids) if step == 0 else traced(ids)).numpy()
        unique, restore = ref.process(ids.ravel())
        table = np.concatenate([values[unique], np.zeros([1, DIM], np.float32)])
        np.testing.assert_array_equal(got, table[restore].reshape(ids.shape + (DIM,)))
    assert layer.stats()["rows_in_use"] == len(ref.rows)


def test_evaluation_inserts_nothing_and_gives_the_default():
    layer, values = _layer(serving_default_value=0.5)
    layer(tf.constant([4, 8], tf.int64), training=True)
    got = layer(tf.constant([8, 99, 4], tf.int64), training=False).numpy()
    np.testing.assert_array_equal(got, np.stack([values[1], np.full(DIM, 0.5), values[0]]))
    assert layer.stats()["rows_in_use"] == 2


def test_int32_ids_and_gradient_over_unique_rows():
    layer, _ = _layer()
    with tf.GradientTape() as tape:
        out = layer(tf.constant([[3, 5, 3]], tf.int32))
        loss = tf.reduce_sum(out * tf.constant([1.0, 2.0, 4.0])[None, :, None])
    grad = tape.gradient(loss, layer.trainable_variables)[0]
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(grad.indices.numpy(), [0, 1])
    np.testing.assert_array_equal(grad.values.numpy(), [[5.0] * DIM, [2.0] * DIM])


def test_admission_gives_rows_at_the_threshold():
    layer, _ = _layer(access_threshold=2)
    first = layer(tf.constant([6, 6, 8], tf.int64)).numpy()
    np.testing.assert_array_equal(first[2], np.zeros(DIM))  # 8 seen once: no row yet
    assert layer.stats()["rows_in_use"] == 1


def test_is_grad_false_stops_the_gradient():
    layer, _ = _layer(is_grad=False)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([1, 2], tf.int64)))
    assert tape.gradient(loss, layer.trainable_variables)[0] is None


def test_optimizer_trains_only_touched_rows():
    layer, values = _layer()
    opt = mk.optimizers.SGD(0.5)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([10, 20, 10], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables),
                            layer.trainable_variables))
    expected = values.copy()
    expected[0] -= 0.5 * 2.0
    expected[1] -= 0.5 * 1.0
    np.testing.assert_array_equal(layer.embeddings.numpy(), expected)


# ------------------------------------------------------------------ refusals


def test_multi_hot_ragged_and_sparse_as_safe_embedding_lookup_sparse():
    ref = RefKeyStage(50)
    ragged = tf.ragged.constant([[3, 7], [], [9, 3, 3]], dtype=tf.int64)
    weights = tf.ragged.constant([[1.0, 2.0], [], [0.5, -1.0, 3.0]])
    mean, values = _layer("mean", combiner="mean")
    got = mean(ragged, weights=weights).numpy()
    unique, restore = ref.process(np.array([3, 7, 9, 3], np.int64))  # weight <= 0 dropped
    rows = values[unique][restore]
    expected = np.stack([(rows[0] + 2 * rows[1]) / 3.0, np.zeros(DIM, np.float32),
                         (0.5 * rows[2] + 3.0 * rows[3]) / 3.5])
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    per_id, _ = _layer("per_id")
    nested = per_id(ragged)
    assert isinstance(nested, tf.RaggedTensor) and nested.shape[0] == 3
    total, values = _layer("sum", combiner="sum")
    sparse = tf.sparse.SparseTensor([[0, 0], [0, 2], [2, 1]], tf.constant([5, 6, 5], tf.int64),
                                    [3, 4])
    got = total(sparse).numpy()
    np.testing.assert_array_equal(got, np.stack([values[0] + values[1], np.zeros(DIM),
                                                 values[0]]))


def test_multi_hot_refusals():
    layer, _ = _layer()
    sparse = tf.sparse.SparseTensor([[0, 0]], tf.constant([5], tf.int64), [1, 2])
    with pytest.raises(ValueError, match="needs a combiner"):
        layer(sparse)
    with pytest.raises(ValueError, match="combiner must be"):
        mk.Embedding(DIM, "bad", 10, combiner="max")


def test_tier_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="needs host_vocabulary_size"):
        mk.Embedding(DIM, "t", 10, ssd_vocabulary_size=10, ssd_data_path=[str(tmp_path)])
    with pytest.raises(ValueError, match="host_vocabulary_size must be an int >= 0"):
        mk.Embedding(DIM, "t", 10, host_vocabulary_size=-1)
    with pytest.raises(ValueError, match="not an existing directory"):
        mk.Embedding(DIM, "t", 10, host_vocabulary_size=5, ssd_vocabulary_size=10,
                     ssd_data_path=[str(tmp_path / "missing")])
    with pytest.raises(ValueError, match="has no host tier"):
        mk.Embedding(DIM, "t", 10).tier_stats()


def _train_step(layer, opt, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant(ids, tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables),
                            layer.trainable_variables))


def test_host_tier_swaps_rows_out_and_back_and_evaluation_reads_them():
    init = tf.keras.initializers.Constant(0.25)
    layer, values = _layer(capacity=4, host_vocabulary_size=20, embeddings_initializer=init)
    sgd = mk.optimizers.SGD(0.5)
    _train_step(layer, sgd, [1, 2, 3, 4])  # the device's 4 rows
    _train_step(layer, sgd, [5, 6, 7, 8])  # 1-4 go to the host tier
    stats = layer.tier_stats()
    assert (stats["tier_ids"], stats["swap_out_total"], stats["fresh_total"]) == (4, 4, 4)
    got = layer(tf.constant([1, 5, 99], tf.int64), training=False).numpy()
    np.testing.assert_array_equal(got, np.stack([values[0] - 0.5, np.full(DIM, -0.25),
                                                 np.zeros(DIM)]))
    assert layer.tier_stats()["tier_ids"] == 4  # evaluation moved nothing
    # Adagrad's first update comes after a plan that moved rows (1-4 back, 5-8 out): its
    # slot starts there, at its initial value.
    adagrad = mk.optimizers.Adagrad(0.1, initial_accumulator_value=0.1)
    _train_step(layer, adagrad, [1, 2, 3, 4])
    assert layer.tier_stats()["swap_in_total"] == 4
    exported = layer.export_values(adagrad)
    ids, rows = exported["embedding"]
    np.testing.assert_array_equal(ids, np.arange(1, 9))
    expected = np.concatenate([values[:4] - 0.5 - 0.1 / np.sqrt(1.1),
                               np.full((4, DIM), -0.25)])
    np.testing.assert_allclose(rows, expected, rtol=1e-6)
    slot_ids, slot = exported["Adagrad/accumulator"]
    np.testing.assert_array_equal(slot_ids, [1, 2, 3, 4])  # 5-8 never had one
    np.testing.assert_allclose(slot, 1.1, rtol=1e-6)
    _train_step(layer, adagrad, [5, 6, 7, 8])  # 1-4 out again, with their slots
    slot_ids, slot = layer.export_values(adagrad)["Adagrad/accumulator"]
    np.testing.assert_array_equal(slot_ids, np.arange(1, 9))
    np.testing.assert_allclose(slot, 1.1, rtol=1e-6)


@pytest.mark.parametrize("traced, in_place", [(False, True), (True, True), (True, False)])
def test_host_tier_with_two_lookups_a_step_matches_a_large_device_table(traced, in_place,
                                                                        monkeypatch):
    """Two lookups of one table per step: the second may not take the first's rows as swap
    victims before the update; the result equals a device table large enough for all IDs.
    in_place=False: a GPU weight's gather / MxrecTierSwap / scatter, run on the CPU."""
    from mxrec.core import tiers  # noqa: PLC0415

    monkeypatch.setattr(tiers, "SWAP_IN_PLACE", in_place)
    opt_class = mk.optimizers.Adagrad if not in_place else mk.optimizers.SGD
    init = tf.keras.initializers.Constant(0.25)
    tiered = mk.Embedding(DIM, "tiered", 6, host_vocabulary_size=30,
                          embeddings_initializer=init)
    large = mk.Embedding(DIM, "large", 40, embeddings_initializer=init)
    steps, opts = {}, {}
    batches = [([1, 2, 3], [4, 5, 6]), ([7, 8, 9], [1, 2, 3]), ([4, 5, 10], [11, 7, 1]),
               ([12, 13, 14], [2, 3, 4])]
    for layer in (tiered, large):
        opt = opt_class(0.5)

        def step(a, b, layer=layer, opt=opt):
            with tf.GradientTape() as tape:
                loss = (tf.reduce_sum(layer(a) * [1.0, 2.0, 3.0])
                        + tf.reduce_sum(tf.square(layer(b))))
            opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables),
                                    layer.trainable_variables))

        step = tf.function(step) if traced else step
        for a, b in batches:
            step(tf.constant(a, tf.int64), tf.constant(b, tf.int64))
        steps[layer.name], opts[layer.name] = step, opt
    assert tiered.tier_stats()["swap_in_total"] > 0
    got = tiered.export_values(opts["tiered"])
    want = large.export_values(opts["large"])
    assert sorted(got) == sorted(want) == sorted(
        ["embedding"] + [f"{opt_class.__name__}/accumulator"] * (not in_place))
    for component, (want_ids, want_values) in want.items():
        np.testing.assert_array_equal(got[component][0], want_ids, err_msg=component)
        np.testing.assert_allclose(got[component][1], want_values, rtol=1e-6, err_msg=component)
    # 7 IDs in one step on 6 device rows: the second lookup would have to take a row of
    # the first, whose gradient is still to come.
    with pytest.raises(tf.errors.ResourceExhaustedError, match="batches of one step"):
        steps["tiered"](tf.constant([20, 21, 22], tf.int64), tf.constant([23, 24, 25, 26],
                                                                         tf.int64))


@pytest.mark.parametrize("settings, match", [(dict(use_dynamic=False), "use_dynamic=False"),
                                             (dict(use_dynamic_expansion=True),
                                              "use_dynamic_expansion")])
def test_init_settings_not_available_are_refused(settings, match):
    mk.init(**settings)
    with pytest.raises(NotImplementedError, match=match):
        mk.Embedding(DIM, "t", 10)


def test_create_table_checks_apply():
    with pytest.raises(ValueError, match="device_vocabulary_size"):
        mk.Embedding(DIM, "t", 0)
    with pytest.raises(ValueError, match="eviction_threshold needs"):
        mk.Embedding(DIM, "u", 10, eviction_threshold=5)
    mk.Embedding(DIM, "u", 10)  # nothing of the refused layer stayed
    mk.Embedding(DIM, "v", 10)
    with pytest.raises(ValueError, match="already exists"):
        mk.Embedding(DIM, "v", 10)
    with pytest.raises(TypeError, match="float32"):
        mk.Embedding(DIM, "w", 10, dtype="float16")


def test_evict_needs_a_threshold():
    layer, _ = _layer()
    with pytest.raises(ValueError, match="max_age_seconds"):
        layer.evict()


def test_get_config_is_refused():
    layer, _ = _layer()
    with pytest.raises(NotImplementedError, match="serialising"):
        layer.get_config()


@pytest.mark.parametrize("make, match", [
    (lambda: mk.optimizers.SGD(tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)),
     "LearningRateSchedule"),
    (lambda: mk.optimizers.SGD(0.1, momentum=0.9), "momentum"),
    (lambda: mk.optimizers.Adagrad(0.1, clipnorm=1.0), "clipnorm"),
    (lambda: mk.optimizers.Adagrad(0.1, initial_accumulator_value=0.0),
     "initial_accumulator_value"),
])
def test_optimizer_settings_not_available_are_refused(make, match):
    with pytest.raises((NotImplementedError, ValueError), match=match):
        make()


def test_update_without_a_lookup_in_the_same_function_is_refused():
    layer, _ = _layer()
    opt = mk.optimizers.Adagrad(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([1, 2], tf.int64)))
    grads = tape.gradient(loss, layer.trainable_variables)

    @tf.function
    def apply(values, indices):
        grad = tf.IndexedSlices(values, indices, tf.constant([50, DIM]))
        opt.apply_gradients([(grad, layer.trainable_variables[0])])

    with pytest.raises(RuntimeError, match="same tf.function"):
        apply(grads[0].values, grads[0].indices)


def test_predict_and_evaluate_insert_nothing():
    layer, _ = _layer(capacity=20)
    ids = tf.keras.Input([2], dtype=tf.int64)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(ids))))
    model.compile(optimizer=mk.optimizers.SGD(0.1), loss="mse")
    train = np.array([[1, 2], [3, 1]], np.int64)
    model.fit(train, np.zeros([2, 1], np.float32), batch_size=2, verbose=0)
    before = layer.stats()
    unseen = np.array([[7, 8], [9, 1]], np.int64)
    model.predict(unseen, verbose=0)
    model.evaluate(unseen, np.zeros([2, 1], np.float32), verbose=0)
    after = layer.stats()
    assert after["rows_in_use"] == before["rows_in_use"] == 3
    assert after["ids_seen"] == before["ids_seen"] and after["train_batches"] == 1
    assert after["eval_batches"] == 2


def test_steps_per_execution_trains_as_one_step_per_call():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 30, size=(16, 2)).astype(np.int64)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    results = []
    for run, steps in enumerate((1, 4)):
        layer, _ = _layer(name=f"spe{run}", capacity=40, access_threshold=2)
        ids = tf.keras.Input([2], dtype=tf.int64)
        head = tf.keras.layers.Dense(1, kernel_initializer="ones")
        model = tf.keras.Model(ids, head(tf.keras.layers.Flatten()(layer(ids))))
        model.compile(optimizer=mk.optimizers.Adagrad(0.1), loss="mse",
                      steps_per_execution=steps)
        model.fit(x, y, batch_size=2, shuffle=False, verbose=0)
        results.append((layer.embeddings.numpy(), head.get_weights()[0], layer.stats()))
    np.testing.assert_allclose(results[1][0], results[0][0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(results[1][1], results[0][1], atol=1e-6, rtol=0)
    assert results[1][2]["rows_in_use"] == results[0][2]["rows_in_use"] > 0


def test_rows_reused_after_eviction_get_fresh_random_values():
    layer = mk.Embedding(DIM, "fresh", 4, access_threshold=1, eviction_threshold=5,
                         embeddings_initializer=tf.keras.initializers.RandomUniform(2.0, 3.0))
    step = tf.function(lambda ids, ts: layer(ids, timestamp=ts))
    step(tf.constant([1, 2, 3, 4], tf.int64), tf.constant([0], tf.int64))
    rows = []
    for turn in range(2):
        step(tf.constant([1], tf.int64), tf.constant([100 * (turn + 1)], tf.int64))
        assert layer.evict() == (3 if turn == 0 else 1)  # 2, 3, 4; then 10
        out = step(tf.constant([10 + turn], tf.int64),
                   tf.constant([100 * (turn + 1)], tf.int64)).numpy()
        rows.append(out[0])
        assert np.all((out >= 2.0) & (out < 3.0))
    assert not np.array_equal(rows[0], rows[1])  # a new draw at each refill

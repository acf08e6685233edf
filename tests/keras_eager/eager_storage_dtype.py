"""mk.Embedding(storage_dtype=...) in eager mode: bfloat16 and float16 rows (and slots) train
as the NumPy reference of tests/test_storage_dtype.py (float32 rules, rounded to the storage
dtype after every update, the rounding the Session path's tests check its tables against),
with admission and eviction, with a host and an SSD tier; checkpoints and weights files
round-trip bit-exactly and restore into float32 tables; the serving export serves the
upcast rows (run by tests/test_keras_eager.py).

The loss is linear in the embeddings with dyadic coefficients (the reference's stream), so a
row's gradient is exact in any summation order.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from _support import fresh  # noqa: E402, F401 (autouse: init() and a clean session per test)
from test_storage_dtype import DIM, INIT, ROUND, Reference, _bits, _stream  # noqa: E402
from test_storage_dtype_tiers import _stream as _tier_stream  # noqa: E402

import mxrec.keras as mk  # noqa: E402
from mxrec.export import saved_model  # noqa: E402
from mxrec.keras.saving import build_optimizer  # noqa: E402
from mxrec.util import initialize  # noqa: E402

# The reference's hyperparameters (tests/test_storage_dtype.py's OPTIMIZERS).
OPTIMIZERS = {
    "sgd": lambda: mk.optimizers.SGD(0.3),
    "adagrad": lambda: mk.optimizers.Adagrad(0.2, initial_accumulator_value=0.5),
    "lazy_adam": lambda: mk.optimizers.LazyAdam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-6),
}
SLOT_NAMES = {"sgd": (), "adagrad": ("accumulator",), "lazy_adam": ("m", "v")}


class Trainer:
    """One table and a tf.function step: loss = sum(embedding * coef); with admission
    (access_threshold 2) and eviction (every `evict_every` steps, IDs unseen for `max_age`
    steps; the Session path's tests' models)."""

    def __init__(self, optimizer, storage, capacity=64, evict_every=4, max_age=2, **kwargs):
        self.evict_every, self.max_age = evict_every, max_age
        self.layer = mk.Embedding(DIM, "item", capacity,
                                  embeddings_initializer=tf.keras.initializers.Constant(INIT),
                                  access_threshold=2, eviction_threshold=3,
                                  storage_dtype=storage, **kwargs)
        self.optimizer = OPTIMIZERS[optimizer]()
        layer, opt = self.layer, self.optimizer

        @tf.function
        def step(ids, coef, time):
            with tf.GradientTape() as tape:
                emb = layer(ids, timestamp=time)
                loss = tf.reduce_sum(emb * coef)
            weights = layer.trainable_weights
            opt.apply_gradients(zip(tape.gradient(loss, weights), weights))
            return emb

        self._step = step

    def step(self, index, batch):
        ids, coef = batch
        emb = self._step(tf.constant(ids), tf.constant(coef), tf.constant(index + 1, tf.int64))
        assert emb.dtype == tf.float32
        if (index + 1) % self.evict_every == 0:
            self.layer.evict(self.max_age)

    def rows(self, slots=False):
        """{id: row as float32} of every admitted ID, wherever it rests; with slots
        {component: {id: values}} of the rows and the optimizer's slots."""
        values = self.layer.export_values(self.optimizer if slots else None)
        out = {name: {int(k): np.asarray(v, np.float32) for k, v in zip(*pair)}
               for name, pair in values.items()}
        return out if slots else out["embedding"]


def _train(optimizer, storage, slots="float32", batches=None, **kwargs):
    """Trains `batches` (the reference's stream by default), stepping the Reference along;
    (trainer, reference)."""
    batches = batches or _stream()
    ref = Reference(optimizer, ROUND[storage], ROUND[slots])
    trainer = Trainer(optimizer, storage, slot_dtype=slots, **kwargs)
    held = set()
    for index, batch in enumerate(batches):
        trainer.step(index, batch)
        admitted = set(trainer.rows())
        grads = {}
        for key, coef in zip(*batch):
            if int(key) in admitted:
                grads[int(key)] = grads.get(int(key), np.zeros(DIM, np.float32)) + coef
        for key in grads:
            if key not in held:  # new, or evicted and admitted again
                ref.fresh(key)
        ref.update(grads)
        held = set(trainer.rows())
    return trainer, ref


def _assert_rows_equal(got, want, storage):
    keys = sorted(got)
    have = np.stack([got[k] for k in keys])
    want = np.stack([want[k] for k in keys])
    if storage == "float32":
        np.testing.assert_array_equal(have.view(np.uint32), want.view(np.uint32))
    else:
        np.testing.assert_array_equal(_bits(have, storage), _bits(want, storage))


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_half_table_equals_the_rounded_reference(storage, optimizer):
    trainer, ref = _train(optimizer, storage)
    got = trainer.rows()
    assert got and set(got) <= set(ref.rows)
    _assert_rows_equal(got, ref.rows, storage)
    variable = trainer.layer.table.variable
    assert variable.dtype.base_dtype == getattr(tf, storage)
    for name in SLOT_NAMES[optimizer]:
        assert trainer.optimizer.table_slot(trainer.layer, name).dtype.base_dtype == tf.float32


@pytest.mark.parametrize("storage, slots, optimizer", [
    ("bfloat16", "bfloat16", "adagrad"), ("float32", "float16", "lazy_adam")])
def test_half_slots_equal_the_rounded_reference(storage, slots, optimizer):
    trainer, ref = _train(optimizer, storage, slots)
    _assert_rows_equal(trainer.rows(), ref.rows, storage)
    for name in SLOT_NAMES[optimizer]:
        assert trainer.optimizer.table_slot(trainer.layer, name).dtype.base_dtype == getattr(
            tf, slots)


@pytest.mark.parametrize("storage, optimizer", [("bfloat16", "adagrad"),
                                                ("float16", "lazy_adam")])
def test_tiered_half_table_equals_the_rounded_reference(tmp_path, storage, optimizer):
    """16 device rows over a host tier of 8 and an SSD tier, 48 IDs drawn evenly (the tiered
    Session tests' stream): rows and slots move through both tiers (rounded only by the
    updates: the tiers hold the half values exactly)."""
    trainer, ref = _train(optimizer, storage, batches=_tier_stream(), capacity=16,
                          evict_every=5, max_age=8, host_vocabulary_size=8,
                          ssd_vocabulary_size=64, ssd_data_path=[str(tmp_path)])
    stats = trainer.layer.tier_stats()
    assert stats["swap_in_total"] > 0 and stats["ssd_rows"] > 0
    _assert_rows_equal(trainer.rows(), ref.rows, storage)


def test_stochastic_rounding_repeats_and_differs_from_nearest():
    runs = []
    for rounding in (("stochastic", 7), ("stochastic", 7), "nearest"):
        trainer, _ = _train("adagrad", "bfloat16", rounding=rounding)
        runs.append(trainer.rows())
        initialize.terminate_config_initializer()
        tf.keras.backend.clear_session()
        mk.init()
    counter = [w for w in trainer.layer.weights if "mxrec_rounding_updates" in w.name]
    assert not counter  # the last run rounds to nearest: no counter
    keys = sorted(runs[0])
    stack = [np.stack([run[k] for k in keys]).view(np.uint32) for run in runs]
    np.testing.assert_array_equal(stack[0], stack[1])
    assert not np.array_equal(stack[0], stack[2])


def _model(storage, slots="float32"):
    layer = mk.Embedding(DIM, "item", 64,
                         embeddings_initializer=tf.keras.initializers.RandomUniform(-0.3, 0.3,
                                                                                    seed=1),
                         storage_dtype=storage, slot_dtype=slots)
    ids = tf.keras.Input([3], dtype=tf.int64, name="ids")
    out = tf.keras.layers.Dense(1, name="logit")(tf.keras.layers.Flatten()(layer(ids)))
    model = tf.keras.Model(ids, out)
    model.compile(optimizer=mk.optimizers.Adagrad(0.2, initial_accumulator_value=0.5),
                  loss="mse")
    return model, layer


def _data(seed=0, n=48):
    rng = np.random.default_rng(seed)
    return (rng.integers(-(2**62), 2**62, size=30, dtype=np.int64)[rng.integers(0, 30, (n, 3))],
            rng.normal(size=(n, 1)).astype(np.float32))


def _restart():
    initialize.terminate_config_initializer()
    tf.keras.backend.clear_session()
    mk.init()


def _state(model, layer):
    values = layer.export_values(model.optimizer)
    return {name: (ids, np.asarray(v, np.float32)) for name, (ids, v) in values.items()}


def _assert_state_equal(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name][0], want[name][0])
        np.testing.assert_array_equal(got[name][1].view(np.uint32), want[name][1].view(np.uint32))


@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_checkpoints_round_trip_bit_exactly_and_restore_into_float32(tmp_path, storage):
    model, layer = _model(storage, slots=storage)
    x, y = _data()
    directory = str(tmp_path / "versions")
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0,
              callbacks=[mk.callbacks.Checkpoint(directory, full_every=100, delta_every=3)])
    saved = _state(model, layer)
    rows = saved["embedding"][1]
    assert np.array_equal(rows, ROUND[storage](rows))  # half values, not float32 ones
    model.save_weights(str(tmp_path / "m.weights.h5"))
    predicted = model.predict(x, verbose=0)

    _restart()  # mxrec's versions (full + deltas), into the same storage: the same bits
    model, layer = _model(storage, slots=storage)
    mk.KerasSaver(directory, model, model.optimizer).restore()
    _assert_state_equal(_state(model, layer), saved)
    np.testing.assert_array_equal(model.predict(x, verbose=0), predicted)

    _restart()  # Keras' weights file
    model, layer = _model(storage, slots=storage)
    build_optimizer(model.optimizer, model)
    model.load_weights(str(tmp_path / "m.weights.h5"))
    _assert_state_equal(_state(model, layer), saved)

    _restart()  # into float32 rows and slots: the stored values, upcast exactly
    model, layer = _model("float32")
    mk.KerasSaver(directory, model, model.optimizer).restore()
    _assert_state_equal(_state(model, layer), saved)
    mk.KerasSaver(str(tmp_path / "f32"), model, model.optimizer).save(kind="full")

    _restart()  # and back into half precision: exact (every value is a half value)
    model, layer = _model(storage, slots=storage)
    mk.KerasSaver(str(tmp_path / "f32"), model, model.optimizer).restore()
    _assert_state_equal(_state(model, layer), saved)


def _serve(export_dir, x):
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    return signature(ids=tf.constant(x))["logit"].numpy()


def test_the_serving_export_serves_the_upcast_rows_and_int8_within_its_bound(tmp_path):
    model, _ = _model("bfloat16")
    x, y = _data()
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    served = _serve(mk.export_serving(model, str(tmp_path / "serving" / "1")), x)
    np.testing.assert_allclose(served, model.predict(x, verbose=0), rtol=0, atol=1e-6)
    # int8: each element of a row is off by at most half its row's scale, so the logit
    # (a Dense over the 3 flattened rows) by at most sum_k scale_k / 2 * sum_j |w_kj|.
    int8_dir = mk.export_serving(model, str(tmp_path / "serving" / "2"), quantize="int8")
    table = saved_model.exported_tables(int8_dir)["item"]
    scale = dict(zip(table["ids"].tolist(), table["scale_offset"][:, 0]))
    kernel = np.abs(model.get_layer("logit").get_weights()[0][:, 0]).reshape(3, DIM).sum(1)
    bound = np.array([sum(scale[k] / 2 * kernel[p] for p, k in enumerate(row)) for row in x])
    error = np.abs(_serve(int8_dir, x)[:, 0] - served[:, 0])
    assert np.all(error <= bound * (1 + 1e-4) + 1e-6) and error.max() > 0
    with pytest.raises(ValueError, match="quantize must be None"):
        mk.export_serving(model, str(tmp_path / "serving" / "3"), quantize="int4")


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(storage_dtype="int8"), TypeError, "storage_dtype must be one of"),
    (dict(storage_dtype=tf.float64), TypeError, "storage_dtype must be tf.float32"),
    (dict(slot_dtype="fp8"), TypeError, "slot_dtype must be one of"),
    (dict(storage_dtype="bf16", rounding="up"), ValueError, "rounding must be"),
    (dict(storage_dtype="bf16", dtype="bfloat16"), TypeError, "storage_dtype= sets"),
])
def test_bad_storage_settings_are_refused(kwargs, error, text):
    with pytest.raises(error, match=text):
        mk.Embedding(DIM, "item", 16, **kwargs)

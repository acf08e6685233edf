"""Tables whose rows rest in bfloat16 or float16 (create_table(storage_dtype=...)).

The reference is NumPy: a float32 model of each ID's row and slots, updated by the
optimizer's rule and rounded to the storage dtype after every update (round-to-nearest-even,
written here with integer arithmetic on the bits for bfloat16, NumPy's float16 cast for
float16). The loss is linear in the embeddings with dyadic coefficients, so the gradient of
a row (a sum over its positions) is exact in any summation order and the reference needs no
model of TF's reductions. Admission and eviction decide which IDs hold a row (read from the
engine after each step); the values are the reference's own.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup
from mxrec.optimizers import adagrad, ftrl, gradient_descent, lazy_adam, momentum
from mxrec.saver.checkpoint import Saver
from mxrec.util.initialize import init, terminate_config_initializer

DIM = 4
BATCH = 12
STEPS = 14
VOCAB = 30
INIT = 0.1  # not representable in bfloat16 or float16: the initial rows are rounded too
_v1 = tf.compat.v1

OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(0.3),
    "adagrad": lambda: adagrad.create_hash_optimizer(0.2, initial_accumulator_value=0.5),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(0.05, beta1=0.8, beta2=0.95,
                                                         epsilon=1e-6),
    "momentum": lambda: momentum.create_hash_optimizer(0.1, momentum=0.9),
}


# ----------------------------------------------------------------- the NumPy reference

def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def ROUND_NONE(x):  # noqa: N802 (a rounding, as ROUND's)
    return np.asarray(x, np.float32)


ROUND = {"bfloat16": round_bf16,
         "float16": lambda x: np.asarray(x, np.float32).astype(np.float16).astype(np.float32),
         "float32": lambda x: np.asarray(x, np.float32)}


class Reference:
    """Each ID's row and slots in float32, rounded to the storage dtype after each update."""

    def __init__(self, optimizer: str, rounding, slot_rounding=ROUND_NONE):
        self.optimizer, self.round, self.slot_round = optimizer, rounding, slot_rounding
        self.rows, self.slots = {}, {}
        self.step = 0
        self.b1p, self.b2p = np.float32(0.8), np.float32(0.95)

    def fresh(self, key):
        self.rows[key] = self.round(np.full(DIM, INIT, np.float32))
        self.slots[key] = {"sgd": {}, "adagrad": {"acc": np.full(DIM, 0.5, np.float32)},
                           "lazy_adam": {"m": np.zeros(DIM, np.float32),
                                         "v": np.zeros(DIM, np.float32)},
                           "momentum": {"acc": np.zeros(DIM, np.float32)}}[self.optimizer]

    def update(self, grads):
        f = np.float32
        for key, g in grads.items():
            row, slot = self.rows[key], self.slots[key]
            if self.optimizer == "sgd":
                new = row - f(0.3) * g
            elif self.optimizer == "adagrad":
                slot["acc"] = slot["acc"] + g * g
                new = row - f(0.2) * g / np.sqrt(slot["acc"])
            elif self.optimizer == "momentum":
                slot["acc"] = f(0.9) * slot["acc"] + g
                new = row - f(0.1) * slot["acc"]
            else:
                step_size = f(0.05) * np.sqrt(f(1) - self.b2p) / (f(1) - self.b1p)
                slot["m"] = f(0.8) * slot["m"] + (f(1) - f(0.8)) * g
                slot["v"] = f(0.95) * slot["v"] + (f(1) - f(0.95)) * np.square(g)
                new = row - step_size * slot["m"] / (np.sqrt(slot["v"]) + f(1e-6))
            self.rows[key] = self.round(new.astype(np.float32))
            # The row's rule used the float32 slots; they are stored rounded.
            for name in slot:
                slot[name] = self.slot_round(slot[name])
        self.b1p, self.b2p = f(self.b1p * f(0.8)), f(self.b2p * f(0.95))


def _stream(seed=5):
    rng = np.random.default_rng(seed)
    vocab = rng.integers(-(2**63), 2**63 - 1, size=VOCAB, dtype=np.int64)
    batches = []
    for _ in range(STEPS):
        ids = vocab[rng.zipf(1.5, size=BATCH) % VOCAB]
        # Dyadic coefficients: any sum of a few is exact in float32.
        coef = rng.integers(-40, 41, size=(BATCH, DIM)).astype(np.float32) / 64.0
        batches.append((ids, coef))
    return batches


# ----------------------------------------------------------------------- the model

class Model:
    """One table; loss = sum(embedding * coef) (gradient of a row: its coefficients summed)."""

    def __init__(self, optimizer, storage, admission=False, name="item", capacity=64, **kw):
        init(prefetch_batch_number=0)
        self.table = create_table(tf.int64, DIM, name, _v1.constant_initializer(INIT),
                                  device_vocabulary_size=capacity, storage_dtype=storage, **kw)
        self.ids = _v1.placeholder(tf.int64, [None])
        self.coef = _v1.placeholder(tf.float32, [None, DIM])
        self.time = _v1.placeholder_with_default(tf.constant(0, tf.int64), [])
        add_timestamp(self.time)
        self.admission = admission
        config = {"access_threshold": 2, "eviction_threshold": 3} if admission else None
        emb = sparse_lookup(self.table, self.ids, access_and_evict_config=config)
        assert emb.dtype == tf.float32
        loss = tf.reduce_sum(emb * self.coef)
        variable = self.table.variable
        self.train = OPTIMIZERS[optimizer]().apply_gradients(
            [(tf.gradients(loss, variable)[0], variable)])

    def step(self, sess, index, batch):
        ids, coef = batch
        sess.run(self.train, {self.ids: ids, self.coef: coef, self.time: index + 1})
        if self.admission and (index + 1) % 4 == 0:
            self.table.evict(2)

    def rows(self, sess):
        """{id: stored row as float32} of every admitted ID."""
        ids, rows = self.table.export_rows()
        values = np.asarray(sess.run(self.table.variable)).astype(np.float32)
        return {int(k): values[r] for k, r in zip(ids, rows)}


def _train_with_reference(optimizer, storage, admission, slots="float32"):
    batches = _stream()
    ref = Reference(optimizer, ROUND[storage], ROUND[slots])
    with tf.Graph().as_default():
        model = Model(optimizer, getattr(tf, storage), admission, slot_dtype=getattr(tf, slots))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            held = set()
            for index, batch in enumerate(batches):
                model.step(sess, index, batch)
                admitted = set(model.rows(sess))
                grads = {}
                for key, coef in zip(*batch):
                    key = int(key)
                    if key in admitted:
                        grads[key] = grads.get(key, np.zeros(DIM, np.float32)) + coef
                for key in grads:
                    if key not in held:  # new, or evicted and admitted again
                        ref.fresh(key)
                ref.update(grads)
                held = set(model.rows(sess))  # after this step's eviction
            got = model.rows(sess)
        terminate_config_initializer()
    return got, ref


def _bits(values: np.ndarray, storage: str) -> np.ndarray:
    if storage == "bfloat16":
        return np.asarray(values, np.float32).view(np.uint32) >> 16
    return np.asarray(values, np.float32).astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("admission", [False, True], ids=["device_only", "admission_eviction"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_rows_equal_the_rounded_reference(storage, optimizer, admission):
    got, ref = _train_with_reference(optimizer, storage, admission)
    assert got and set(got) == set(ref.rows) & set(got)
    keys = sorted(got)
    want = np.stack([ref.rows[k] for k in keys])
    have = np.stack([got[k] for k in keys])
    np.testing.assert_array_equal(_bits(have, storage), _bits(want, storage))


@pytest.mark.parametrize("optimizer", ["adagrad", "lazy_adam"])
@pytest.mark.parametrize("storage, slots", [("bfloat16", "bfloat16"), ("float32", "float16")])
def test_slots_in_half_precision_equal_the_rounded_reference(storage, slots, optimizer):
    got, ref = _train_with_reference(optimizer, storage, True, slots)
    keys = sorted(got)
    want = np.stack([ref.rows[k] for k in keys])
    have = np.stack([got[k] for k in keys])
    if storage == "float32":
        np.testing.assert_array_equal(have.view(np.uint32), want.view(np.uint32))
    else:
        np.testing.assert_array_equal(_bits(have, storage), _bits(want, storage))


def test_rounding_changes_the_result():
    """The reference would notice a table that kept float32 rows: the unrounded float32
    rows differ from the bfloat16 ones."""
    got_bf16, _ = _train_with_reference("adagrad", "bfloat16", False)
    got_f32, _ = _train_with_reference("adagrad", "float32", False)
    keys = sorted(got_bf16)
    assert not np.array_equal(np.stack([got_bf16[k] for k in keys]),
                              np.stack([got_f32[k] for k in keys]))


def test_variable_and_slots_rest_in_their_dtypes():
    with tf.Graph().as_default():
        model = Model("adagrad", "bf16", slot_dtype=tf.float32)
        assert model.table.variable.dtype.base_dtype == tf.bfloat16
        assert model.table.storage_dtype == tf.bfloat16
        slot = model.table.optimizers[0].get_slot(model.table.variable, "accumulator")
        assert slot.dtype.base_dtype == tf.float32
        terminate_config_initializer()


# -------------------------------------------------------------------------- checkpoints

def _save(tmp_path, optimizer, storage, batches):
    with tf.Graph().as_default():
        model = Model(optimizer, storage)
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            for index, batch in enumerate(batches):
                model.step(sess, index, batch)
            Saver(str(tmp_path)).save(sess, len(batches))
            rows = model.rows(sess)
        terminate_config_initializer()
    return rows


def _restore(tmp_path, optimizer, storage):
    with tf.Graph().as_default():
        model = Model(optimizer, storage)
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            Saver(str(tmp_path)).restore(sess)
            rows = model.rows(sess)
            slots = {name: np.asarray(sess.run(model.table.optimizers[0].get_slot(
                model.table.variable, name))) for name in
                model.table.optimizers[0].get_slot_names()}
            ids, device_rows = model.table.export_rows()
        terminate_config_initializer()
    return rows, {k: v[device_rows] for k, v in slots.items()}


@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_checkpoint_round_trips_bit_exactly_and_across_dtypes(tmp_path, storage):
    batches = _stream()
    saved = _save(tmp_path / "half", "adagrad", getattr(tf, storage), batches)
    file = next((tmp_path / "half").rglob("*.npz"))
    assert file.stat().st_size > 0
    restored, _ = _restore(tmp_path / "half", "adagrad", getattr(tf, storage))
    assert set(restored) == set(saved)
    for key in saved:
        np.testing.assert_array_equal(_bits(restored[key], storage), _bits(saved[key], storage))
    # Into a float32 table: the stored values, upcast exactly.
    upcast, _ = _restore(tmp_path / "half", "adagrad", tf.float32)
    for key in saved:
        np.testing.assert_array_equal(upcast[key], saved[key])
    # A float32 table's checkpoint into a reduced one: each value rounded to nearest.
    full = _save(tmp_path / "full", "adagrad", tf.float32, batches)
    down, _ = _restore(tmp_path / "full", "adagrad", getattr(tf, storage))
    for key in full:
        np.testing.assert_array_equal(_bits(down[key], storage),
                                      _bits(ROUND[storage](full[key]), storage))


def test_checkpoint_file_holds_two_bytes_per_value(tmp_path):
    from mxrec.saver import stream

    batches = _stream()
    _save(tmp_path / "bf16", "sgd", tf.bfloat16, batches)
    _save(tmp_path / "f32", "sgd", tf.float32, batches)
    arrays = {}
    for name in ("bf16", "f32"):
        path = next(p for p in (tmp_path / name).rglob("*.npz") if p.name != "dense.npz")
        arrays[name] = stream.MappedNpz(str(path))["state/embedding"]
    assert arrays["bf16"].dtype == np.uint16 and arrays["f32"].dtype == np.float32
    assert arrays["bf16"].nbytes * 2 == arrays["f32"].nbytes


# ------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("kwargs, error, text", [
    (dict(storage_dtype=tf.int8), TypeError, "storage_dtype must be"),
    (dict(storage_dtype="bf8"), TypeError, "storage_dtype must be one of"),
    (dict(slot_dtype=tf.float64), TypeError, "slot_dtype must be"),
    (dict(rounding="up"), ValueError, "rounding must be"),
    (dict(rounding=("nearest", 1)), ValueError, "rounding must be"),
])
def test_bad_storage_settings_are_refused(kwargs, error, text):
    with tf.Graph().as_default():
        init(prefetch_batch_number=0)
        with pytest.raises(error, match=text):
            create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                         device_vocabulary_size=16, **kwargs)
        terminate_config_initializer()


def test_half_precision_under_dynamic_expansion_is_refused():
    with tf.Graph().as_default():
        init(prefetch_batch_number=0, use_dynamic_expansion=True)
        with pytest.raises(NotImplementedError, match="use_dynamic_expansion=True\\) is not built"):
            create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                         device_vocabulary_size=16, storage_dtype=tf.bfloat16)
        terminate_config_initializer()


def test_optimizer_without_a_float32_rule_is_refused():
    with tf.Graph().as_default():
        init(prefetch_batch_number=0)
        table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                             device_vocabulary_size=16, storage_dtype=tf.bfloat16)
        emb = sparse_lookup(table, _v1.placeholder(tf.int64, [None]))
        grad = tf.gradients(tf.reduce_sum(emb), table.variable)[0]
        with pytest.raises(NotImplementedError, match="cannot train table 't'"):
            ftrl.create_hash_optimizer(0.1).apply_gradients([(grad, table.variable)])
        terminate_config_initializer()


# ------------------------------------------------------------- the streaming trainer

def test_quality_report_trains_and_scores_half_precision_models(tmp_path):
    """The streaming trainer's tables in bfloat16 and float16 (`python -m mxrec.quality
    --compare float32,bfloat16,float16`): a model dir each, checkpoints in 2-byte values,
    served rows that are bfloat16 values, half the training bytes per ID."""
    import dataclasses

    from serving_streams import SCHEMA, write

    from mxrec.export import saved_model as serving
    from mxrec.quality import report
    from mxrec.saver import stream
    from mxrec.streaming import models
    from mxrec.streaming.trainer import StreamConfig

    partitions = [f"20240101/{hour:02d}" for hour in range(3)]
    write(tmp_path / "data", partitions, rows=120)
    config = StreamConfig(data=str(tmp_path / "data"), schema=SCHEMA,
                          workdir=str(tmp_path / "model"), batch_size=32, progress=False,
                          tensorboard=False, threads=1, validation="none")
    model = models.ModelConfig("wide_deep", dim=8, hidden=(8,), vocabulary=3000,
                               init_stddev=0.05)
    rows = report.compare(config, model, ["float32", "bfloat16", "float16"])
    assert [r.form for r in rows] == ["float32", "bfloat16", "float16"]
    assert all(r.rows == 120 for r in rows)
    assert rows[0].ids == rows[1].ids == rows[2].ids > 0  # admission: every ID at once
    assert rows[1].train_bytes_per_id == rows[2].train_bytes_per_id \
        == rows[0].train_bytes_per_id / 2
    assert abs(rows[1].auc - rows[0].auc) < 0.05 and rows[1].logloss != rows[0].logloss
    assert "| bfloat16 |" in report.table(rows)
    # Per tier, an ID's embedding (4 or 2 bytes a value) and Adagrad accumulator (float32):
    # the device variables and a host slot hold V = dim (w + 4) bytes, an SSD record 16 + V
    # (cc_ops/engine/row_format.h, ssd_tier.h), averaged over the tables by their IDs.
    tables = serving.exported_tables(report._export(
        report.train(config, model, [], []), str(tmp_path / "export32"), None))
    for row, width in zip(rows, (4, 2, 2)):
        per_id = sum(len(t["ids"]) * t["embeddings"].shape[1] * (width + 4)
                     for t in tables.values()) / row.ids
        assert row.tiers == pytest.approx(report.tier_bytes.TierBytes(per_id, per_id,
                                                                      16 + per_id))
    bf16 = tmp_path / "model" / "storage-bfloat16"
    files = [p for p in bf16.rglob("*.npz") if p.name != "dense.npz"]
    assert {stream.MappedNpz(str(p))["state/embedding"].dtype for p in files} \
        == {np.dtype(np.uint16)}
    trainer = report.train(dataclasses.replace(config, workdir=str(bf16)),
                           dataclasses.replace(model, storage_dtype="bfloat16"), [], [])
    export = report._export(trainer, str(tmp_path / "export"), None)
    for table in serving.exported_tables(export).values():
        values = np.asarray(table["embeddings"], np.float32)
        assert len(values)
        np.testing.assert_array_equal(values, round_bf16(values))
    with pytest.raises(ValueError, match="storage_dtype must be one of"):
        models.ModelConfig(storage_dtype="int8")


# ------------------------------------------------------------------ stochastic rounding

# Per storage dtype: an SGD update below half the dtype's step under 1.0 (nearest rounding
# never moves a row of 1.0), and the tolerance of the mean of 32 stochastically rounded values.
TINY = {"bfloat16": (2.0**-10, 0.02), "float16": (2.0**-13, 0.004)}


def _tiny_updates(storage, rounding, steps=300):
    """Rows of 8 IDs after `steps` SGD updates of TINY's size each."""
    ids = np.arange(8, dtype=np.int64) * 7919
    coef = np.full((8, DIM), TINY[storage.name][0] / 0.3, np.float32)
    with tf.Graph().as_default():
        init(prefetch_batch_number=0)
        table = create_table(tf.int64, DIM, "s", _v1.constant_initializer(1.0),
                             device_vocabulary_size=16, storage_dtype=storage,
                             rounding=rounding)
        ids_t = _v1.placeholder(tf.int64, [None])
        coef_t = _v1.placeholder(tf.float32, [None, DIM])
        loss = tf.reduce_sum(sparse_lookup(table, ids_t) * coef_t)
        train = OPTIMIZERS["sgd"]().apply_gradients(
            [(tf.gradients(loss, table.variable)[0], table.variable)])
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            for _ in range(steps):
                sess.run(train, {ids_t: ids, coef_t: coef})
            _, rows = table.export_rows()
            values = np.asarray(sess.run(table.variable)).astype(np.float32)[rows]
        terminate_config_initializer()
    return values


@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_stochastic_rounding_keeps_small_updates_and_repeats(storage):
    dtype = getattr(tf, storage)
    nearest = _tiny_updates(dtype, "nearest")
    np.testing.assert_array_equal(nearest, 1.0)  # every update rounded away
    first = _tiny_updates(dtype, ("stochastic", 3))
    update, tolerance = TINY[storage]
    want = 1.0 - 300 * update  # the float32 run
    # Unbiased: the mean of 32 values near the float32 value (nearest stays at 1.0).
    assert abs(first.mean() - want) < tolerance < 1.0 - want, first.mean()
    assert np.all(ROUND[storage](first) == first)  # stored values of the dtype
    np.testing.assert_array_equal(_tiny_updates(dtype, ("stochastic", 3)), first)
    assert not np.array_equal(_tiny_updates(dtype, ("stochastic", 4)), first)


def test_stochastic_rounding_seed_is_checked():
    with tf.Graph().as_default():
        init(prefetch_batch_number=0)
        with pytest.raises(ValueError, match="seed of rounding"):
            create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                         device_vocabulary_size=16, storage_dtype=tf.bfloat16,
                         rounding=("stochastic", -1))
        terminate_config_initializer()


def _run_steps(storage, batches, first, restore_from=None, save_to=None, saver_kind="mxrec",
               **kw):
    """Trains `batches` (steps first+1...) on a fresh graph, restored from `restore_from`
    first and saved to `save_to` after; returns the rows."""
    with tf.Graph().as_default():
        model = Model("adagrad", storage, **kw)
        saver = Saver if saver_kind == "mxrec" else None
        tf_saver = _v1.train.Saver() if saver is None else None
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            if restore_from is not None:
                if saver is None:
                    tf_saver.restore(sess, restore_from)
                else:
                    saver(restore_from).restore(sess)
            for index, batch in enumerate(batches):
                model.step(sess, first + index, batch)
            if save_to is not None:
                if saver is None:
                    tf_saver.save(sess, save_to)
                else:
                    saver(save_to).save(sess, first + len(batches))
            rows = model.rows(sess)
        terminate_config_initializer()
    return rows


@pytest.mark.parametrize("saver_kind, rounding", [("mxrec", ("stochastic", 5)),
                                                  ("tf", "nearest")])
def test_save_restore_continue_equals_a_straight_run(tmp_path, saver_kind, rounding):
    """bfloat16 rows through mxrec's Saver (with stochastic rounding: its update count is
    saved too) and through TF's Saver: the rest of the run gives the same bits."""
    batches = _stream()
    straight = _run_steps(tf.bfloat16, batches, 0, rounding=rounding)
    path = str(tmp_path / ("ckpt" if saver_kind == "tf" else "mxrec"))
    _run_steps(tf.bfloat16, batches[:6], 0, save_to=path, saver_kind=saver_kind,
               rounding=rounding)
    resumed = _run_steps(tf.bfloat16, batches[6:], 6, restore_from=path,
                         saver_kind=saver_kind, rounding=rounding)
    assert sorted(resumed) == sorted(straight)
    for key, row in straight.items():
        np.testing.assert_array_equal(_bits(resumed[key], "bfloat16"), _bits(row, "bfloat16"))


@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_a_non_finite_half_precision_row_is_refused_by_the_finite_check(tmp_path, storage):
    from mxrec.saver.checkpoint import NonFiniteError

    with tf.Graph().as_default():
        model = Model("sgd", getattr(tf, storage))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            model.step(sess, 0, _stream()[0])
            ids, rows = model.table.export_rows()
            sess.run(model.table.variable[int(rows[0])].assign(
                tf.fill([DIM], tf.constant(np.inf, getattr(tf, storage)))))
            with pytest.raises(NonFiniteError, match=f"ID {int(ids[0])}"):
                Saver(str(tmp_path), check_finite=True).save(sess, 1)
        terminate_config_initializer()

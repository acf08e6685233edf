"""bfloat16 and float16 tables with a host tier, and with host and SSD tiers.

The tiers store each component in its dtype (the rows in storage_dtype, the optimizer slots
in slot_dtype: 2 bytes a value in host memory and in the SSD file) behind float32
interfaces. A tiered half table trains as the device-only half table and as the NumPy
reference of tests/test_storage_dtype.py (float32 rules, rounded after every update), bit
for bit, with admission and eviction; its checkpoints round-trip bit-exactly and restore into
a float32 tiered table and back; its tier statistics count 2 bytes a half value.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_storage_dtype import DIM, ROUND, Model, Reference, _bits

from mxrec.core import tiers
from mxrec.quality import tier_bytes
from mxrec.saver import stream
from mxrec.saver.checkpoint import Saver
from mxrec.util.initialize import terminate_config_initializer

_v1 = tf.compat.v1
IDS = 48
DEVICE = 16  # rows of the device cache: most steps swap rows with the tiers
HOST = 8     # with an SSD tier: the rest of the tier's IDs rest on disk


def _stream(seed=5, steps=20, batch=8):
    """As tests/test_storage_dtype.py's stream, with IDs drawn evenly from more of them:
    most IDs are admitted (seen twice) and move between the device and the tiers."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(-(2**63), 2**63 - 1, size=IDS, dtype=np.int64)
    return [(vocab[rng.integers(0, IDS, size=batch)],
             rng.integers(-40, 41, size=(batch, DIM)).astype(np.float32) / 64.0)
            for _ in range(steps)]


def _tier_kwargs(tiering, path):
    if tiering == "host":
        return dict(host_vocabulary_size=64)
    return dict(host_vocabulary_size=HOST, ssd_vocabulary_size=64, ssd_data_path=str(path))


class TieredModel(Model):
    """Model (tests/test_storage_dtype.py) whose rows are read wherever they rest, and
    whose eviction keeps IDs for longer (most IDs then pass through the tiers)."""

    def step(self, sess, index, batch):
        ids, coef = batch
        sess.run(self.train, {self.ids: ids, self.coef: coef, self.time: index + 1})
        if self.admission and (index + 1) % 5 == 0:
            self.table.evict(8)

    def rows(self, sess, slots=False):
        values = tiers.export_values(sess, self.table, slots=slots)
        if slots:
            return {name: {int(k): np.asarray(v, np.float32) for k, v in zip(*pair)}
                    for name, pair in values.items()}
        ids, rows = values[tiers.EMBEDDING]
        return {int(k): np.asarray(v, np.float32) for k, v in zip(ids, rows)}


def _train(optimizer, storage, slots, tier_kwargs, batches, ref=None):
    """Trains `batches` with admission and eviction; returns ({id: row}, tier stats seen),
    stepping `ref` (a Reference) along with the table's admitted IDs."""
    seen = {"ssd_rows": 0, "swap_in_total": 0}
    with tf.Graph().as_default():
        model = TieredModel(optimizer, getattr(tf, storage), True,
                            capacity=DEVICE if tier_kwargs else 64,
                            slot_dtype=getattr(tf, slots), **tier_kwargs)
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            held = set()
            for index, batch in enumerate(batches):
                model.step(sess, index, batch)
                if tier_kwargs:
                    stats = tiers.stats(model.table)
                    for name in seen:
                        seen[name] = max(seen[name], stats[name])
                if ref is None:
                    continue
                admitted = set(model.rows(sess))
                grads = {}
                for key, coef in zip(*batch):
                    if int(key) in admitted:
                        grads[int(key)] = grads.get(int(key), np.zeros(DIM, np.float32)) + coef
                for key in grads:
                    if key not in held:
                        ref.fresh(key)
                ref.update(grads)
                held = set(model.rows(sess))
            got = model.rows(sess)
        terminate_config_initializer()
    return got, seen


CASES = [  # (storage, slots, optimizer, tiers)
    ("bfloat16", "float32", "sgd", "host"),
    ("bfloat16", "float32", "adagrad", "host_ssd"),
    ("bfloat16", "float32", "lazy_adam", "host_ssd"),
    ("float16", "float32", "sgd", "host_ssd"),
    ("float16", "float32", "adagrad", "host"),
    ("float16", "float32", "lazy_adam", "host_ssd"),
    ("bfloat16", "bfloat16", "adagrad", "host_ssd"),
    ("float32", "float16", "lazy_adam", "host_ssd"),
]


@pytest.mark.parametrize("storage, slots, optimizer, tiering", CASES)
def test_tiered_half_table_equals_device_only_and_the_reference(tmp_path, storage, slots,
                                                                optimizer, tiering):
    batches = _stream()
    ref = Reference(optimizer, ROUND[storage], ROUND[slots])
    got, seen = _train(optimizer, storage, slots, _tier_kwargs(tiering, tmp_path), batches,
                       ref)
    device_only, _ = _train(optimizer, storage, slots, {}, batches)
    assert seen["swap_in_total"] > 0  # rows came back from the tiers
    if tiering == "host_ssd":
        assert seen["ssd_rows"] > 0
    keys = sorted(got)
    assert keys == sorted(device_only) and set(keys) <= set(ref.rows)
    have = np.stack([got[k] for k in keys])
    for want in (np.stack([device_only[k] for k in keys]),
                 np.stack([ref.rows[k] for k in keys])):
        if storage == "float32":
            np.testing.assert_array_equal(have.view(np.uint32), want.view(np.uint32))
        else:
            np.testing.assert_array_equal(_bits(have, storage), _bits(want, storage))


# ------------------------------------------------------------------------- checkpoints

def _run(tmp_path, storage, batches, restore_from=None, save_to=None):
    """A host+SSD tiered Adagrad table (slots in slot_dtype=storage): trained on `batches`
    after restoring `restore_from`, saved to `save_to`; its rows and slots everywhere."""
    with tf.Graph().as_default():
        model = TieredModel("adagrad", storage, True, capacity=DEVICE, slot_dtype=storage,
                            **_tier_kwargs("host_ssd", tmp_path))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            if restore_from is not None:
                Saver(str(restore_from)).restore(sess)
            for index, batch in enumerate(batches):
                model.step(sess, index, batch)
            if save_to is not None:
                Saver(str(save_to)).save(sess, len(batches))
            values = model.rows(sess, slots=True)
            stats = tiers.stats(model.table)
        terminate_config_initializer()
    return values, stats


def _assert_equal(got, want, storage):
    assert sorted(got) == sorted(want)
    for name in want:
        assert sorted(got[name]) == sorted(want[name])
        for key, value in want[name].items():
            if storage == tf.float32:
                np.testing.assert_array_equal(got[name][key].view(np.uint32),
                                              value.view(np.uint32))
            else:
                np.testing.assert_array_equal(_bits(got[name][key], storage.name),
                                              _bits(value, storage.name))


@pytest.mark.parametrize("storage", [tf.bfloat16, tf.float16])
def test_tiered_checkpoint_round_trips_and_crosses_dtypes(tmp_path, storage):
    batches = _stream()
    saved, stats = _run(tmp_path, storage, batches, save_to=tmp_path / "half")
    assert stats["ssd_rows"] > 0 and stats["host_rows"] > 0  # rows saved from both tiers
    # Every ID's row and slots (device rows, host and SSD tiers) in the table file in 2
    # bytes a value.
    file = next(p for p in (tmp_path / "half").rglob("*.npz") if p.name != "dense.npz")
    arrays = stream.MappedNpz(str(file))
    for name, rows in saved.items():
        held = [arrays[f"{part}/{name}"] for part in ("state", "tier")]
        assert {a.dtype.itemsize for a in held} == {2}
        assert sum(len(a) for a in held) == len(rows)
    restored, _ = _run(tmp_path, storage, [], restore_from=tmp_path / "half")
    _assert_equal(restored, saved, storage)
    # Into a float32 tiered table: the same values, upcast exactly; saved from there and
    # restored into the half table again: the same bits.
    upcast, _ = _run(tmp_path, tf.float32, [], restore_from=tmp_path / "half",
                     save_to=tmp_path / "f32")
    _assert_equal(upcast, saved, tf.float32)
    back, _ = _run(tmp_path, storage, [], restore_from=tmp_path / "f32")
    _assert_equal(back, saved, storage)
    # A float32 table's own values into the half table: each rounded to nearest (even).
    full, _ = _run(tmp_path, tf.float32, batches, save_to=tmp_path / "full")
    down, _ = _run(tmp_path, storage, [], restore_from=tmp_path / "full")
    rounded = {name: {k: ROUND[storage.name](v) for k, v in rows.items()}
               for name, rows in full.items()}
    _assert_equal(down, rounded, storage)


# ---------------------------------------------------------------------- bytes per ID

@pytest.mark.parametrize("storage, slots, host_row_bytes", [
    ("float32", "float32", 4 * DIM + 4 * DIM),
    ("bfloat16", "float32", 2 * DIM + 4 * DIM),
    ("bfloat16", "bfloat16", 2 * DIM + 2 * DIM),
])
def test_tier_bytes_per_id_follow_the_element_widths(tmp_path, storage, slots, host_row_bytes):
    """An Adagrad table (embedding + accumulator): a host slot and an SSD record hold the
    two components at 4 or 2 bytes a value (and the record's 16-byte header)."""
    with tf.Graph().as_default():
        model = TieredModel("adagrad", getattr(tf, storage), capacity=DEVICE,
                            slot_dtype=getattr(tf, slots), **_tier_kwargs("host_ssd", tmp_path))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            for index, batch in enumerate(_stream()):
                model.step(sess, index, batch)
            stats = tiers.stats(model.table)
        terminate_config_initializer()
    assert stats["ssd_rows"] > 0
    assert stats["host_row_bytes"] == host_row_bytes
    assert stats["ssd_record_bytes"] == 16 + host_row_bytes
    assert stats["ssd_file_bytes"] % stats["ssd_record_bytes"] == 0
    # The quality report's per-tier columns (a scratch table of the engine) equal the
    # trained table's own figures.
    assert tier_bytes.measure(DIM, storage, slots, 1) == tier_bytes.TierBytes(
        device=host_row_bytes, host=stats["host_row_bytes"], ssd=stats["ssd_record_bytes"])


# -------------------------------------------------------------------- the engine alone

def test_a_swap_of_a_value_the_storage_dtype_would_round_is_refused(engine):
    """The tier stores a bfloat16 table's rows in 2 bytes: a value that left a bfloat16
    variable fits exactly; one that does not (0.1) means the variable and the tier disagree
    on the dtype, and the swap says so instead of rounding it silently."""
    key = "tierhalf_exact"
    engine.create_table(key=key, name="exact", dim=2, capacity=2, host_capacity=8,
                        storage_dtype="bfloat16")
    try:
        exact = np.array([[0.5, -3.0], [1.0 / 256, 2.0**100]], np.float32)
        for step, batch in enumerate(([1, 2], [3, 4])):
            (_, _, reused), = engine.process([key], [np.array(batch, np.int64)], True, step)
            engine.tier_swap(key, "embedding", reused, exact[:len(reused)])
        assert len(reused) == 2  # IDs 1 and 2 went to the tier, exactly
        (_, _, reused), = engine.process([key], [np.array([1, 2], np.int64)], True, 2)
        with pytest.raises(Exception, match="bfloat16 .*cannot hold exactly"):
            engine.tier_swap(key, "embedding", reused,
                             np.full((len(reused), 2), 0.1, np.float32))
    finally:
        engine.drop_prefix(key)
    with pytest.raises(ValueError, match="storage_dtype and slot_dtype must be"):
        engine.create_table(key=key, name="exact", dim=2, capacity=2, host_capacity=8,
                            slot_dtype="int8")

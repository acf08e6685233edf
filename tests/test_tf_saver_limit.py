"""TF's Saver materialises a table's host state (the host tier as whole tensors) and a dynamic
table's store in memory: a table whose export would exceed MXREC_TF_SAVER_MAX_MB is refused
when the save runs, before anything is exported, with an error naming the table, the bytes,
the limit, the setting and mxrec's Saver; below the limit the save works as before."""

import numpy as np
import pytest
import tensorflow as tf
from support import TIER_OPTIMIZERS

from mxrec._lib import loader
from mxrec.core import host_state, tiers
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.util.initialize import init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
DIM = 8
BATCH = 16
STEPS = 6


def _train(sess_fn, tiered=True, dynamic=False):
    """Builds a table (a host tier of 1000 rows behind 64 device rows, or device-only, or
    dynamic), trains STEPS batches of Adagrad (a dynamic table: looks them up, which gives
    them rows) and returns sess_fn(sess, table)."""
    init(use_dynamic_expansion=dynamic)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 500, size=(BATCH * STEPS, 3)).astype(np.int64)
    features = _v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices(ids).batch(BATCH)).get_next()
    kwargs = dict(host_vocabulary_size=1000) if tiered else {}
    table = create_table(tf.int64, DIM, "big", _v1.constant_initializer(0.05),
                         device_vocabulary_size=64 if tiered else 1000, **kwargs)
    emb = sparse_lookup(table, features, name="lookup")
    train_op = emb
    if not dynamic:
        _, sparse = get_dense_and_sparse_variable()
        train_op = TIER_OPTIMIZERS["adagrad"]().apply_gradients(
            zip(tf.gradients(tf.reduce_mean(tf.square(emb)), sparse), sparse))
    try:
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train_op)
            return sess_fn(sess, table)
    finally:
        terminate_config_initializer()


def _exported_bytes(sess, table):
    """The per-ID arrays of the engine's export, by their own sizes (the reference)."""
    names = [name for name, _ in host_state.FIELDS + host_state.TIER_FIELDS]
    values = dict(zip(names, sess.run(loader.op_library().mxrec_export_table(
        table_key=table.table_key))))
    per_id = ("keys", "rows", "counts", "last_seen", "in_host", "tier_present", "tier_values")
    return sum(values[name].nbytes for name in per_id if name in values)


@pytest.mark.parametrize("tiered", [True, False])
def test_the_estimate_is_the_exports_per_id_bytes(tiered):
    with tf.Graph().as_default():
        estimate, exported, tier_ids = _train(lambda sess, table: (
            host_state.export_bytes(table.table_key, DIM, tiered), _exported_bytes(sess, table),
            tiers.stats(table)["tier_ids"] if tiered else 0), tiered=tiered)
    if tiered:
        assert tier_ids > 0  # the host tier's rows are in the export
    assert estimate == exported


def _save(path):
    return lambda sess, table: _v1.train.Saver().save(sess, str(path))


@pytest.mark.parametrize("tiered", [True, False])
def test_a_save_over_the_limit_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                     tiered):
    with tf.Graph().as_default():
        estimate = _train(lambda sess, table: host_state.export_bytes(table.table_key, DIM,
                                                                      tiered), tiered=tiered)
    # Just below the estimate: refused, naming everything; nothing written.
    monkeypatch.setenv(host_state.TF_SAVER_LIMIT_ENV, repr((estimate - 1) / 2**20))
    with tf.Graph().as_default():
        with pytest.raises(tf.errors.OpError) as refused:
            _train(_save(tmp_path / "model"), tiered=tiered)
    message = str(refused.value)
    for part in ("table 'big'", f"({estimate} bytes)", host_state.TF_SAVER_LIMIT_ENV,
                 "mxrec.saver.checkpoint.Saver", "checkpoint_memory_mb"):
        assert part in message, part
    assert not list(tmp_path.glob("model*"))
    # At the estimate: saved, and it restores.
    monkeypatch.setenv(host_state.TF_SAVER_LIMIT_ENV, repr(estimate / 2**20))
    with tf.Graph().as_default():
        path = _train(_save(tmp_path / "model"), tiered=tiered)
    assert tf.io.gfile.exists(path + ".index")


def test_a_dynamic_store_over_the_limit_is_refused(tmp_path, monkeypatch):
    # 8 KiB: the IDs' records (about 5 KiB) fit, so the host state's own guard passes (the
    # two guards run in no fixed order); the store of its some 180 IDs, 2 x 32 bytes each
    # (dim 8, no slots) held twice, does not.
    monkeypatch.setenv(host_state.TF_SAVER_LIMIT_ENV, "0.008")
    with tf.Graph().as_default():
        with pytest.raises(tf.errors.OpError, match=r"table 'big'.*dynamic store.*"
                                                    r"MXREC_TF_SAVER_MAX_MB"):
            _train(_save(tmp_path / "model"), tiered=False, dynamic=True)
    monkeypatch.setenv(host_state.TF_SAVER_LIMIT_ENV, "inf")
    with tf.Graph().as_default():
        path = _train(_save(tmp_path / "model"), tiered=False, dynamic=True)
    assert tf.io.gfile.exists(path + ".index")


@pytest.mark.parametrize("raw", ["0", "-5", "many", "nan"])
def test_a_bad_limit_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(host_state.TF_SAVER_LIMIT_ENV, raw)
    with pytest.raises(ValueError, match=f"MXREC_TF_SAVER_MAX_MB must be a number of MiB > 0 "
                                         f".*got {raw!r}"):
        host_state.tf_saver_limit_mb()

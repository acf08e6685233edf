"""mxrec's Saver refuses a non-finite model: NaN in a dense variable, in an optimizer slot,
+inf in a host-tier (and SSD-tier) row, a delta whose only changed row is infinite. Nothing
is written, and the next delta still holds what the refused one would have held.

Each expected count and example ID is computed here with NumPy from the model's own values
(the variables, `tiers.export_values`), not by the code under test."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core import tiers
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.hooks import IncrementalCheckpointHook
from mxrec.optimizers import adagrad, gradient_descent
from mxrec.saver import manifest as manifest_io
from mxrec.saver.checkpoint import (
    CheckpointError,
    NonFiniteError,
    Saver,
    save_persistables,
)
from mxrec.util.initialize import init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
DIM = 4


class Model:
    """A table of DIM (adagrad, or SGD when tiered), a dense weight w [DIM], and ops that
    overwrite one row of the table, of its slot, or w (a blown-up update)."""

    def __init__(self, tier=None, w_init=1.0):
        init(prefetch_batch_number=0)
        kwargs = {}
        if tier == "host":
            kwargs = dict(host_vocabulary_size=100)
        elif tier is not None:  # host memory holds 2 rows, the rest spills to disk
            kwargs = dict(host_vocabulary_size=2, ssd_vocabulary_size=100, ssd_data_path=tier)
        self.table = create_table(tf.int64, DIM, "user", _v1.constant_initializer(0.05),
                                  device_vocabulary_size=2 if tier else 64, **kwargs)
        self.ids = _v1.placeholder(tf.int64, [None])
        emb = sparse_lookup(self.table, self.ids)
        self.w = _v1.get_variable("w", [DIM], initializer=_v1.constant_initializer(w_init))
        loss = tf.reduce_sum(tf.square(tf.reduce_sum(emb * self.w, axis=1) - 1.0))
        dense, sparse = get_dense_and_sparse_variable()
        optimizer = (gradient_descent.create_hash_optimizer(0.1) if tier
                     else adagrad.create_hash_optimizer(0.1))
        self.train = tf.group(
            optimizer.apply_gradients(zip(tf.gradients(loss, sparse), sparse)),
            _v1.train.GradientDescentOptimizer(0.05).minimize(loss, var_list=dense))
        self.slot_name = f"{optimizer.get_name()}/accumulator"
        slot = None if tier else optimizer.get_slot(self.table.variable, "accumulator")
        self.variables = {"embedding": self.table.variable}
        if slot is not None:
            self.variables[self.slot_name] = slot
        self.row = _v1.placeholder(tf.int32, [])
        self.value = _v1.placeholder(tf.float32, [DIM])
        self.set_row = {state: variable.scatter_update(
            tf.IndexedSlices(self.value[None], self.row[None]))
            for state, variable in self.variables.items()}
        self.w_value = _v1.placeholder(tf.float32, [DIM])
        self.set_w = self.w.assign(self.w_value)

    def device_row(self, key: int) -> int:
        ids, rows = self.table.export_rows()
        return int(rows[ids.tolist().index(key)])

    def set(self, sess, key: int, value, state="embedding"):
        sess.run(self.set_row[state], {self.row: self.device_row(key), self.value: value})

    def read(self, sess, key: int, state="embedding") -> np.ndarray:
        return sess.run(self.variables[state])[self.device_row(key)]

    def values(self, sess):
        """{ID: row} of every admitted ID and w, wherever the rows live."""
        ids, rows = self.table.export_rows()
        table = sess.run(self.table.variable)
        return dict(zip(ids.tolist(), table[rows])), sess.run(self.w)


def _session():
    sess = _v1.Session()
    sess.run(_v1.global_variables_initializer())
    return sess


def _expected(what: str, values: np.ndarray, keys=None) -> str:
    """The message part naming `what`: its count of non-finite values and an example."""
    bad = ~np.isfinite(values)
    if keys is None:
        example = f"index {tuple(int(i) for i in np.argwhere(bad)[0])}"
    else:
        example = f"ID {int(np.asarray(keys)[bad.reshape(len(keys), -1).any(axis=1)][0])}"
    return f"{what}: {int(bad.sum())} non-finite value(s), e.g. {example}"


def _left(directory) -> list:
    """What a directory holds (nothing when it was never made)."""
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def test_nan_in_a_dense_variable_is_refused_and_nothing_is_written(tmp_path):
    model = Model()
    sess = _session()
    sess.run(model.train, {model.ids: [1, 2, 3]})
    saver = Saver(str(tmp_path), check_finite=True)
    saver.save(sess, 1)
    bad_w = np.array([0.5, np.nan, 0.25, np.nan], np.float32)
    sess.run(model.set_w, {model.w_value: bad_w})
    with pytest.raises(NonFiniteError) as raised:
        saver.save(sess, 2)
    message = str(raised.value)
    assert _expected("variable 'w'", bad_w) in message, message
    assert "step 2 (full)" in message and "table" not in message.split("finite: ")[1]
    assert isinstance(raised.value, CheckpointError) and len(raised.value.faults) == 1
    assert _left(tmp_path) == ["full-000000000001"]
    # The check is the Saver's default, and each save may turn it off.
    saver.save(sess, 2, check_finite=False)
    assert saver.versions() == [("full", 1), ("full", 2)]
    with pytest.raises(NonFiniteError):
        saver.save(sess, 3, kind="delta")
    assert Saver(str(tmp_path)).check_finite is False
    Saver(str(tmp_path)).save(sess, 3)  # off by default
    assert _left(tmp_path) == ["full-000000000001", "full-000000000002", "full-000000000003"]


def test_nan_in_an_optimizer_slot_is_refused(tmp_path):
    model = Model()
    sess = _session()
    for batch in ([1, 2, 3], [3, 4], [2, 5]):
        sess.run(model.train, {model.ids: batch})
    row = np.array([1.0, np.nan, np.nan, 2.0], np.float32)
    model.set(sess, 4, row, state=model.slot_name)
    ids, rows = model.table.export_rows()
    slot_values = sess.run(model.variables[model.slot_name])[rows]  # each saved row, by ID
    saver = Saver(str(tmp_path))
    with pytest.raises(NonFiniteError) as raised:
        saver.save(sess, 3, check_finite=True)
    message = str(raised.value)
    assert _expected(f"table 'user' {model.slot_name}", slot_values, ids) in message, message
    assert "2 non-finite value(s), e.g. ID 4" in message
    assert "'user' embedding" not in message and "variable 'w'" not in message
    assert _left(tmp_path) == []


def test_a_delta_whose_only_changed_row_is_infinite_is_refused_and_the_next_holds_it(tmp_path):
    """The refused delta leaves the Saver's baseline: once the row is finite again, the next
    delta holds it (and exactly it), and the chain restores to the live model."""
    model = Model()
    sess = _session()
    for batch in ([1, 2, 3], [3, 4], [2, 5, 6]):
        sess.run(model.train, {model.ids: batch})
    saver = Saver(str(tmp_path), check_finite=True)
    saver.save(sess, 3)
    sess.run(model.train, {model.ids: [5]})  # the one ID this delta holds
    blown = model.read(sess, 5).copy()
    blown[2] = np.inf
    model.set(sess, 5, blown)
    with pytest.raises(NonFiniteError, match=re.escape(
            _expected("table 'user' embedding", blown[None], [5]))):
        saver.save(sess, 4, kind="delta")
    assert _left(tmp_path) == ["full-000000000003"]
    fixed = np.array([0.1, -0.2, 0.3, -0.4], np.float32)
    model.set(sess, 5, fixed)
    saver.save(sess, 4, kind="delta")
    delta = saver.serving_delta(4)["user"]
    np.testing.assert_array_equal(delta["ids"], [5])
    np.testing.assert_array_equal(delta["embeddings"], fixed[None])
    want_rows, want_w = model.values(sess)
    sess.close()
    terminate_config_initializer()
    with tf.Graph().as_default():
        restored = Model()
        with _session() as sess2:
            assert Saver(str(tmp_path)).restore(sess2) == 4
            got_rows, got_w = restored.values(sess2)
    assert sorted(got_rows) == sorted(want_rows)
    for key, row in want_rows.items():
        np.testing.assert_allclose(got_rows[key], row, atol=1e-7, err_msg=str(key))
    np.testing.assert_allclose(got_w, want_w, atol=1e-7)


@pytest.mark.parametrize("tier", ["host", "ssd"])
def test_inf_in_host_and_ssd_tier_rows_is_refused(tmp_path, tier):
    """Rows blown up on the device and swapped out to host memory (and to disk) before the
    save: the check reads every tier."""
    (tmp_path / "ssd").mkdir()
    model = Model(tier=str(tmp_path / "ssd") if tier == "ssd" else "host")
    directory = tmp_path / "ckpt"
    sess = _session()
    poisoned = []
    for step in range(8):
        batch = [10 * step + 1, 10 * step + 2]
        sess.run(model.train, {model.ids: batch})
        if step < (6 if tier == "ssd" else 1):  # later batches push these off the device
            row = model.read(sess, batch[0]).copy()
            row[step % DIM] = np.inf
            model.set(sess, batch[0], row)
            poisoned.append(batch[0])
    stats = tiers.stats(model.table)
    assert stats["host_rows"] > 0 and (stats["ssd_rows"] > 0) == (tier == "ssd")
    ids, values = tiers.export_values(sess, model.table, slots=False)["embedding"]
    assert tiers.tier_of(model.table, poisoned).tolist() == [1] * len(poisoned)
    in_tier = tiers.tier_of(model.table, ids) == 1
    saver = Saver(str(directory), check_finite=True)
    with pytest.raises(NonFiniteError) as raised:
        saver.save(sess, 8)
    message = str(raised.value)
    assert _expected("table 'user' host/SSD tier embedding", values[in_tier],
                     ids[in_tier]) in message, message
    assert f"{len(poisoned)} non-finite value(s)" in message
    assert "'user' embedding" not in message  # the device rows are finite
    assert not directory.exists() or _left(directory) == []


def test_the_hook_and_save_persistables_pass_the_check_through(tmp_path):
    Model(w_init=float("nan"))
    with _session() as sess:
        with pytest.raises(NonFiniteError, match=r"variable 'w': 4 non-finite"):
            save_persistables(sess, str(tmp_path / "p"), mode=0, step=1, check_finite=True)
        assert _left(tmp_path / "p") == []
        assert save_persistables(sess, str(tmp_path / "p"), mode=0, step=1).endswith(
            "full-000000000001")
    hook = IncrementalCheckpointHook(str(tmp_path / "hook"), check_finite=True)
    with pytest.raises(NonFiniteError, match=r"variable 'w': 4 non-finite"):
        with _v1.train.MonitoredSession(hooks=[hook]):
            pass
    assert _left(tmp_path / "hook") == []


def test_check_finite_must_be_a_bool(tmp_path):
    Model()
    with pytest.raises(TypeError, match="Saver: check_finite must be True or False"):
        Saver(str(tmp_path), check_finite="yes")
    with pytest.raises(TypeError, match="IncrementalCheckpointHook: check_finite"):
        IncrementalCheckpointHook(str(tmp_path), check_finite=1)
    saver = Saver(str(tmp_path))
    with pytest.raises(TypeError, match="Saver.save: check_finite must be True or False"):
        saver.save(None, 1, check_finite="no")
    assert manifest_io.list_versions(str(tmp_path)) == []

"""The serving export and apply_delta refuse non-finite models by default (before writing
anything) and publish atomically: written into a temporary folder beside the target that
names its writer, flushed, then renamed."""

import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.export import saved_model as serving
from mxrec.export.saved_model import NonFiniteError
from mxrec.optimizers import adagrad
from mxrec.saver import manifest as manifest_io
from mxrec.saver.checkpoint import Saver
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
DIM = 4
IDS = np.array([3, 7, 11, 19, 23], np.int64)


def _net(is_train):
    """ids [B] -> score [B]: one table of DIM and a dense weight w [DIM]."""
    ids = _v1.placeholder(tf.int64, [None], name="ids")
    table = create_table(tf.int64, DIM, "user", _v1.random_uniform_initializer(-0.1, 0.1, 1),
                         device_vocabulary_size=32)
    w = _v1.get_variable("w", [DIM], initializer=_v1.constant_initializer(0.5))
    score = tf.reduce_sum(sparse_lookup(table, ids, is_train=is_train) * w, axis=1)
    return ids, table, w, score


def _build():
    ids, _, _, score = _net(is_train=False)
    return {"ids": ids}, {"score": score}


def _checkpoint(directory, table_nan=None, dense_inf=False):
    """Trains a few steps and saves (unchecked); returns ({ID: row}, w) as saved.

    table_nan: an ID whose row gets a NaN; dense_inf: w gets an infinity."""
    init()
    ids, table, w, score = _net(is_train=True)
    loss = tf.reduce_sum(tf.square(score - 1.0))
    dense, sparse = get_dense_and_sparse_variable()
    train = tf.group(
        adagrad.create_hash_optimizer(0.1).apply_gradients(zip(tf.gradients(loss, sparse),
                                                               sparse)),
        _v1.train.GradientDescentOptimizer(0.05).minimize(loss, var_list=dense))
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for step in range(3):
            sess.run(train, {ids: np.roll(IDS, step)[:4]})
        keys, rows = table.export_rows()
        values = sess.run(table.variable)
        if table_nan is not None:
            row = rows[keys.tolist().index(table_nan)]
            values[row, 1] = np.nan
            sess.run(table.variable.assign(values))
        if dense_inf:
            sess.run(w[2].assign(np.inf))
        Saver(str(directory)).save(sess, 3)
        return dict(zip(keys.tolist(), values[rows])), sess.run(w)


def _leftovers(folder) -> list:
    return sorted(name for name in os.listdir(folder) if name.startswith(".tmp-"))


def _exported(export_dir):
    (table,) = serving.exported_tables(str(export_dir)).values()
    reader = tf.train.load_checkpoint(os.path.join(str(export_dir), "variables", "variables"))
    return dict(zip(table["ids"].tolist(), table["embeddings"])), reader.get_tensor("w")


def test_export_refuses_a_nan_table_row_and_writes_nothing(tmp_path):
    rows, _ = _checkpoint(tmp_path / "ckpt", table_nan=7)
    target = tmp_path / "serving" / "1"
    target.parent.mkdir()
    with pytest.raises(NonFiniteError, match=r"export_saved_model: .* refused, nothing written"
                       r".*table 'user' embedding: 1 non-finite value\(s\), e.g. ID 7$"):
        serving.export_saved_model(str(target), str(tmp_path / "ckpt"), _build)
    assert os.listdir(target.parent) == []
    # Turned off, the export holds the saved values as they are (NaN included).
    serving.export_saved_model(str(target), str(tmp_path / "ckpt"), _build, check_finite=False)
    got, _ = _exported(target)
    assert sorted(got) == sorted(rows)
    for key, row in rows.items():
        np.testing.assert_array_equal(got[key], row)
    assert np.isnan(got[7][1])


def test_export_refuses_an_infinite_dense_value(tmp_path):
    _checkpoint(tmp_path / "ckpt", dense_inf=True)
    target = tmp_path / "1"
    with pytest.raises(NonFiniteError, match=r"variable 'w': 1 non-finite value\(s\), "
                                             r"e.g. index \(2,\)$"):
        serving.export_saved_model(str(target), str(tmp_path / "ckpt"), _build)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        serving.export_saved_model(str(target), str(tmp_path / "ckpt"), _build,
                                   check_finite="no")


def _record_publication(monkeypatch, fail=False):
    """Records each flush and rename of the serving module: (call, path, what the target
    holds then); with fail, the rename raises."""
    calls = []
    flush, rename = serving.durable.fsync_tree, serving.durable.rename_durably

    def fsync_tree(path):
        calls.append(("flush", path, sorted(os.listdir(path))))
        flush(path)

    def rename_durably(source, target, overwrite=False):
        calls.append(("rename", source, os.path.exists(target)))
        if fail:
            raise OSError("the disk went away")
        rename(source, target, overwrite)

    monkeypatch.setattr(serving.durable, "fsync_tree", fsync_tree)
    monkeypatch.setattr(serving.durable, "rename_durably", rename_durably)
    return calls


def test_export_and_delta_are_written_beside_flushed_and_renamed(tmp_path, monkeypatch):
    rows, w = _checkpoint(tmp_path / "ckpt")
    base = tmp_path / "serving"
    base.mkdir()
    calls = _record_publication(monkeypatch)
    serving.export_saved_model(str(base / "1"), str(tmp_path / "ckpt"), _build)
    (flushed, staging, held), (renamed, source, target_existed) = calls
    assert flushed == "flush" and renamed == "rename" and source == staging
    assert os.path.dirname(staging) == str(base) and "saved_model.pb" in held
    assert not target_existed  # no reader saw a part of it
    assert manifest_io.writer_of(str(base), os.path.basename(staging)) == \
        manifest_io.this_writer()
    assert os.listdir(base) == ["1"]
    with pytest.raises(ValueError, match="already exists"):
        serving.export_saved_model(str(base / "1"), str(tmp_path / "ckpt"), _build)

    calls.clear()
    new_row = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    delta = {"user": {"ids": np.array([7, 101]), "embeddings": np.stack([new_row, -new_row]),
                      "removed": np.array([3])}}
    serving.apply_delta(str(base / "1"), delta, str(base / "2"), dense={"w": w + 1})
    assert [call[0] for call in calls] == ["flush", "rename"] and not calls[1][2]
    got, got_w = _exported(base / "2")
    want = {**rows, 7: new_row, 101: -new_row}
    del want[3]
    assert sorted(got) == sorted(want)
    for key, row in want.items():
        np.testing.assert_allclose(got[key], row, err_msg=str(key))
    np.testing.assert_allclose(got_w, w + 1)
    assert sorted(os.listdir(base)) == ["1", "2"]


def test_a_failed_publication_leaves_no_target_and_no_temporary(tmp_path, monkeypatch):
    _checkpoint(tmp_path / "ckpt")
    base = tmp_path / "serving"
    base.mkdir()
    serving.export_saved_model(str(base / "1"), str(tmp_path / "ckpt"), _build)
    _record_publication(monkeypatch, fail=True)
    with pytest.raises(OSError, match="went away"):
        serving.export_saved_model(str(base / "2"), str(tmp_path / "ckpt"), _build)
    with pytest.raises(OSError, match="went away"):
        serving.apply_delta(str(base / "1"), {}, str(base / "3"))
    assert os.listdir(base) == ["1"]


def test_apply_delta_refuses_non_finite_rows_and_dense_values(tmp_path):
    _, w = _checkpoint(tmp_path / "ckpt")
    base = tmp_path / "serving"
    serving.export_saved_model(str(base / "1"), str(tmp_path / "ckpt"), _build)
    rows = np.ones((3, DIM), np.float32)
    rows[2, 3] = -np.inf
    rows[1, :2] = np.nan
    delta = {"user": {"ids": np.array([5, 7, 9]), "embeddings": rows}}
    bad_w = w.copy()
    bad_w[0] = np.nan
    with pytest.raises(NonFiniteError) as raised:
        serving.apply_delta(str(base / "1"), delta, str(base / "2"), dense={"w": bad_w})
    message = str(raised.value)
    assert "table 'user' embedding: 3 non-finite value(s), e.g. ID 7" in message, message
    assert "variable 'w': 1 non-finite value(s), e.g. index (0,)" in message, message
    assert os.listdir(base) == ["1"]
    # Dense values the export does not hold (an optimizer's slots) are not published.
    serving.apply_delta(str(base / "1"), {}, str(base / "2"),
                        dense={"w/Adagrad": np.full(DIM, np.nan, np.float32)})
    serving.apply_delta(str(base / "1"), delta, str(base / "3"), check_finite=False)
    got, _ = _exported(base / "3")
    np.testing.assert_array_equal(np.stack([got[5], got[7], got[9]]), rows)
    with pytest.raises(TypeError, match="apply_delta: check_finite must be True or False"):
        serving.apply_delta(str(base / "1"), {}, str(base / "4"), check_finite=None)
    assert sorted(os.listdir(base)) == ["1", "2", "3"]

"""mk.callbacks.Checkpoint, mk.KerasSaver and mk.warm_start in eager mode: what a version
holds, resuming, and every refusal (run by tests/test_keras_eager.py)."""

import json
import os
import pathlib
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from _support import fresh  # noqa: E402, F401 (autouse: init() and a clean session per test)

import mxrec.keras as mk  # noqa: E402
from mxrec.saver import manifest as manifest_io  # noqa: E402
from mxrec.saver.manifest import CheckpointError  # noqa: E402
from mxrec.util import initialize  # noqa: E402

DIM = 3


def _restart():
    """A new init() and Keras session, as a new process would have."""
    initialize.terminate_config_initializer()
    tf.keras.backend.clear_session()
    mk.init()


def _model(head="head", capacity=40, optimizer=None, **policy):
    layer = mk.Embedding(DIM, "user", capacity, **policy)
    ids = tf.keras.Input([2], dtype=tf.int64)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name=head)(
        tf.keras.layers.Flatten()(layer(ids))))
    model.compile(optimizer=optimizer or mk.optimizers.Adagrad(0.1), loss="mse")
    return model, layer


def _data(steps=6, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 25, size=(steps * 2, 2)).astype(np.int64),
            rng.normal(size=(steps * 2, 1)).astype(np.float32))


def _fit(model, callbacks, data):
    model.fit(*data, batch_size=2, shuffle=False, verbose=0, callbacks=callbacks)


def test_a_version_holds_the_tables_rows_slots_and_the_dense_state(tmp_path):
    model, layer = _model(access_threshold=2)
    _fit(model, [mk.callbacks.Checkpoint(str(tmp_path), full_every=4, delta_every=2)], _data())
    versions = manifest_io.list_versions(str(tmp_path))
    assert versions == [("full", 0), ("delta", 2), ("full", 4), ("delta", 6)]
    manifest, arrays = manifest_io.read_version(str(tmp_path), "full", 4)
    assert manifest["tables"]["user"]["state"] == ["embedding", "Adagrad/accumulator"]
    table = arrays[manifest["tables"]["user"]["file"]]
    dense = arrays["dense.npz"]
    assert int(dense["global_step"]) == 4
    assert {"head/kernel", "head/bias"} <= set(dense)
    assert "user" not in json.dumps(sorted(dense))  # the table is not a dense variable
    keys, rows = table["host/keys"], table["host/rows"]
    admitted = rows >= 0
    assert admitted.any() and not admitted.all()  # access_threshold=2 keeps some out
    # Restored into a new model, the host state and rows are those of the last version.
    ids, rows_now = layer.export_rows()
    _restart()
    model2, layer2 = _model(access_threshold=2)
    saver = mk.KerasSaver(str(tmp_path), model2, model2.optimizer)
    assert saver.restore() == 6
    assert int(model2.optimizer.iterations.numpy()) == 6
    ids2, rows2 = layer2.export_rows()
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_array_equal(rows2, rows_now)
    np.testing.assert_array_equal(layer2.embeddings.numpy()[rows2],
                                  layer.embeddings.numpy()[rows_now])
    slot, slot2 = (m.optimizer.table_slot(t, "accumulator").numpy()
                   for m, t in ((model, layer), (model2, layer2)))
    np.testing.assert_array_equal(slot2[rows2], slot[rows_now])
    np.testing.assert_array_equal(model2.get_layer("head").get_weights()[0],
                                  model.get_layer("head").get_weights()[0])
    assert keys.dtype == np.int64


@pytest.mark.parametrize("kwargs, match", [
    ({}, "give full_every, delta_every"),
    ({"full_every": 0}, "full_every must be a positive int"),
    ({"delta_every": 2.5}, "delta_every must be a positive int"),
    ({"full_every": True}, "full_every must be a positive int"),
])
def test_bad_settings_are_refused(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mk.callbacks.Checkpoint(str(tmp_path), **kwargs)


def test_a_plain_keras_optimizer_is_refused(tmp_path):
    model, _ = _model(optimizer=tf.keras.optimizers.Adagrad(0.1))
    with pytest.raises(TypeError, match="mxrec.keras.optimizers"):
        _fit(model, [mk.callbacks.Checkpoint(str(tmp_path), full_every=2)], _data(2))


def test_restore_false_refuses_a_directory_with_versions(tmp_path):
    model, _ = _model()
    _fit(model, [mk.callbacks.Checkpoint(str(tmp_path), full_every=2)], _data(2))
    _restart()
    model2, _ = _model(head="head2")
    with pytest.raises(ValueError, match="restore=False"):
        _fit(model2, [mk.callbacks.Checkpoint(str(tmp_path), full_every=2, restore=False)],
             _data(2))


def test_a_missing_dense_variable_is_named(tmp_path):
    model, _ = _model()
    _fit(model, [mk.callbacks.Checkpoint(str(tmp_path), full_every=2)], _data(2))
    _restart()
    model2, layer2 = _model(head="other")
    with pytest.raises(CheckpointError, match="'other/kernel' is not in"):
        mk.KerasSaver(str(tmp_path), model2, model2.optimizer).restore()
    assert layer2.stats()["rows_in_use"] == 0  # the refused restore changed nothing
    # renamed, it restores
    saver = mk.KerasSaver(str(tmp_path), model2, model2.optimizer,
                          dense_names={"other/kernel": "head/kernel", "other/bias": "head/bias"})
    assert saver.restore() == 2
    assert layer2.stats()["rows_in_use"] > 0


def test_unknown_dense_names_are_refused(tmp_path):
    model, _ = _model()
    with pytest.raises(ValueError, match="dense_names names no variable.*'nope'"):
        mk.KerasSaver(str(tmp_path), model, model.optimizer, dense_names={"nope": "x"})


def test_a_damaged_file_is_refused_and_a_save_killed_midway_is_ignored(tmp_path):
    model, _ = _model()
    _fit(model, [mk.callbacks.Checkpoint(str(tmp_path), full_every=2)], _data(2))
    stale = tmp_path / ".tmp-full-000000000009-x"
    stale.mkdir()
    (stale / "dense.npz").write_bytes(b"partial")
    long_ago = time.time() - 2 * 24 * 3600  # no writer named: removed once long untouched
    for path in (stale / "dense.npz", stale):
        os.utime(path, (long_ago, long_ago))
    saver = mk.KerasSaver(str(tmp_path), model, model.optimizer)  # removes the stale folder
    assert not stale.exists()
    path = os.path.join(str(tmp_path), "full-000000000002", "dense.npz")
    data = bytearray(open(path, "rb").read())
    data[-10] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="dense.npz"):
        saver.restore(2)


def test_a_delta_needs_a_full_save_first(tmp_path):
    model, _ = _model()
    with pytest.raises(CheckpointError, match="needs a full save"):
        mk.KerasSaver(str(tmp_path), model, model.optimizer).save(kind="delta")


def test_warm_start_refusals(tmp_path):
    model, _ = _model()
    with pytest.raises(ValueError, match="is not a directory of mxrec checkpoint versions"):
        mk.warm_start(model, str(tmp_path / "none"))
    _fit(model, [mk.callbacks.Checkpoint(str(tmp_path), full_every=2)], _data(2))
    with pytest.raises(ValueError, match="'items' chooses no table"):
        mk.warm_start(model, str(tmp_path), "items")
    _restart()
    model2, _ = _model(head="other")
    with pytest.raises(ValueError, match="weight 'other/kernel' is not in"):
        mk.warm_start(model2, str(tmp_path), ".*")
    assert mk.warm_start(model2, str(tmp_path), "user") == ["user"]


def test_a_weights_file_that_does_not_fit_the_table_is_refused(tmp_path):
    """model.save_weights / load_weights (Keras' weights file): the host state of a
    device-only table does not load into a tiered one, and the table is left as it was."""
    model, _ = _model()
    _fit(model, [], _data())
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    _restart()
    tiered, layer = _model(host_vocabulary_size=20)
    before = layer.embeddings.numpy()
    with pytest.raises(ValueError, match="'user'.*mxrec_host_in_host.*host tier"):
        tiered.load_weights(path)
    assert layer.stats()["rows_in_use"] == 0
    np.testing.assert_array_equal(layer.embeddings.numpy(), before)


def test_a_tf_checkpoint_over_the_tf_saver_limit_is_refused(tmp_path, monkeypatch):
    """tf.train.Checkpoint takes the host state as whole tensors: above MXREC_TF_SAVER_MAX_MB
    the save is refused before anything is exported, naming the table and KerasSaver's way;
    below it, it saves."""
    model, layer = _model()
    _fit(model, [], _data())
    tracked = int(layer.stats()["ids_tracked"])
    assert tracked > 0
    # Adagrad on a device-only table: 24 bytes of record per tracked ID.
    monkeypatch.setenv("MXREC_TF_SAVER_MAX_MB", repr((24 * tracked - 1) / 2**20))
    checkpoint = tf.train.Checkpoint(model=model)
    # Eagerly the guard's own ValueError; in a tf.function TF's error of it.
    with pytest.raises((ValueError, tf.errors.OpError),
                       match=rf"table 'user'.*\({24 * tracked} bytes\).*MXREC_TF_SAVER_MAX_MB"
                             r".*mxrec.keras.KerasSaver"):
        checkpoint.write(str(tmp_path / "over"))
    assert not list(tmp_path.glob("over*"))
    monkeypatch.setenv("MXREC_TF_SAVER_MAX_MB", repr(24 * tracked / 2**20))
    checkpoint.write(str(tmp_path / "at"))
    assert list(tmp_path.glob("at*.index"))

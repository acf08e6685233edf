"""mk.callbacks.Checkpoint writes the Session path's full/delta format, and the two continue
each other's checkpoints.

One model and stream (tests/test_keras_training.py's), with admission and eviction, and
with a host tier too:

- Keras -> Keras: Model.fit on the first half with mk.callbacks.Checkpoint (full and delta
  versions), a new init() and model, Model.fit on the rest with the callback restoring first,
  gives bit for bit one uninterrupted Model.fit;
- Keras -> Session: Model.fit on the first half with the callback; the Session path's Saver
  restores that directory (full + deltas) into a Session graph, which trains the rest: the
  same IDs, rows and counts as one uninterrupted Session run, values, slots and dense
  weights within 1e-5;
- Session -> Keras: the Session path trains the first half saving full and delta versions
  with its Saver; the callback restores them into a Keras model, Model.fit trains the rest:
  the same, against the same uninterrupted Session run;
- WarmStart (the Session path's) reads a Keras checkpoint, and mk.warm_start a Session one.

The dense names of the Session graph (w, b, acc_w, m_w, ..., global_step, beta1_power) are
given to the callback as dense_names (tests/keras_worker.py's session_names).
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from test_keras_training import ATOL, BASE, SCENARIOS, _by_id, _data, _keras_runs, _session_run

from mxrec.saver import manifest as manifest_io
from mxrec.util import initialize

_STATE = ("rows_in_use", "ids_tracked")
# Admission (threshold 2) and eviction every 3 steps on a table too small for the stream.
INTEROP = {
    "adagrad_admission_eviction": dict(SCENARIOS["adagrad_eviction"], access_threshold=2),
    "lazy_adam_admission_eviction": dict(SCENARIOS["lazy_adam_eviction"], access_threshold=2),
    "sgd_admission": SCENARIOS["sgd_admission"],
    # a host tier (rows and slots swapped out and back) with admission and eviction
    "adagrad_host_tier_admission_eviction": dict(SCENARIOS["adagrad_host_tier_eviction"],
                                                 access_threshold=2),
}


def _fresh(mx, settings, data, **kwargs):
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    return _session_run(mx, settings, data, **kwargs)


def _settings(scenario, tmp_path, **extra):
    return dict(BASE, **INTEROP[scenario], ckpt_dir=str(tmp_path / "ckpt"), full_every=8,
                delta_every=3, **extra)


def _assert_same(got, expected, what):
    got_by_id, expected_by_id = _by_id(got), _by_id(expected)
    np.testing.assert_array_equal(got_by_id["ids"], expected_by_id["ids"], err_msg=what)
    np.testing.assert_array_equal(got_by_id["rows"], expected_by_id["rows"], err_msg=what)
    assert sorted(got_by_id) == sorted(expected_by_id), what
    for key in sorted(set(expected_by_id) - {"ids", "rows"}):
        np.testing.assert_allclose(got_by_id[key], expected_by_id[key], atol=ATOL, rtol=0,
                                   err_msg=f"{what} {key}")
    for key in ("w", "b"):
        np.testing.assert_allclose(got[key], expected[key], atol=ATOL, rtol=0,
                                   err_msg=f"{what} {key}")
    stats, expected_stats = (json.loads(str(r["stats"])) for r in (got, expected))
    assert {k: stats[k] for k in _STATE} == {k: expected_stats[k] for k in _STATE}, what
    # A tiered table: every admitted ID's row and slots, wherever they live.
    assert sorted(k for k in got if k.startswith("all")) == sorted(
        k for k in expected if k.startswith("all")), what
    for key in sorted(k for k in expected if k.startswith("all_ids_")):
        np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{what} {key}")
        values = "all_" + key[len("all_ids_"):]
        np.testing.assert_allclose(got[values], expected[values], atol=ATOL, rtol=0,
                                   err_msg=f"{what} {values}")


def _versions(directory):
    return manifest_io.list_versions(directory)


def _check_scenario(settings, data, session):
    stats = json.loads(str(session["stats"]))
    if settings.get("access_threshold") == 2:
        assert stats["rejected"] > 0
    if settings.get("evict_every"):
        assert stats["evicted"] > 0
        assert len(np.unique(data["ids"])) > settings["capacity"]


@pytest.mark.parametrize("scenario", sorted(INTEROP))
def test_keras_checkpoint_callback_resumes_bit_for_bit(tmp_path, scenario):
    settings = _settings(scenario, tmp_path)
    runs = _keras_runs(tmp_path, settings, _data(settings), modes=("fit", "ckpt_resume"))
    once, resumed = runs["fit"], runs["ckpt_resume"]
    for key in sorted(set(once) - {"stats"}):
        np.testing.assert_array_equal(resumed[key], once[key], err_msg=key)
    # A full save at the start and every 8 steps (5 kept), else a delta every 3 steps and
    # at the end of each fit.
    steps, half = settings["steps"], settings["steps"] // 2
    fulls = [s for s in range(0, steps + 1, 8)][-5:]
    deltas = [s for s in range(1, steps + 1) if s % 8 and (s % 3 == 0 or s in (half, steps))]
    expected = sorted([("full", s) for s in fulls] + [("delta", s) for s in deltas
                                                       if s > fulls[0]], key=lambda v: v[1])
    assert _versions(settings["ckpt_dir"]) == expected
    stats_once, stats_resumed = (json.loads(str(r["stats"])) for r in (once, resumed))
    assert {k: stats_resumed[k] for k in _STATE} == {k: stats_once[k] for k in _STATE}


@pytest.mark.parametrize("scenario", sorted(INTEROP))
def test_keras_checkpoint_continues_in_the_session_path(mx, tmp_path, scenario):
    settings = _settings(scenario, tmp_path, session_names=True)
    data = _data(settings)
    half = settings["steps"] // 2
    reference = _fresh(mx, settings, data)
    _check_scenario(settings, data, reference)
    _keras_runs(tmp_path, settings, data, modes=("to_session",))
    versions = _versions(settings["ckpt_dir"])
    assert versions[-1] == ("delta", half) and ("full", 8) in versions
    continued = _fresh(mx, settings, data, start=half, restore_dir=settings["ckpt_dir"])
    _assert_same(continued, reference, "keras -> session")


@pytest.mark.parametrize("scenario", sorted(INTEROP))
def test_session_checkpoint_continues_in_keras(mx, tmp_path, scenario):
    settings = _settings(scenario, tmp_path, session_names=True)
    data = _data(settings)
    half = settings["steps"] // 2
    reference = _fresh(mx, settings, data)
    _check_scenario(settings, data, reference)
    _fresh(mx, settings, data, stop=half, save_dir=settings["ckpt_dir"], save_every=3,
           full_every=8)
    versions = _versions(settings["ckpt_dir"])
    assert versions[-1] == ("delta", half) and ("full", 8) in versions
    assert ("delta", 12) in versions
    continued = _keras_runs(tmp_path, settings, data, modes=("from_session",))["from_session"]
    _assert_same(continued, reference, "session -> keras")


def _values_by_id(run):
    got = _by_id(run)
    return {key: got[key] for key in got if key != "rows"}


@pytest.mark.parametrize("scenario", ["lazy_adam_admission_eviction"])
def test_session_warm_start_reads_a_keras_checkpoint(mx, tmp_path, scenario):
    from mxrec.core.embedding import create_table  # noqa: PLC0415
    from mxrec.saver.warm_start import WarmStart  # noqa: PLC0415

    settings = _settings(scenario, tmp_path, session_names=True)
    data = _data(settings)
    keras = _keras_runs(tmp_path, settings, data, modes=("to_session",))["to_session"]
    mx()
    table = create_table(tf.int64, settings["dim"], "user", tf.compat.v1.zeros_initializer(),
                         device_vocabulary_size=settings["capacity"])
    w = tf.compat.v1.get_variable("w", shape=data["w"].shape, use_resource=True)
    b = tf.compat.v1.get_variable("b", shape=data["b"].shape, use_resource=True)
    ws = WarmStart(settings["ckpt_dir"], ".*")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        ws.run(sess)
        ids, rows = table.export_rows()
        np.testing.assert_array_equal(rows, np.arange(len(ids)))  # rows given anew, in ID order
        warmed = dict(ids=ids, rows=rows, values=sess.run(table.variable)[rows])
        np.testing.assert_array_equal(sess.run(w), keras["w"])
        np.testing.assert_array_equal(sess.run(b), keras["b"])
    expected = _values_by_id(keras)
    got = _values_by_id(warmed)
    np.testing.assert_array_equal(got["ids"], expected["ids"])
    np.testing.assert_array_equal(got["values"], expected["values"])


@pytest.mark.parametrize("scenario", ["adagrad_admission_eviction"])
def test_keras_warm_start_reads_a_session_checkpoint(mx, tmp_path, scenario):
    settings = _settings(scenario, tmp_path, session_names=True)
    data = _data(settings)
    half = settings["steps"] // 2
    session = _fresh(mx, settings, data, stop=half, save_dir=settings["ckpt_dir"], save_every=3,
                     full_every=8)
    warmed = _keras_runs(tmp_path, settings, data, modes=("warm",))["warm"]
    np.testing.assert_array_equal(warmed["rows"], np.arange(len(warmed["ids"])))
    expected, got = _values_by_id(session), _values_by_id(warmed)
    assert sorted(got) == sorted(expected)  # ids, values, slot_accumulator
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
    np.testing.assert_array_equal(warmed["w"], session["w"])
    np.testing.assert_array_equal(warmed["b"], session["b"])

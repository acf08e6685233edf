"""mxrec.keras on several ranks trains what one process trains on the same global batches.

tests/keras_worker.py trains one model (a table looked up by [B, 3] IDs, flattened,
concatenated with 2 dense features, one Dense logit, binary cross-entropy) with Model.fit,
with a tf.function + GradientTape step and (some cases) eagerly: in one process on every
global batch (the reference, itself exact against the Session path:
tests/test_keras_training.py), and under
`python -m mxrec.launch -n N` (the MPI engine) with each rank on its slice of every global
batch. After training the union of the ranks' IDs, rows and optimizer slots (by ID; each
rank holds the IDs it owns, or every ID for an is_dp=True table), the dense weights on every
rank, and the host statistics summed over the ranks must equal the one-process run's
(values within 1e-5, IDs and counts exactly).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from test_keras_training import _data, _session_run

from mxrec.saver import manifest as manifest_io
from mxrec.util import initialize

pytestmark = pytest.mark.serial  # starts ranks of its own

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(__file__).resolve().parent / "keras_worker.py"
ATOL = 1e-5
BASE = dict(dim=4, width=3, dense=2, batch=8, steps=24, lr=0.1, acc0=0.5, epsilon=1e-7,
            beta1=0.8, beta2=0.95, capacity=200, vocab=120, constant_init=0.05)
SLOTS = {"sgd": (), "adagrad": ("accumulator",), "lazy_adam": ("m", "v")}
# Per table the host statistics that count the global batch's IDs once however it is split;
# after a restore the counters start again with the process, the state does not.
STATS = ("rows_in_use", "ids_tracked", "admitted", "evicted")
STATE = ("rows_in_use", "ids_tracked")


def _train(folder, settings, modes, ranks):
    """{mode: [one npz dict per rank]} of keras_worker.py on `ranks` ranks (1: a plain
    process) in `folder` (made here), on _data(settings)."""
    folder.mkdir()
    data = folder / "data.npz"
    arrays = _data(settings)
    if settings.get("group"):  # the head also reads the second table's [B, 3 x 2 dim]
        width = 3 * settings["dim"] * settings["width"] + settings["dense"]
        arrays["w"] = np.random.default_rng(1).normal(0, 0.3, (width, 1)).astype(np.float32)
    np.savez(data, settings=json.dumps(settings), **arrays)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("MXREC_EXCHANGE", None)
    launch = [] if ranks == 1 else ["-m", "mxrec.launch", "-n", str(ranks)]
    done = subprocess.run([sys.executable, *launch, str(WORKER), str(data),
                           str(folder / "out_"), *modes], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    if ranks == 1:
        return {mode: [dict(np.load(folder / f"out_{mode}.npz"))] for mode in modes}
    return {mode: [dict(np.load(folder / f"out_{mode}.rank{r}.npz")) for r in range(ranks)]
            for mode in modes}


def _by_id(parts, key):
    """(ids, values) of every rank's rows by ID, sorted; IDs held by two ranks (an is_dp
    table) must hold the same values and appear once."""
    ids = np.concatenate([p["ids"] for p in parts])
    values = np.concatenate([p[key] for p in parts])
    order = np.argsort(ids, kind="stable")
    ids, values = ids[order], values[order]
    first = np.concatenate([[True], ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, bool)
    for i in np.flatnonzero(~first):
        np.testing.assert_allclose(values[i], values[i - 1], atol=ATOL)
    return ids[first], values[first]


def _check_equal(reference, parts, settings, replicated=False, stats_keys=STATS):
    (one,) = reference
    # A tiered table's device rows depend on the ranks' device caches (each rank caches
    # device_vocabulary_size rows): every admitted ID wherever it lives is compared below.
    keys = [] if settings.get("host") else ["values"] + [
        f"slot_{s}" for s in SLOTS[settings["optimizer"]]]
    for key in keys:
        ref_ids, ref_values = _by_id([one], key)
        ids, values = _by_id(parts, key)
        np.testing.assert_array_equal(ids, ref_ids, err_msg=key)
        np.testing.assert_allclose(values, ref_values, atol=ATOL, err_msg=key)
    if settings.get("host"):  # every admitted ID wherever it lives (device, host tier)
        for key in ("embedding", *SLOTS[settings["optimizer"]]):
            ref_ids, ref_values = one[f"all_ids_{key}"], one[f"all_{key}"]
            ids = np.concatenate([p[f"all_ids_{key}"] for p in parts])
            values = np.concatenate([p[f"all_{key}"] for p in parts])
            order = np.argsort(ids)
            np.testing.assert_array_equal(ids[order], ref_ids, err_msg=key)
            np.testing.assert_allclose(values[order], ref_values, atol=ATOL, err_msg=key)
    for part in parts:
        for key in ("w", "b"):
            np.testing.assert_allclose(part[key], one[key], atol=ATOL, err_msg=key)
    ref_stats = json.loads(str(one["stats"]))
    stats = [json.loads(str(p["stats"])) for p in parts]
    for key in stats_keys if not settings.get("host") else ("admitted",):
        if key in ref_stats:
            got = [s[key] for s in stats]
            expected = [ref_stats[key]] * len(parts) if replicated else ref_stats[key]
            assert (got if replicated else sum(got)) == expected, (key, got, ref_stats[key])


SCENARIOS = {
    "sgd": dict(optimizer="sgd"),
    "adagrad_admission_eviction": dict(optimizer="adagrad", access_threshold=2,
                                       eviction_threshold=25, evict_every=3, capacity=40),
    "lazy_adam_host_tier": dict(optimizer="lazy_adam", lr=0.02, access_threshold=2,
                                capacity=30, host=200),
    # bfloat16 rows in the device weight and the host tier, rounded updates
    "adagrad_bfloat16_host_tier": dict(optimizer="adagrad", access_threshold=2, capacity=30,
                                       host=200, storage="bfloat16"),
    # multi-hot IDs combined by a mean, on a replicated table
    "adagrad_replicated_mean": dict(optimizer="adagrad", access_threshold=2, is_dp=True,
                                    combiner="mean"),
}


# Further cases of the same path, run under the default TensorFlow only (tests/conftest.py).
# LazyAdam alone on 2 ranks: test_export_evaluate_and_refusals_on_two_ranks; 4 ranks:
# test_embedding_group_exchanges_once_per_step_and_equals_one_process.
_VARIANT = ("lazy_adam_host_tier", "adagrad_replicated_mean", "adagrad_bfloat16_host_tier")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.variant) if n in _VARIANT
                                  else n for n in sorted(SCENARIOS)])
def test_two_ranks_equal_one_process(tmp_path, name):
    settings = dict(BASE, **SCENARIOS[name])
    # Eagerly too (every op of the step, collectives included, run at once).
    modes = ("fit", "function", "eager") if name in ("sgd", "lazy_adam_host_tier") else (
        "fit", "function")
    if settings.get("storage"):  # the rows' dtype changes no mode's path: one mode is enough
        modes = ("function",)
    reference = _train(tmp_path / "one", settings, modes, 1)
    ranks = _train(tmp_path / "ranks", settings, modes, 2)
    for mode in modes:
        _check_equal(reference[mode], ranks[mode], settings, settings.get("is_dp", False))


def _session(mx, settings, **kwargs):
    """The Session path in this process (one rank), on _data(settings)."""
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    return _session_run(mx, settings, _data(settings), **kwargs)


def test_checkpoints_move_between_rank_counts_and_paths(mx, tmp_path):
    """mk.callbacks.Checkpoint on 2 ranks writes the Session path's sharded format: the
    Session path on one process and Keras on one process continue it, and Keras on 2 ranks
    continues a one-process Session checkpoint, each equal to one uninterrupted run."""
    settings = dict(BASE, **SCENARIOS["adagrad_admission_eviction"], session_names=True,
                    full_every=8, delta_every=3)
    half = settings["steps"] // 2
    reference = [_session(mx, settings)]
    assert json.loads(str(reference[0]["stats"]))["evicted"] > 0
    # Keras on 2 ranks, the first half: versions of 2 ranks' files each.
    keras_dir = tmp_path / "keras_ckpt"
    _train(tmp_path / "to", dict(settings, ckpt_dir=str(keras_dir)), ("to_session",), 2)
    versions = manifest_io.list_versions(str(keras_dir))
    assert versions[-1] == ("delta", half) and ("full", 8) in versions, versions
    last = keras_dir / manifest_io.version_name(*versions[-1])
    assert sorted(p.name for p in last.glob("table-*")) == [
        "table-000-rank00000.npz", "table-000-rank00001.npz"]
    copy = tmp_path / "keras_ckpt_copy"
    shutil.copytree(keras_dir, copy)
    # ... continued by the Session path on one process,
    continued = _session(mx, settings, start=half, restore_dir=str(keras_dir))
    _check_equal(reference, [continued], settings, stats_keys=STATE)
    # ... and by Keras on one process.
    (alone,) = _train(tmp_path / "from1", dict(settings, ckpt_dir=str(copy)),
                      ("from_session",), 1)["from_session"]
    _check_equal(reference, [alone], settings, stats_keys=STATE)
    # The Session path on one process, the first half, continued by Keras on 2 ranks.
    session_dir = tmp_path / "session_ckpt"
    _session(mx, settings, stop=half, save_dir=str(session_dir), save_every=3, full_every=8)
    ranks = _train(tmp_path / "from2", dict(settings, ckpt_dir=str(session_dir)),
                   ("from_session",), 2)["from_session"]
    _check_equal(reference, ranks, settings, stats_keys=STATE)


def test_export_evaluate_and_refusals_on_two_ranks(tmp_path):
    """On 2 ranks: Model.fit's mk.metrics.Global metrics (AUC, accuracy) equal one process's;
    after it model.evaluate's loss is the mean of the ranks' (equal slices), model(x,
    training=False) gives one process's predictions, mk.export_serving writes from rank 0 a
    SavedModel predicting the same, and tf.train.Checkpoint and save_weights are refused
    naming the way that works, as are their restores (of one process's files), which leave
    every weight as it was."""
    settings = dict(BASE, optimizer="lazy_adam", lr=0.02, global_metrics=True,
                    saved_dir=str(tmp_path / "saved"))
    (tmp_path / "saved").mkdir()
    (one,) = _train(tmp_path / "one", dict(settings, export_dir=str(tmp_path / "export1")),
                    ("ranks_extras",), 1)["ranks_extras"]
    parts = _train(tmp_path / "two", dict(settings, export_dir=str(tmp_path / "export2")),
                   ("ranks_extras",), 2)["ranks_extras"]
    _check_equal([one], parts, settings)
    assert all(line.endswith(": saved") for line in one["refused"])
    for part in parts:
        assert len(part["refused"]) == 4
        for line in part["refused"]:
            assert "several ranks" in line and "mk.callbacks.Checkpoint" in line, line
        assert part["unchanged"]
    # evaluate: [loss, auc, acc], the loss each rank's slice's, the Global metrics global.
    np.testing.assert_allclose(np.mean([p["evaluated"][0] for p in parts]),
                               one["evaluated"][0], atol=ATOL)
    for part in parts:
        np.testing.assert_allclose(part["evaluated"][1:], one["evaluated"][1:], atol=ATOL)
    np.testing.assert_allclose(np.concatenate([p["expected"] for p in parts]), one["expected"],
                               atol=ATOL)
    np.testing.assert_allclose(one["served"], one["expected"], atol=ATOL)
    np.testing.assert_allclose(parts[0]["served"], parts[0]["expected"], atol=ATOL)
    assert "served" not in parts[1]
    # Model.fit's mk.metrics.Global metrics are the global batches' on every rank (its loss,
    # the mean of each rank's slice).
    for key in ("history_auc", "history_acc"):
        for part in parts:
            np.testing.assert_allclose(part[key], one[key], atol=ATOL, err_msg=key)
    np.testing.assert_allclose(np.mean([p["history_loss"] for p in parts]), one["history_loss"],
                               atol=ATOL)
    assert not (tmp_path / "export2.mxrec-rows").exists()  # the ranks' rows, removed


@pytest.mark.one_tf  # the launcher's engine choice and a refusal in Python
def test_the_grpc_engine_is_refused_naming_the_mpi_engine(tmp_path):
    script = tmp_path / "layer.py"
    script.write_text("import mxrec.keras as mk\nmk.init()\nmk.Embedding(4, 'user', 10)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-m", "mxrec.launch", "-n", "2", "--engine", "grpc",
                           str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "NotImplementedError" in done.stdout + done.stderr
    assert "on the MPI engine only" in done.stdout + done.stderr


@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.ranks_extra)])
def test_embedding_group_exchanges_once_per_step_and_equals_one_process(tmp_path, ranks):
    """Two tables (dims 4 and 8, different IDs) through one mk.EmbeddingGroup with admission
    (LazyAdam on 4 ranks, Adagrad on 2):
    the same as one process, and one step's traced tf.function holds 3 all-to-alls (IDs,
    embeddings, gradients) and 2 all-reduces (the agreement with the batch time, the dense
    gradients) however many tables (two layers called alone: 6 and 5, a lookup's own
    agreement and batch-time all-reduces each)."""
    settings = dict(BASE, optimizer="adagrad" if ranks == 2 else "lazy_adam", lr=0.05,
                    access_threshold=2, group=True)
    modes = ("fit", "function")
    reference = _train(tmp_path / "one", settings, modes, 1)
    parts = _train(tmp_path / "ranks", settings, modes, ranks)
    for mode in modes:
        _check_equal(reference[mode], parts[mode], settings)
        (one,) = reference[mode]
        ids = np.concatenate([p["item_ids"] for p in parts[mode]])
        values = np.concatenate([p["item_values"] for p in parts[mode]])
        order, ref_order = np.argsort(ids), np.argsort(one["item_ids"])
        np.testing.assert_array_equal(ids[order], one["item_ids"][ref_order])
        np.testing.assert_allclose(values[order], one["item_values"][ref_order], atol=ATOL)
    for part in parts["function"]:  # two layers called alone: 6 and 5
        assert part["collectives"].tolist() == [3, 2]


@pytest.mark.parametrize("case", ["group", pytest.param("eviction", marks=pytest.mark.variant)])
def test_plan_ahead_on_two_ranks_equals_one_process(tmp_path, case):
    """mk.data.plan_ahead on 2 ranks (each rank routes its slice in its tf.data pipeline; the
    exchange and the owners' key stages stay in the step), by Model.fit and a tf.function
    loop: the same as one process without it. Two tables through one mk.EmbeddingGroup with
    admission, or one table with admission and eviction every 3 steps."""
    settings = dict(BASE, optimizer="adagrad", lr=0.05, access_threshold=2, group=True)
    if case == "eviction":
        settings = dict(BASE, **SCENARIOS["adagrad_admission_eviction"])
    (reference,) = _train(tmp_path / "one", settings, ("fit",), 1).values()
    parts = _train(tmp_path / "ranks", settings, ("fit_planned", "function_planned"), 2)
    if case == "eviction":
        assert json.loads(str(reference[0]["stats"]))["evicted"] > 0
    for mode, ranks in parts.items():
        _check_equal(reference, ranks, settings)
        if case == "group":
            (one,) = reference
            ids = np.concatenate([p["item_ids"] for p in ranks])
            values = np.concatenate([p["item_values"] for p in ranks])
            order, ref_order = np.argsort(ids), np.argsort(one["item_ids"])
            np.testing.assert_array_equal(ids[order], one["item_ids"][ref_order], err_msg=mode)
            np.testing.assert_allclose(values[order], one["item_values"][ref_order],
                                       atol=ATOL, err_msg=mode)


def test_a_step_traced_anew_at_different_steps_on_each_rank_equals_one_process(
        tmp_path, monkeypatch):
    """A tf.function step without an input_signature, fed mk.data.plan_ahead's plans, is
    traced anew for every new plan shape, which comes at different steps on the two ranks
    (checked): every trace of the step numbers its exchanges alike, so the ranks still meet
    in the same exchange (numbered by trace order, they waited in different ones until the
    collective timeout, shortened here) and train what one process trains."""
    monkeypatch.setenv("MXREC_COLLECTIVE_TIMEOUT", "60")
    settings = dict(BASE, optimizer="adagrad", lr=0.05, access_threshold=2, steps=10)
    (reference,) = _train(tmp_path / "one", settings, ("fit",), 1).values()
    (parts,) = _train(tmp_path / "ranks", settings, ("function_planned_retrace",), 2).values()
    traced_at = [part["traced_at"].tolist() for part in parts]
    assert traced_at[0] != traced_at[1] and min(map(len, traced_at)) > 1, traced_at
    _check_equal(reference, parts, settings)

"""mxrec.keras on several ranks trains what one process trains on the same global batches.

tests/keras_worker.py trains one model (a table looked up by [B, 3] IDs, flattened,
concatenated with 2 dense features, one Dense logit, binary cross-entropy) with Model.fit
and with a tf.function + GradientTape step: in one process on every global batch (the
reference, itself exact against the Session path: tests/test_keras_training.py), and under
`python -m mxrec.launch -n N` (the MPI engine) with each rank on its slice of every global
batch. After training the union of the ranks' IDs, rows and optimizer slots (by ID; each
rank holds the IDs it owns, or every ID for an is_dp=True table), the dense weights on every
rank, and the host statistics summed over the ranks must equal the one-process run's
(values within 1e-5, IDs and counts exactly).
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from reference import int64_vocab, power_law_ids

pytestmark = pytest.mark.serial  # starts ranks of its own

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(__file__).resolve().parent / "keras_worker.py"
ATOL = 1e-5
BASE = dict(dim=4, width=3, dense=2, batch=8, steps=24, lr=0.1, acc0=0.5, epsilon=1e-7,
            beta1=0.8, beta2=0.95, capacity=200, vocab=120, constant_init=0.05)
SLOTS = {"sgd": (), "adagrad": ("accumulator",), "lazy_adam": ("m", "v")}
# Per table the host statistics that count the global batch's IDs once however it is split.
STATS = ("rows_in_use", "admitted", "evicted")


def _data(settings, seed=0):
    rng = np.random.default_rng(seed)
    vocab = int64_vocab(rng, settings["vocab"])
    steps, batch = settings["steps"], settings["batch"]
    ids = np.stack([power_law_ids(rng, vocab, (batch, settings["width"]), alpha=1.0)
                    for _ in range(steps)])
    return dict(
        ids=ids.astype(np.int64),
        dense=rng.normal(size=(steps, batch, settings["dense"])).astype(np.float32),
        y=rng.integers(0, 2, size=(steps, batch, 1)).astype(np.float32),
        ts=np.repeat((np.arange(steps, dtype=np.int64) * 10 + 1000)[:, None], batch, axis=1),
        table=np.zeros((settings["capacity"], settings["dim"]), np.float32),  # unused
        w=rng.normal(0, 0.3, (settings["dim"] * settings["width"] + settings["dense"], 1))
        .astype(np.float32),
        b=np.array([0.1], np.float32))


def _train(tmp_path, settings, modes, ranks):
    """{mode: [one npz dict per rank]} of keras_worker.py on `ranks` ranks (1: a plain
    process)."""
    folder = tmp_path / f"ranks{ranks}"
    folder.mkdir()
    data = folder / "data.npz"
    np.savez(data, settings=json.dumps(settings), **_data(settings))
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


def _check_equal(reference, parts, settings, replicated=False):
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
    for key in STATS if not settings.get("host") else ("admitted",):
        if key in ref_stats:
            got = [s[key] for s in stats]
            expected = [ref_stats[key]] * len(parts) if replicated else ref_stats[key]
            assert (got if replicated else sum(got)) == expected, (key, got, ref_stats[key])


SCENARIOS = {
    "sgd": dict(optimizer="sgd"),
    "adagrad_admission_eviction": dict(optimizer="adagrad", access_threshold=2,
                                       eviction_threshold=25, evict_every=3, capacity=40),
    "lazy_adam": dict(optimizer="lazy_adam", lr=0.02),
    "lazy_adam_host_tier": dict(optimizer="lazy_adam", lr=0.02, access_threshold=2,
                                capacity=30, host=200),
    "adagrad_replicated": dict(optimizer="adagrad", access_threshold=2, is_dp=True),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_two_ranks_equal_one_process(tmp_path, name):
    settings = dict(BASE, **SCENARIOS[name])
    modes = ("fit", "function")
    reference = _train(tmp_path, settings, modes, 1)
    ranks = _train(tmp_path, settings, modes, 2)
    for mode in modes:
        _check_equal(reference[mode], ranks[mode], settings, settings.get("is_dp", False))


@pytest.mark.ranks_extra
def test_four_ranks_equal_one_process(tmp_path):
    settings = dict(BASE, optimizer="lazy_adam", lr=0.02, access_threshold=2)
    modes = ("fit", "function")
    reference = _train(tmp_path, settings, modes, 1)
    ranks = _train(tmp_path, settings, modes, 4)
    for mode in modes:
        _check_equal(reference[mode], ranks[mode], settings)

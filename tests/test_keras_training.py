"""mxrec.keras trains the same parameters as the Session path.

One model (a table looked up by [B, 3] IDs, flattened, concatenated with 2 dense features,
one Dense logit, binary cross-entropy) and one stream of batches, trained four ways:

- the Session path, here (this process runs TF1 graph mode, conftest.py): create_table,
  sparse_lookup, mxrec's hash optimizer for the table, and Keras' update rule for the dense
  weights written out in TF ops (an independent reference of what Keras does to them);
- mxrec.keras with Model.fit, with a tf.function + GradientTape step, and eagerly, in a
  subprocess in eager mode (tests/keras_worker.py).

After training, the IDs holding rows, their rows, their values and optimizer slots, the dense
weights and the host statistics must agree (values within 1e-5; IDs, rows and counts
exactly). Scenarios: SGD, Adagrad and LazyAdam; admission (access_threshold=2); eviction every 3
steps on a table too small for the stream without it, so that freed rows are handed to new
IDs (their rows refilled from the initializer and their slots reset); multi-hot IDs
combined by a mean; a host tier (30 device rows over 200 host rows: IDs swapped out and
back every step, their slots with them), with admission, with eviction, and an SSD tier
under a host tier of 12 rows. For the tiered tables every admitted ID's row and slots are
compared wherever they live (tiers.export_values against Embedding.export_values).
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from reference import int64_vocab, power_law_ids

from mxrec.core import tiers
from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup
from mxrec.optimizers import adagrad, gradient_descent, lazy_adam
from mxrec.saver.checkpoint import Saver

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(__file__).resolve().parent / "keras_worker.py"
MODES = ("fit", "function", "eager")
ATOL = 1e-5
_v1 = tf.compat.v1

BASE = dict(dim=4, width=3, dense=2, batch=8, steps=30, lr=0.1, acc0=0.5, epsilon=1e-7,
            beta1=0.8, beta2=0.95, capacity=200, vocab=120)
SLOTS = {"sgd": (), "adagrad": ("accumulator",), "lazy_adam": ("m", "v")}
SCENARIOS = {
    "sgd": dict(optimizer="sgd"),
    "adagrad": dict(optimizer="adagrad"),
    "adagrad_admission": dict(optimizer="adagrad", access_threshold=2),
    "sgd_admission": dict(optimizer="sgd", access_threshold=2),
    "lazy_adam": dict(optimizer="lazy_adam", lr=0.02),
    # multi-hot: each row's 3 IDs combined (sparse_lookup(combiner="mean")) -> [B, dim]
    "adagrad_mean": dict(optimizer="adagrad", combiner="mean"),
    "lazy_adam_admission": dict(optimizer="lazy_adam", lr=0.02, access_threshold=2),
    # 24 positions per step; eviction keeps the IDs of the last 3 steps (timestamps 10 apart).
    "adagrad_eviction": dict(optimizer="adagrad", access_threshold=1, eviction_threshold=25,
                             evict_every=3, capacity=60, constant_init=0.05, steps=40),
    "lazy_adam_eviction": dict(optimizer="lazy_adam", lr=0.02, access_threshold=1,
                               eviction_threshold=25, evict_every=3, capacity=60,
                               constant_init=0.05, steps=40),
    "sgd_eviction": dict(optimizer="sgd", access_threshold=1, eviction_threshold=25,
                         evict_every=3, capacity=60, constant_init=0.05, steps=40),
    # 24 positions per step on 30 device rows: most steps swap rows with the host tier.
    "adagrad_host_tier": dict(optimizer="adagrad", capacity=30, host=200, constant_init=0.05),
    "lazy_adam_host_tier_admission": dict(optimizer="lazy_adam", lr=0.02, access_threshold=2,
                                          capacity=30, host=200, constant_init=0.05),
    "adagrad_host_tier_eviction": dict(optimizer="adagrad", access_threshold=1,
                                       eviction_threshold=25, evict_every=3, capacity=30,
                                       host=40, constant_init=0.05, steps=40),
    # With an SSD tier the host tier must hold one step's IDs (24 positions).
    "lazy_adam_ssd_tier": dict(optimizer="lazy_adam", lr=0.02, capacity=30, host=24, ssd=200,
                               constant_init=0.05),
}


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
        table=rng.uniform(-0.5, 0.5, (settings["capacity"], settings["dim"])).astype(np.float32),
        w=rng.normal(0, 0.3, (_flat_width(settings) + settings["dense"], 1))
        .astype(np.float32),
        b=np.array([0.1], np.float32))


def _flat_width(settings):
    return settings["dim"] * (1 if settings.get("combiner") else settings["width"])


def _keras_runs(tmp_path, settings, data, modes=MODES):
    if settings.get("ssd"):
        settings = dict(settings, ssd_dir=str(tmp_path / "ssd_keras"))
        for mode in modes:  # each run's SSD file in a folder of its own
            (tmp_path / "ssd_keras" / mode).mkdir(parents=True)
    path = tmp_path / "data.npz"
    np.savez(path, settings=json.dumps(settings), **data)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, str(WORKER), str(path), str(tmp_path / "out_"),
                           *modes], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return {mode: dict(np.load(tmp_path / f"out_{mode}.npz")) for mode in modes}


def _session_run(mx, settings, data, start=0, stop=None, restore_dir=None, save_dir=None,
                 save_every=None, full_every=None):
    """The Session path: sparse_lookup + hash optimizer; Keras' rule for the dense weights.

    Trains steps [start, stop) of the stream (all by default). restore_dir: mxrec's Saver
    restores it first (its step must be `start`); save_dir: a full save before the first step,
    then after each step that reaches a multiple of full_every a full save, else of
    save_every a delta, and a delta at the end."""
    mx()
    dim, width, lr = settings["dim"], settings["width"], settings["lr"]
    init = (_v1.constant_initializer(settings["constant_init"])
            if settings.get("constant_init") is not None else _v1.constant_initializer(
                data["table"]))
    tier = {}
    if settings.get("host"):
        tier = dict(host_vocabulary_size=settings["host"],
                    ssd_vocabulary_size=settings.get("ssd", 0))
    if settings.get("ssd"):
        tier["ssd_data_path"] = [settings["ssd_dir"]]
    table = create_table(tf.int64, dim, "user", init,
                         device_vocabulary_size=settings["capacity"], **tier)
    ids = _v1.placeholder(tf.int64, [None, width])
    dense = _v1.placeholder(tf.float32, [None, settings["dense"]])
    stamps = _v1.placeholder(tf.int64, [None])
    labels = _v1.placeholder(tf.float32, [None, 1])
    add_timestamp(stamps)
    policy = {key: settings[key] for key in ("access_threshold", "eviction_threshold")
              if settings.get(key) is not None}
    emb = sparse_lookup(table, ids, access_and_evict_config=policy or None,
                        combiner=settings.get("combiner"))
    w = _v1.get_variable("w", initializer=data["w"], use_resource=True)
    b = _v1.get_variable("b", initializer=data["b"], use_resource=True)
    global_step = _v1.train.get_or_create_global_step()
    x = tf.concat([tf.reshape(emb, [-1, _flat_width(settings)]), dense], axis=1)
    logits = tf.matmul(x, w) + b
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    g_table, g_w, g_b = tf.gradients(loss, [table.variable, w, b])
    step = _v1.placeholder(tf.float32, [])  # Keras' local step: iterations + 1
    if settings["optimizer"] == "sgd":
        hash_opt = gradient_descent.create_hash_optimizer(lr)
        dense_updates = [v.assign_sub(lr * g) for g, v in ((g_w, w), (g_b, b))]
    elif settings["optimizer"] == "adagrad":
        hash_opt = adagrad.create_hash_optimizer(lr, initial_accumulator_value=settings["acc0"])
        dense_updates = []
        for g, v in ((g_w, w), (g_b, b)):  # Keras' Adagrad
            acc = _slot(v, "acc", settings["acc0"])
            with tf.control_dependencies([acc.assign_add(g * g)]):
                dense_updates.append(v.assign_sub(lr * g / tf.sqrt(
                    acc.read_value() + settings["epsilon"])))
    else:
        beta1, beta2, eps = settings["beta1"], settings["beta2"], settings["epsilon"]
        hash_opt = lazy_adam.create_hash_optimizer(lr, beta1=beta1, beta2=beta2, epsilon=eps)
        dense_updates = []
        alpha = lr * tf.sqrt(1 - tf.pow(beta2, step)) / (1 - tf.pow(beta1, step))
        for g, v in ((g_w, w), (g_b, b)):  # Keras' Adam
            m, s = _slot(v, "m", 0.0), _slot(v, "v", 0.0)
            with tf.control_dependencies([m.assign_add((g - m) * (1 - beta1)),
                                          s.assign_add((tf.square(g) - s) * (1 - beta2))]):
                dense_updates.append(v.assign_sub(
                    m.read_value() * alpha / (tf.sqrt(s.read_value()) + eps)))
    train = tf.group(hash_opt.apply_gradients([(g_table, table.variable)]), *dense_updates,
                     global_step.assign_add(1))
    stop = settings["steps"] if stop is None else stop
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        if restore_dir is not None:
            assert Saver(restore_dir).restore(sess) == start
            assert sess.run(global_step) == start
        saver = Saver(save_dir) if save_dir is not None else None
        if saver is not None:
            saver.save(sess, start, kind="full")
        for i in range(start, stop):
            sess.run(train, {ids: data["ids"][i], dense: data["dense"][i],
                             stamps: data["ts"][i], labels: data["y"][i], step: i + 1.0})
            if settings.get("evict_every") and (i + 1) % settings["evict_every"] == 0:
                table.evict(settings["eviction_threshold"])  # what EvictHook does
            if saver is not None and full_every and (i + 1) % full_every == 0:
                saver.save(sess, i + 1, kind="full")
            elif saver is not None and save_every and (i + 1) % save_every == 0:
                saver.save(sess, i + 1, kind="delta")
        if saver is not None and saver.last_step != stop:
            saver.save(sess, stop, kind="delta")
        export_ids, rows = table.export_rows()
        values = sess.run(table.variable)
        out = dict(ids=export_ids, rows=rows, values=values[rows], w=sess.run(w),
                   b=sess.run(b), stats=json.dumps({k: int(v) for k, v in (
                       table.stats() | (tiers.stats(table) if settings.get("host") else {})
                   ).items()}))
        for slot in SLOTS[settings["optimizer"]]:
            out[f"slot_{slot}"] = sess.run(hash_opt.get_slot(table.variable, slot))[rows]
        if settings.get("host"):
            for component, (all_ids, all_values) in tiers.export_values(sess, table).items():
                name = component.split("/")[-1]
                out[f"all_ids_{name}"], out[f"all_{name}"] = all_ids, all_values
    return out


def _slot(variable, name, value):
    return _v1.get_variable(f"{name}_{variable.op.name}", initializer=tf.fill(
        variable.shape, value), use_resource=True, trainable=False)


def _by_id(run):
    order = np.argsort(run["ids"])
    return {key: run[key][order] for key in run
            if key not in ("w", "b", "stats") and not key.startswith("all")}


_STATS = ("rows_in_use", "ids_tracked", "ids_seen", "admitted", "rejected", "evicted",
          "evicted_rows", "train_batches")
_TIER_STATS = ("tier_ids", "host_rows", "ssd_rows", "swap_in_total", "swap_out_total",
               "fresh_total")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_keras_matches_session_path(mx, tmp_path, scenario):
    settings = dict(BASE, **SCENARIOS[scenario])
    if settings.get("ssd"):
        settings["ssd_dir"] = str(tmp_path / "ssd_session")
        os.makedirs(settings["ssd_dir"])
    data = _data(settings)
    session = _session_run(mx, settings, data)
    runs = _keras_runs(tmp_path, settings, data)
    expected_stats = json.loads(str(session["stats"]))
    # The scenario does what it says: training moved the weights; admission rejected
    # IDs; eviction removed IDs and the stream outgrew the table without it.
    assert not np.allclose(session["w"], data["w"])
    if settings.get("access_threshold") == 2:
        assert expected_stats["rejected"] > 0
    if settings.get("evict_every"):
        assert expected_stats["evicted"] > 0
        assert len(np.unique(data["ids"])) > settings["capacity"] + settings.get("host", 0)
    if settings.get("host"):  # rows went out to the tier and came back
        assert expected_stats["swap_in_total"] > 0 and expected_stats["swap_out_total"] > 0
        assert expected_stats["tier_ids"] > 0
    if settings.get("ssd"):
        assert expected_stats["ssd_rows"] > 0
    for mode, run in runs.items():
        assert_same(run, session, settings, mode)


def assert_same(run, session, settings, mode, rows=True, stats_keys=_STATS):
    """One Keras run's table (IDs, rows unless `rows` is False, values, slots, tiers), dense
    weights and host statistics (`stats_keys` of them: a resumed run's process-lifetime
    counters restart) against the Session path's, within ATOL."""
    expected = _by_id(session)
    expected_stats = json.loads(str(session["stats"]))
    got = _by_id(run)
    np.testing.assert_array_equal(got["ids"], expected["ids"], err_msg=mode)
    if rows:
        np.testing.assert_array_equal(got["rows"], expected["rows"], err_msg=mode)
    assert sorted(got) == sorted(expected), mode
    for key in sorted(set(expected) - {"ids", "rows"}):  # values and slots
        np.testing.assert_allclose(got[key], expected[key], atol=ATOL, rtol=0,
                                   err_msg=f"{mode} {key}")
    np.testing.assert_allclose(run["w"], session["w"], atol=ATOL, rtol=0, err_msg=mode)
    np.testing.assert_allclose(run["b"], session["b"], atol=ATOL, rtol=0, err_msg=mode)
    stats = json.loads(str(run["stats"]))
    assert ({k: stats[k] for k in stats_keys}
            == {k: expected_stats[k] for k in stats_keys}), mode
    if settings.get("host"):
        assert ({k: stats[k] for k in _TIER_STATS}
                == {k: expected_stats[k] for k in _TIER_STATS}), mode
        names = ["embedding", *SLOTS[settings["optimizer"]]]
        assert sorted(k for k in run if k.startswith("all_ids_")) == sorted(
            f"all_ids_{n}" for n in names), mode
        for name in names:
            np.testing.assert_array_equal(run[f"all_ids_{name}"],
                                          session[f"all_ids_{name}"], err_msg=mode)
            np.testing.assert_allclose(run[f"all_{name}"], session[f"all_{name}"],
                                       atol=ATOL, rtol=0, err_msg=f"{mode} {name}")

"""mk.data.plan_ahead trains what the Session path trains, one batch at a time.

tests/test_keras_training.py's model and stream, trained in a subprocess (tests/keras_worker.py)
with the key stage in the tf.data pipeline (deferred, committed by the step that trains the
batch), by Model.fit and by a tf.function loop (mk.data.use_plans), against the Session
path's direct lookup in this process (nothing planned ahead): IDs, values, slots, dense
weights and host statistics within 1e-5.

- SGD; LazyAdam with a host tier and admission (rows swapped out and back every step: the
  swap plans of planned batches apply in order);
- Adagrad with admission and eviction every 3 steps while 2 batches are planned ahead: the
  stream's IDs live two steps each (block i appears in steps i and i + 1), so the IDs the
  eviction removes never come back, and a run that plans ahead must evict exactly what the
  Session path evicts; rows are compared by ID only (the planned batches took their rows
  before the eviction freed others);
- a save of mk.callbacks.Checkpoint in the middle of Model.fit (later batches planned, pending
  in the engine) restored into a new model that trains the rest: the same state as the
  Session path trained straight through (a pipeline that planned without deferring would
  save the planned batches' admission counts, and the resumed run would admit IDs early).
"""

import json

import numpy as np
import pytest
from test_keras_training import (
    BASE,
    SCENARIOS,
    _data,
    _keras_runs,
    _session_run,
    assert_same,
)

PLANNED = ("fit_planned", "function_planned")
BLOCK = 20  # IDs per block of the eviction stream


def _block_stream(settings, data, seed=1):
    """Step i draws its IDs from blocks i and i + 1 (BLOCK IDs each): an ID lives in two
    steps only."""
    rng = np.random.default_rng(seed)
    steps, batch, width = settings["steps"], settings["batch"], settings["width"]
    ids = np.empty((steps, batch, width), np.int64)
    for i in range(steps):
        pool = (np.arange(i * BLOCK, (i + 2) * BLOCK, dtype=np.int64) * 7919 + 3) | (1 << 40)
        ids[i] = rng.choice(pool, size=(batch, width))
    return dict(data, ids=ids)


SETTINGS = {
    "sgd": dict(BASE, **SCENARIOS["sgd"]),
    "lazy_adam_host_tier_admission": dict(BASE, **SCENARIOS["lazy_adam_host_tier_admission"]),
    # Alive at a boundary: the last 3 steps' IDs and those of the batches planned ahead.
    "adagrad_admission_eviction": dict(BASE, optimizer="adagrad", access_threshold=2,
                                       eviction_threshold=25, evict_every=3, capacity=200,
                                       constant_init=0.05, steps=40),
}


@pytest.mark.parametrize("scenario", sorted(SETTINGS))
def test_plan_ahead_matches_session_path(mx, tmp_path, scenario):
    settings = SETTINGS[scenario]
    data = _data(settings)
    if settings.get("evict_every"):
        data = _block_stream(settings, data)
    session = _session_run(mx, settings, data)
    stats = eval_stats(session)
    if settings.get("evict_every"):  # the eviction does remove IDs the table needs gone
        assert stats["evicted"] > 0 and stats["rejected"] > 0
        assert len(np.unique(data["ids"])) > settings["capacity"]
    runs = _keras_runs(tmp_path, settings, data, modes=PLANNED)
    for mode, run in runs.items():
        assert_same(run, session, settings, mode, rows=not settings.get("evict_every"))


def test_checkpoint_mid_fit_while_batches_are_planned(mx, tmp_path):
    settings = dict(BASE, **SCENARIOS["adagrad_admission"], ckpt_dir=str(tmp_path / "ckpt"),
                    prefetch=3)
    data = _data(settings)
    session = _session_run(mx, settings, data)
    run = _keras_runs(tmp_path, settings, data, modes=("ckpt_mid_planned",))
    assert eval_stats(session)["rejected"] > 0
    assert_same(run["ckpt_mid_planned"], session, settings, "ckpt_mid_planned",
                stats_keys=("rows_in_use", "ids_tracked"))


def eval_stats(run):
    return json.loads(str(run["stats"]))

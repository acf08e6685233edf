"""A tf.train.Checkpoint of an mxrec.keras model, and Keras' weights file
(model.save_weights("x.weights.h5"), the only format of Keras 3), carry the table's host state
and the optimizer's table slots: Model.fit on
the first half of a stream, a checkpoint, a new init() (empty host tables) and a new model
restored from it, Model.fit on the rest, gives bit for bit the parameters, slots, IDs and
rows of one uninterrupted Model.fit (tests/keras_worker.py, mode "resume"; eager, in a
process of its own). The process-lifetime counters (ids_seen, admitted, ...) restart with
the process; the state (rows in use, IDs tracked) must match. With a host (or SSD) tier the
checkpoint also carries the tier's rows and slots, and every ID's values wherever they live
match.
"""

import json

import numpy as np
import pytest
from test_keras_training import BASE, SCENARIOS, _data, _keras_runs

_RESUMED = ["sgd", "lazy_adam_admission", "adagrad_eviction", "adagrad_host_tier_eviction",
            "lazy_adam_ssd_tier"]


@pytest.mark.parametrize("scenario, mode", [(s, "resume") for s in _RESUMED] + [
    (s, "weights_resume") for s in ("lazy_adam_admission", "adagrad_host_tier_eviction",
                                    "lazy_adam_ssd_tier")])
def test_resume_from_a_keras_checkpoint_equals_one_run(tmp_path, scenario, mode):
    settings = dict(BASE, **SCENARIOS[scenario])
    runs = _keras_runs(tmp_path, settings, _data(settings), modes=("fit", mode))
    once, resumed = runs["fit"], runs[mode]
    assert sorted(once) == sorted(resumed)
    for key in sorted(set(once) - {"stats"}):
        np.testing.assert_array_equal(resumed[key], once[key], err_msg=key)
    state = ("rows_in_use", "ids_tracked")
    stats_once, stats_resumed = (json.loads(str(r["stats"])) for r in (once, resumed))
    assert {k: stats_resumed[k] for k in state} == {k: stats_once[k] for k in state}
    assert stats_resumed["train_batches"] == settings["steps"] - settings["steps"] // 2

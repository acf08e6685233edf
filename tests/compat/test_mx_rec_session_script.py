"""mx_rec's Session demo, written the way an mx_rec user writes it, runs on mxrec.

examples/mx_rec_style/little_demo.py follows mx_rec's public little_demo (module
paths with `mx_rec` renamed to `mxrec`); each case trains (evaluating and saving
with tf.compat.v1.train.Saver), then a second run in predict mode finds the sparse
checkpoint folder, restores, and must hold exactly the tables (tiers and dynamic store
included) and dense weights the training run ended with, and give the evaluation losses a NumPy
forward pass over those computes (and, with initializable iterators, the losses the training
run gave at its end).
"""

import pathlib
import runpy

import numpy as np
import pytest
import tensorflow as tf
from demo_state import assert_same_state, cross_entropy, eval_batches, logits, trained_state

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "mx_rec_style"
SCRIPT = EXAMPLES / "little_demo.py"

# (modify_graph, cache mode, timestamps, one-shot iterators, dynamic expansion, strategy)
CASES = [
    (False, "HBM", False, False, False, None),
    (True, "HBM", True, False, False, None),
    (False, "DDR", True, True, False, None),
    (True, "DDR", False, False, False, None),
    (False, "SSD", False, False, False, None),
    (True, "SSD", True, True, False, None),
    (False, "HBM", False, False, True, "sum_same_id_gradients_and_apply"),
    (True, "HBM", True, False, True, "direct_apply"),
]


def _run(monkeypatch, mode, env, states=None):
    """Runs the demo's main(); with `states`, appends what the session holds at the end of
    training, or right after predict's restore."""
    monkeypatch.setenv("USE_MODE", mode)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    tf.compat.v1.reset_default_graph()  # each run is a process of its own in real use
    main = runpy.run_path(str(SCRIPT))["main"]
    demo_class = main.__globals__["Demo"]

    class Recording(demo_class):
        def train(self, *args):
            step = demo_class.train(self, *args)
            states.append(trained_state(self.session))
            return step

        def infer(self, eval_iterator, eval_model):
            if mode == "predict" and not states:
                states.append(trained_state(self.session))
            return demo_class.infer(self, eval_iterator, eval_model)

    if states is not None:
        monkeypatch.setitem(main.__globals__, "Demo", Recording)
    return main()


@pytest.mark.parametrize("modify_graph, cache, timestamp, one_shot, dynamic, strategy", CASES)
def test_train_then_predict(monkeypatch, tmp_path, modify_graph, cache, timestamp, one_shot,
                            dynamic, strategy):
    monkeypatch.chdir(tmp_path)
    if timestamp and dynamic:
        timestamp = False  # eviction is refused with dynamic expansion (see its own test)
    env = {"USE_MODIFY_GRAPH": str(int(modify_graph)), "CACHE_MODE": cache,
           "USE_TIMESTAMP": str(int(timestamp)), "USE_ONE_SHOT": str(int(one_shot)),
           "USE_DYNAMIC_EXPANSION": str(int(dynamic)), "MXREC_LOG_LEVEL": "WARNING"}
    if strategy:
        env["APPLY_GRADIENTS_STRATEGY"] = strategy
    at_end, restored = [], []
    trained = _run(monkeypatch, "train", env, at_end)
    assert sorted(p.name for p in (tmp_path / "saved-model").glob("sparse-model-0-*")) == [
        "sparse-model-0-12", "sparse-model-0-6"]
    predicted = _run(monkeypatch, "predict", env, restored)
    assert len(predicted) == 3 and np.all(np.isfinite(predicted))
    assert len(at_end) == len(restored) == 1
    assert_same_state(restored[0], at_end[0])
    # The losses of the trained state, computed in NumPy (float64) on the evaluation data
    # (an ID without a row reads the demo's serving_default_value, 2).
    want = [[cross_entropy(logit, label) for logit, label in
             zip(logits(at_end[0], users, items, ["h0", "h1"], default=2.0), labels)]
            for users, items, *labels in eval_batches()]
    np.testing.assert_allclose(predicted, want, rtol=1e-5, atol=1e-6)
    if not one_shot:  # the same evaluation batches: the restored model gives the same losses
        np.testing.assert_allclose(predicted, trained, rtol=1e-5, atol=1e-6)
    else:  # a one-shot evaluation iterator ran dry at training's first evaluation
        assert trained == []

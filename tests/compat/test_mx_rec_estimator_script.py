"""mx_rec's Estimator demo, written the way an mx_rec user writes it, runs on mxrec.

examples/mx_rec_style/little_demo_estimator.py follows mx_rec's public
little_demo_estimator (NPUEstimator / NPURunConfig replaced by tf.estimator's). Each
case runs train_and_evaluate (an evaluation at every checkpoint, steps 6 and 12:
each restores the tables, tiers included, while training has batches planned
ahead), then predict from the last checkpoint: its session must hold exactly the tables (tiers
and dynamic store included) and dense weights training ended with, and its probabilities must be
those a NumPy forward pass over that state computes.
"""

import pathlib
import runpy

import numpy as np
import pytest
import tensorflow as tf
from demo_state import assert_same_state, eval_batches, logits, trained_state
from support import needs_estimator

SCRIPT = (pathlib.Path(__file__).resolve().parents[2] / "examples" / "mx_rec_style"
          / "little_demo_estimator.py")

# (modify_graph, cache mode, timestamps, one-shot, dynamic expansion, prefetch, push ops)
CASES = [
    (False, "DDR", False, False, False, 0, False),
    (True, "DDR", True, True, False, 2, True),
    (False, "SSD", True, False, False, 1, False),
    (True, "SSD", False, False, False, 4, False),
    (True, "HBM", False, False, True, 3, False),
    (False, "HBM", False, True, True, 1, False),
]


def _run(monkeypatch, mode, env, trained=None, restored=None):
    """Runs the script's main(); appends what a training session holds at its end to
    `trained`, and what any other session (evaluation, predict) of the last checkpoint (step
    12) holds once created (restored) to `restored`. (The evaluation at step 6 runs while
    training has batches planned ahead, whose IDs are not trained yet: not a step boundary.)"""
    monkeypatch.setenv("RUN_MODE", mode)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    tf.compat.v1.reset_default_graph()
    main = runpy.run_path(str(SCRIPT))["main"]
    hook_class = main.__globals__["GraphModifierHook"]

    class Recording(hook_class):
        @staticmethod
        def _training():
            return bool(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP))

        def after_create_session(self, session, coord):
            super().after_create_session(session, coord)
            if not self._training() and restored is not None and session.run(
                    tf.compat.v1.train.get_global_step()) == 12:
                restored.append(trained_state(session))

        def end(self, session):
            super().end(session)
            if self._training() and trained is not None:
                trained.append(trained_state(session))

    monkeypatch.setitem(main.__globals__, "GraphModifierHook", Recording)
    return main()


@needs_estimator
@pytest.mark.parametrize("modify_graph, cache, timestamp, one_shot, dynamic, prefetch, push",
                         CASES)
def test_train_and_evaluate_then_predict(monkeypatch, tmp_path, modify_graph, cache, timestamp,
                                         one_shot, dynamic, prefetch, push):
    monkeypatch.chdir(tmp_path)
    env = {"USE_MODIFY_GRAPH": str(int(modify_graph)), "CACHE_MODE": cache,
           "USE_TIMESTAMP": str(int(timestamp)), "USE_ONE_SHOT": str(int(one_shot)),
           "USE_DYNAMIC_EXPANSION": str(int(dynamic)), "PREFETCH_BATCH_NUMBER": str(prefetch),
           "ENABLE_PUSH_OPS_TEST": str(int(push)), "MXREC_LOG_LEVEL": "WARNING"}
    trained, evaluated, restored = [], [], []
    metrics = _run(monkeypatch, "train_and_evaluate", env, trained, evaluated)
    assert metrics["global_step"] == 12 and np.isfinite(metrics["loss"])
    outputs = _run(monkeypatch, "predict", env, restored=restored)
    probs = np.concatenate([o[0] for o in outputs])
    assert probs.shape == (3 * 32,) and np.all((probs > 0) & (probs < 1))
    # Predict (a fresh init and host state) restored exactly what training ended with; so
    # did the evaluation of the last checkpoint.
    assert len(trained) == len(evaluated) == len(restored) == 1
    assert_same_state(restored[0], trained[0])
    assert_same_state(evaluated[-1], trained[0])
    # Its probabilities are those of the trained state, computed in NumPy (float64).
    want = [1 / (1 + np.exp(-logit)) for users, items, *_ in eval_batches()
            for logit in logits(trained[0], users, items, ["h1"])[:2]]
    np.testing.assert_allclose(np.concatenate([o[0] for o in outputs]),
                               np.concatenate(want[0::2]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([o[1] for o in outputs]),
                               np.concatenate(want[1::2]), rtol=1e-5, atol=1e-6)
    # The raw label feature in the predictions is the predicted batch's own (the graph
    # modifier's hook swaps a replaced get_next output in the fetched dict).
    labels = np.concatenate([o[2] for o in outputs])
    rng = np.random.default_rng(2)  # the script's evaluation data: seed 2, 3 batches of 32
    want = []
    for _ in range(3):
        rng.integers(0, 3000, (32, 4)), rng.integers(0, 2000, (32, 6))
        want.append(rng.integers(0, 2, 32).astype(np.float32))
        rng.integers(0, 2, 32)
    np.testing.assert_array_equal(labels, np.concatenate(want))

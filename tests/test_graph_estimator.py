"""GraphModifierHook in tf.estimator, and the two little demos (Session and Estimator) agreeing."""

import importlib.util
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from support import needs_estimator

from mxrec.graph.modifier import GraphModifierHook
from mxrec.util.initialize import get_config_initializer, init

_EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(relative: str, name: str):
    spec = importlib.util.spec_from_file_location(name, _EXAMPLES / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exact_auc(labels, scores) -> float:
    """Area under the ROC curve: the chance that a positive outscores a negative (ties 1/2)."""
    labels = np.asarray(labels).ravel().astype(bool)
    scores = np.asarray(scores, np.float64).ravel()
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):  # average ranks over ties
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    positives, negatives = labels.sum(), (~labels).sum()
    return float((ranks[labels].sum() - positives * (positives + 1) / 2)
                 / (positives * negatives))


def _tf_auc(labels, scores) -> float:
    """tf.compat.v1.metrics.auc (the Estimator's metric) on given predictions, in one batch."""
    with tf.Graph().as_default():
        auc, update = tf.compat.v1.metrics.auc(tf.constant(np.asarray(labels, np.float32)),
                                               tf.constant(np.asarray(scores, np.float32)))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            sess.run(update)
            return float(sess.run(auc))


def test_exact_auc_reference():
    assert _exact_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert _exact_auc([0, 1], [0.5, 0.5]) == 0.5
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 2000)
    scores = labels + rng.normal(0, 1.0, 2000)
    assert _tf_auc(labels, 1 / (1 + np.exp(-scores))) == pytest.approx(
        _exact_auc(labels, scores), abs=0.01)


@pytest.fixture(scope="module")
def session_auc():
    demo = _load("little_demo/main.py", "little_demo_main")
    return demo.run(prefetch_batch_number=2)


def test_session_demo_learns(session_auc):
    assert session_auc > 0.7


@needs_estimator
def test_estimator_train_and_evaluate_matches_session(session_auc, tmp_path):
    demo = _load("little_demo_estimator/main.py", "little_demo_estimator_main")
    auc = demo.run(str(tmp_path), prefetch_batch_number=2)
    assert auc == pytest.approx(session_auc, abs=1e-4)


@needs_estimator
def test_estimator_evaluate_and_predict_do_not_insert(tmp_path):
    demo = _load("little_demo_estimator/main.py", "little_demo_estimator_main")
    model = demo.model
    data = model.make_data(seed=3, train_rows=1024, eval_rows=512)
    init(prefetch_batch_number=1)
    estimator = tf.estimator.Estimator(demo.model_fn, model_dir=str(tmp_path),
                                       config=tf.estimator.RunConfig(tf_random_seed=3))
    estimator.train(lambda: model.dataset(data.train), hooks=[GraphModifierHook()])
    runtime = get_config_initializer()
    before = {name: table.stats() for name, table in runtime.tables.items()}

    metrics = estimator.evaluate(lambda: model.dataset(data.eval), hooks=[GraphModifierHook()])
    predictions = list(estimator.predict(lambda: model.dataset(data.eval[0]),
                                         hooks=[GraphModifierHook()]))
    after = {name: table.stats() for name, table in runtime.tables.items()}

    assert len(predictions) == 512
    probs = np.array([p["prob"] for p in predictions])
    labels = data.eval[1]
    # evaluate and predict see the same model (neither inserted anything): the AUC of the
    # predictions, by TF's metric in a plain session and exactly in NumPy, is evaluate's.
    assert metrics["auc"] == pytest.approx(_tf_auc(labels, probs), abs=1e-5)
    assert metrics["auc"] == pytest.approx(_exact_auc(labels, probs), abs=0.01)
    assert _exact_auc(labels, probs) > 0.55   # and the model learned something
    for name in before:
        assert after[name]["ids_seen"] == before[name]["ids_seen"], name
        assert after[name]["rows_in_use"] == before[name]["rows_in_use"], name
        assert after[name]["eval_batches"] > before[name]["eval_batches"], name

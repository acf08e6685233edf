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

    assert 0.0 <= metrics["auc"] <= 1.0
    assert len(predictions) == 512
    assert all(np.isfinite(p["prob"]) for p in predictions)
    for name in before:
        assert after[name]["ids_seen"] == before[name]["ids_seen"], name
        assert after[name]["rows_in_use"] == before[name]["rows_in_use"], name
        assert after[name]["eval_batches"] > before[name]["eval_batches"], name

"""The little demo with tf.estimator (TensorFlow 2.15): train_and_evaluate with GraphModifierHook.

The same data and model as examples/little_demo; `model_fn` looks up with
`modify_graph=True` and `is_train=(mode == TRAIN)`, and the hook rewrites each
graph the Estimator builds and starts the rewritten iterators. Prints the eval AUC.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python examples/little_demo_estimator/main.py
"""

import argparse
import os
import sys
import tempfile

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "little_demo"))

import model  # noqa: E402  (examples/little_demo/model.py)

from mxrec.graph.modifier import GraphModifierHook  # noqa: E402
from mxrec.util.initialize import init, terminate_config_initializer  # noqa: E402


def model_fn(features, labels, mode):
    is_train = mode == tf.estimator.ModeKeys.TRAIN
    tables = model.create_tables()
    logits = model.model_logits(tables, features, is_train=is_train)
    probs = tf.sigmoid(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"prob": probs})
    loss = model.loss_fn(logits, labels)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops={"auc": tf.compat.v1.metrics.auc(labels, probs)})
    train_op = model.train_op_fn(loss, tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def run(model_dir: str, prefetch_batch_number: int = 2, seed: int = 7) -> float:
    """train_and_evaluate over one pass of the train rows; returns the eval AUC."""
    data = model.make_data(seed)
    init(prefetch_batch_number=prefetch_batch_number)
    try:
        estimator = tf.estimator.Estimator(
            model_fn, model_dir=model_dir,
            config=tf.estimator.RunConfig(tf_random_seed=seed, log_step_count_steps=None))
        train_spec = tf.estimator.TrainSpec(
            lambda: model.dataset(data.train), max_steps=None, hooks=[GraphModifierHook()])
        eval_spec = tf.estimator.EvalSpec(
            lambda: model.dataset(data.eval), steps=None, hooks=[GraphModifierHook()],
            start_delay_secs=0, throttle_secs=0)
        metrics, _ = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
        result = float(metrics["auc"])
        print(f"trained {metrics['global_step']} steps; eval AUC = {result:.4f}")
        return result
    finally:
        terminate_config_initializer()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefetch", type=int, default=2, help="prefetch_batch_number")
    parser.add_argument("--model-dir", default=None, help="defaults to a temporary folder")
    args = parser.parse_args(argv)
    if not hasattr(tf, "estimator"):
        print("tf.estimator is not available in this TensorFlow; use TensorFlow 2.15")
        return 1
    if args.model_dir:
        run(args.model_dir, args.prefetch)
    else:
        with tempfile.TemporaryDirectory() as model_dir:
            run(model_dir, args.prefetch)
    return 0


if __name__ == "__main__":
    sys.exit(main())

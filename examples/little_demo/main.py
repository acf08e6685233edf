"""The little demo in tf.compat.v1.Session: mxRec's "自动改图" (graph modification) flow.

Build the model with `sparse_lookup(..., modify_graph=True)`, call
`modify_graph_and_start_emb_cache()`, and run `get_initializer(True/False)`
where the script ran `iterator.initializer`. Prints the eval AUC.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python examples/little_demo/main.py
"""

import argparse
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import model  # noqa: E402  (the demo's shared module, next to this file)

from mxrec.graph.modifier import modify_graph_and_start_emb_cache  # noqa: E402
from mxrec.util.initialize import get_initializer, init, terminate_config_initializer  # noqa: E402


def run(prefetch_batch_number: int = 2, dump_graph: bool = False, seed: int = 7) -> float:
    """Trains one pass over the train rows, evaluates; returns the eval AUC."""
    data = model.make_data(seed)
    init(prefetch_batch_number=prefetch_batch_number)
    try:
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(seed)
            train_it = tf.compat.v1.data.make_initializable_iterator(
                model.dataset(data.train))
            eval_it = tf.compat.v1.data.make_initializable_iterator(model.dataset(data.eval))
            tables = model.create_tables()

            features, labels = train_it.get_next()
            loss = model.loss_fn(model.model_logits(tables, features, is_train=True), labels)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train_op = model.train_op_fn(loss, global_step)

            eval_features, eval_labels = eval_it.get_next()
            probs = tf.sigmoid(model.model_logits(tables, eval_features, is_train=False))
            auc, auc_update = tf.compat.v1.metrics.auc(eval_labels, probs)

            modify_graph_and_start_emb_cache(dump_graph=dump_graph)

            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer(),
                          tf.compat.v1.local_variables_initializer()])
                sess.run(get_initializer(True))
                steps = 0
                try:
                    while True:
                        sess.run(train_op)
                        steps += 1
                except tf.errors.OutOfRangeError:
                    pass
                sess.run(get_initializer(False))
                try:
                    while True:
                        sess.run(auc_update)
                except tf.errors.OutOfRangeError:
                    pass
                result = float(sess.run(auc))
        print(f"trained {steps} steps; eval AUC = {result:.4f}")
        return result
    finally:
        terminate_config_initializer()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefetch", type=int, default=2, help="prefetch_batch_number")
    parser.add_argument("--dump-graph", action="store_true",
                        help="write the graph before and after the rewrite to ./export_graph")
    args = parser.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    run(args.prefetch, args.dump_graph)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a little one-table model, save it, publish a serving version and a delta of it.

The export loads in TensorFlow Serving or `tf.saved_model.load` without mxrec: each
table is a core-op StaticHashTable plus an embedding matrix, unseen IDs look up as zeros.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python examples/export_serving.py
"""

import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.export import saved_model as serving
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.saver import sparse
from mxrec.serving.versions import export_version
from mxrec.util.initialize import init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable


def model(is_train):
    """ids [B, 2] -> logits [B]; returns (placeholder, logits)."""
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
    table = create_table(tf.int64, 8, "user_table",
                         tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1),
                         device_vocabulary_size=1000)
    emb = tf.reshape(sparse_lookup(table, ids, is_train=is_train), [-1, 16])  # [B, 16]
    w = tf.compat.v1.get_variable("out/kernel", [16, 1],
                                  initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    return ids, tf.reshape(tf.matmul(emb, w), [-1])


def main() -> int:
    tf.compat.v1.disable_eager_execution()
    workdir = tempfile.mkdtemp(prefix="mxrec_export_")
    init()
    try:
        with tf.Graph().as_default():
            ids, logits = model(is_train=True)
            labels = tf.cast(tf.reduce_sum(ids, axis=1) % 2, tf.float32)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                          logits=logits))
            dense, tables = get_dense_and_sparse_variable()
            grads = tf.gradients(loss, dense + tables)
            train_op = tf.group(
                tf.compat.v1.train.AdagradOptimizer(0.1).apply_gradients(
                    zip(grads[:len(dense)], dense)),
                create_hash_optimizer(0.1).apply_gradients(zip(grads[len(dense):], tables)))
            rng = np.random.default_rng(0)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(20):
                    sess.run(train_op, {ids: rng.integers(0, 300, size=[32, 2])})
                ckpt = tf.compat.v1.train.Saver().save(sess, os.path.join(workdir, "ckpt", "m"))
                rows = sparse.export(session=sess)["user_table"]
        print(f"user_table: {len(rows['ids'])} IDs x {rows['embeddings'].shape[1]}")

        def build():
            ids, logits = model(is_train=False)
            return {"ids": ids}, {"prob": tf.sigmoid(logits)}

        # Published as versions of an export base, with the manifest that
        # `python -m mxrec.serving` checks before it loads a version.
        base = os.path.join(workdir, "serving")
        v1 = export_version(base, lambda folder: serving.export_saved_model(folder, ckpt, build))
        delta = {"user_table": {"ids": rows["ids"][:2], "removed": rows["ids"][2:4],
                                "embeddings": np.zeros([2, 8], np.float32)}}
        v2 = export_version(base, lambda folder: serving.apply_delta(v1, delta, folder))
        print(f"exported {v1} and, with a delta applied, {v2}; serve them with\n"
              f"  python -m mxrec.serving --export-base {base} --model-name users")
    finally:
        terminate_config_initializer()
    return 0


if __name__ == "__main__":
    sys.exit(main())

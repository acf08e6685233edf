"""Writes a checkpoint chain (full 10, delta 20, delta 30) with mxrec's whole-array writer
(the code before chunked checkpoints), and the state at step 30 a restore must give back.

Run: PYTHONPATH=<mxrec checkout> python make.py OUT_DIR
"""
import sys
import tempfile

import numpy as np
import tensorflow as tf

from mxrec.core import tiers
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.saver.checkpoint import Saver
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

out = sys.argv[1]
v1 = tf.compat.v1
v1.disable_eager_execution()
init()
ids = v1.placeholder(tf.int64, [None])
tiered = create_table(tf.int64, 4, "tiered", v1.truncated_normal_initializer(0, 0.1, seed=1),
                      device_vocabulary_size=64, host_vocabulary_size=128,
                      ssd_vocabulary_size=1000, ssd_data_path=tempfile.mkdtemp(), init_by_id=True)
plain = create_table(tf.int64, 3, "plain", v1.truncated_normal_initializer(0, 0.1, seed=2),
                     device_vocabulary_size=1000)
scale = v1.get_variable("scale", [], initializer=tf.ones_initializer())
loss = (tf.reduce_sum(tf.square(scale * sparse_lookup(tiered, ids) - 1.0))
        + tf.reduce_sum(tf.square(sparse_lookup(plain, ids) + 1.0)))
dense, tables = get_dense_and_sparse_variable()
sparse_grads = zip(tf.gradients(loss, tables), tables)
train = tf.group(v1.train.GradientDescentOptimizer(0.01).minimize(loss, var_list=dense),
                 create_hash_optimizer(0.1).apply_gradients(sparse_grads))
saver = Saver(out)
with v1.Session() as sess:
    sess.run(v1.global_variables_initializer())
    for step in range(1, 31):
        rng = np.random.default_rng(step)
        sess.run(train, {ids: rng.integers(-2**40, -2**40 + 600, 48)})
        if step % 10 == 0:
            saver.save(sess, step, kind="full" if step == 10 else "delta")
    expected = {}
    for table in (tiered, plain):
        for state, (keys, values) in tiers.export_values(sess, table).items():
            expected[f"{table.table_name}|{state}|ids"] = keys
            expected[f"{table.table_name}|{state}|values"] = values
    expected["scale"] = sess.run(scale)
np.savez(f"{out}/expected.npz", **expected)

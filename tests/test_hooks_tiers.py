"""TableStatsHook on a table with a host tier: rows per tier and swap traffic."""


import numpy as np
import tensorflow as tf
from support import read_scalars

from mxrec.core import tiers
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.hooks import TableStatsHook
from mxrec.optimizers import gradient_descent
from mxrec.util.initialize import init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1


def test_stats_hook_writes_tier_scalars(tmp_path):
    with tf.Graph().as_default():
        init(prefetch_batch_number=0)
        table = create_table(tf.int64, 2, "t", _v1.constant_initializer(0.5),
                             device_vocabulary_size=8, host_vocabulary_size=64)
        ids = _v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(sparse_lookup(table, ids))
        _, sparse = get_dense_and_sparse_variable()
        train = gradient_descent.create_hash_optimizer(0.1).apply_gradients(
            zip(tf.gradients(loss, sparse), sparse))
        hook = TableStatsHook(str(tmp_path), every_n_steps=1)
        seen = {}
        with _v1.train.MonitoredSession(hooks=[hook]) as sess:
            for step in range(1, 5):
                sess.run(train, {ids: np.arange(4) + 4 * step})  # 4 new IDs a step
                seen[step] = tiers.stats(table)
        terminate_config_initializer()
    values = read_scalars(tmp_path)
    for name in ("host_rows", "ssd_rows", "swap_in_last", "swap_out_last"):
        assert {s: values[f"mxrec/t/{name}"][s] for s in seen} == \
            {s: seen[s][name] for s in seen}, name
    # 16 IDs through an 8-row cache: the first two steps fill it, then 4 rows go out a step.
    assert values["mxrec/t/host_rows"][4] == 8
    assert values["mxrec/t/swap_out_last"][4] == 4

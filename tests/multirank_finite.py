"""The Saver's finiteness check on several ranks: run by tests/test_multiworker_saver_finite.py.

    python -m mxrec.launch -n 2 tests/multirank_finite.py --out DIR --report REPORTS

Every rank trains a sharded table and saves a full version (checked). Then a step trains,
rank 1 overwrites a value of one of its own IDs that step trained with NaN, and a checked
delta must fail on every rank (rank 0's own shard is finite) with nothing written; once the
value is finite again the delta holds every ID that step trained. Then rank 0 alone
overwrites a dense value with +inf (dense.npz is rank 0's file): every rank refuses again.
Each rank writes what it saw to REPORTS/rank-R.json; rank 0 also lists DIR.
"""

import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mxrec.core.embedding import create_table, sparse_lookup  # noqa: E402
from mxrec.distributed.communication import (  # noqa: E402
    allreduce,
    get_rank_id,
    get_rank_size,
    session_kwargs,
)
from mxrec.optimizers import gradient_descent  # noqa: E402
from mxrec.saver.checkpoint import NonFiniteError, Saver  # noqa: E402
from mxrec.util.initialize import init, terminate_config_initializer  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

_v1 = tf.compat.v1
_v1.disable_eager_execution()
BATCH, DIM, STEPS = 16, 4, 3


def _batches():
    rng = np.random.default_rng(3)
    return [rng.integers(0, 200, size=BATCH).astype(np.int64) * 7919 for _ in range(STEPS)]


def _refused(sess, saver, step) -> str:
    try:
        saver.save(sess, step, kind="delta")
    except NonFiniteError as err:
        return str(err)
    raise SystemExit(f"rank {get_rank_id()}: the delta at step {step} was not refused")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--report", required=True)
    args = parser.parse_args()
    init(use_mpi=True)
    rank, size = get_rank_id(), get_rank_size()
    ids = _v1.placeholder(tf.int64, [None])
    table = create_table(tf.int64, DIM, "emb", _v1.random_normal_initializer(seed=3),
                         device_vocabulary_size=400,
                         all2all_gradients_op="sum_gradients_and_div_by_ranksize")
    emb = sparse_lookup(table, ids, name="lookup")
    w = _v1.get_variable("w", [DIM], initializer=_v1.ones_initializer())
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb * w, axis=1) - 1.0))
    dense, sparse = get_dense_and_sparse_variable()
    dense_grads = [allreduce(g, "sum") / size for g in tf.gradients(loss, dense)]
    train_op = tf.group(
        _v1.train.GradientDescentOptimizer(0.2).apply_gradients(zip(dense_grads, dense)),
        gradient_descent.create_hash_optimizer(0.2).apply_gradients(
            zip(tf.gradients(loss, sparse), sparse)))
    row, value = _v1.placeholder(tf.int32, []), _v1.placeholder(tf.float32, [DIM])
    set_row = table.variable.scatter_update(tf.IndexedSlices(value[None], row[None]))
    w_value = _v1.placeholder(tf.float32, [DIM])
    set_w = w.assign(w_value)
    saver = Saver(args.out, check_finite=True)
    batches = _batches()
    report = {}
    with _v1.Session(**session_kwargs()) as sess:
        sess.run([_v1.global_variables_initializer(), _v1.local_variables_initializer()])
        for batch in batches[:2]:
            sess.run(train_op, {ids: batch[rank::size]})
        saver.save(sess, 2)
        sess.run(train_op, {ids: batches[2][rank::size]})
        owned, rows = table.export_rows()
        trained = np.intersect1d(owned, batches[2])
        values = sess.run(table.variable)
        if rank == 1:
            poisoned = int(trained[0])
            row_index = int(rows[owned.tolist().index(poisoned)])
            bad = values[row_index].copy()
            bad[1] = np.nan
            sess.run(set_row, {row: row_index, value: bad})
            report["poisoned"] = poisoned
        report["table_message"] = _refused(sess, saver, 3)
        if rank == 1:
            sess.run(set_row, {row: row_index, value: values[row_index]})
        saver.save(sess, 3, kind="delta")
        report["delta_ids"] = saver.serving_delta(3)["emb"]["ids"].tolist()
        report["trained"] = np.unique(batches[2]).tolist()
        good_w = sess.run(w)
        if rank == 0:
            sess.run(set_w, {w_value: np.where(np.arange(DIM) == 3, np.inf, good_w)})
        report["dense_message"] = _refused(sess, saver, 4)
        sess.run(set_w, {w_value: good_w})
        saver.save(sess, 4, kind="delta")
        report["versions"] = saver.versions()
        if rank == 0:
            report["listing"] = sorted(os.listdir(args.out))
    with open(os.path.join(args.report, f"rank-{rank}.json"), "w") as f:
        json.dump(report, f)
    print(f"rank {rank} of {size}: done", flush=True)
    terminate_config_initializer()


if __name__ == "__main__":
    main()

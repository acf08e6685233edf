"""Checkpoint retention on several ranks: run by tests/test_checkpoint_retention.py.

    python -m mxrec.launch -n N tests/multirank_saves.py --out DIR [--runs 5 --steps 30]

Every rank trains a small sharded table and saves into one shared folder with the default
`max_to_keep`. Runs 0 .. runs-1 save a full version every step; one more run ("mixed")
saves a full every third step and deltas in between. Each run uses a fresh folder (and
Saver), in which rank 0 first puts the folders a killed save and a killed deletion leave.
After each run every rank restores every listed version and compares its shard with what
it held when that version was saved; rank 0 checks that no delta outlives its full save
and nothing but the listed versions is left. Any failure exits non-zero.
"""

import argparse
import json
import os
import subprocess
import sys
import time

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
from mxrec.saver import manifest as manifest_io  # noqa: E402
from mxrec.saver.checkpoint import Saver  # noqa: E402
from mxrec.util.initialize import init, terminate_config_initializer  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

_v1 = tf.compat.v1
_v1.disable_eager_execution()
BATCH, FEATURES, DIM = 16, 2, 4


def _data(steps: int, rank: int, size: int):
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 300, size=(steps * BATCH, FEATURES)).astype(np.int64) * 7919
    labels = (rng.random(steps * BATCH) < 0.3).astype(np.float32)
    take = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH)[rank::size]
                           for s in range(steps)])
    return tf.data.Dataset.from_tensor_slices((ids[take], labels[take]))


def _shard(sess, table):
    ids, rows = table.export_rows()
    values = sess.run(table.variable)[rows] if len(rows) else np.zeros((0, DIM), np.float32)
    order = np.argsort(ids)
    return ids[order], values[order]


def _fail(message: str):
    raise SystemExit(f"rank {get_rank_id()}: {message}")


def _plant_stale(directory: str):
    """What a save killed before its rename and a deletion killed before its rmtree leave:
    a sharded save's folder whose writer's process id is now another process's (this one,
    which started at another time), a deletion's folder whose writer is gone, and a folder
    of an earlier mxrec (no writer) untouched for two days."""
    me = manifest_io.this_writer()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    names = (".tmp-full-000000000007-ranks",
             f".tmp-deleted-full-000000000003@{me.host}-{int(gone.stdout)}-1-0a1b2c3d",
             ".tmp-full-000000000005-0a1b")
    for name in names:
        os.makedirs(os.path.join(directory, name))
        with open(os.path.join(directory, name, "table-000-rank00001.npz"), "wb") as f:
            f.write(b"partial")
    with open(os.path.join(directory, names[0], manifest_io.WRITER_FILE), "w") as f:
        json.dump(dict(me._asdict(), start=me.start + 1), f)
    old = time.time() - 2 * 24 * 3600
    for path in (os.path.join(directory, names[2], "table-000-rank00001.npz"),
                 os.path.join(directory, names[2])):
        os.utime(path, (old, old))


def _check_folder(directory: str, versions):
    listed = {manifest_io.version_name(kind, step) for kind, step in versions}
    on_disk = set(os.listdir(directory))
    if on_disk != listed:
        _fail(f"{directory}: on disk {sorted(on_disk - listed)} besides the listed versions")
    fulls = {step for kind, step in versions if kind == "full"}
    for kind, step in versions:
        manifest = manifest_io.read_manifest(directory, kind, step)
        if kind == "delta" and manifest["base"] not in fulls:
            _fail(f"delta {step} outlives its full save {manifest['base']}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    init(use_mpi=True)
    rank, size = get_rank_id(), get_rank_size()
    total_steps = (args.runs + 1) * args.steps
    dataset = _data(total_steps, rank, size).batch(BATCH // size)
    iterator = _v1.data.make_initializable_iterator(dataset)
    features, label = iterator.get_next()
    table = create_table(tf.int64, DIM, "emb", _v1.random_normal_initializer(seed=3),
                         device_vocabulary_size=400,
                         all2all_gradients_op="sum_gradients_and_div_by_ranksize")
    emb = sparse_lookup(table, features, name="lookup")
    weights = _v1.get_variable("w", [DIM, 1], initializer=_v1.glorot_uniform_initializer(1))
    logits = tf.matmul(tf.reduce_sum(emb, 1), weights)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label[:, None],
                                                                  logits=logits))
    dense, sparse = get_dense_and_sparse_variable()
    dense_grads = [allreduce(g, "sum") / size for g in tf.gradients(loss, dense)]
    train_op = tf.group(
        _v1.train.GradientDescentOptimizer(0.2).apply_gradients(zip(dense_grads, dense)),
        gradient_descent.create_hash_optimizer(0.2).apply_gradients(
            zip(tf.gradients(loss, sparse), sparse)))
    barrier = allreduce(tf.constant(1, tf.int32), "sum")
    runs = [("full", run) for run in range(args.runs)] + [("mixed", args.runs)]
    report = []
    with _v1.Session(**session_kwargs()) as sess:
        sess.run([_v1.global_variables_initializer(), _v1.local_variables_initializer(),
                  iterator.initializer])
        for pattern, run in runs:
            directory = os.path.join(args.out, f"run-{run}")
            if rank == 0:
                os.makedirs(directory)
                _plant_stale(directory)
            sess.run(barrier)
            saver = Saver(directory)  # the default max_to_keep
            sess.run(barrier)
            if any(name.startswith(".tmp-") for name in os.listdir(directory)):
                _fail(f"{directory}: a killed save's folder outlived the next start")
            held, saved = {}, []
            for step in range(1, args.steps + 1):
                sess.run(train_op)
                kind = "full" if pattern == "full" or step % 3 == 1 else "delta"
                saver.save(sess, step, kind=kind)
                saved.append((kind, step))
                held[step] = _shard(sess, table), sess.run(weights)
            sess.run(barrier)  # rank 0's deletions are done
            versions = saver.versions()
            if rank == 0:
                _check_folder(directory, versions)
            saved_fulls = [step for kind, step in saved if kind == "full"]
            oldest_kept = saved_fulls[-saver.max_to_keep:][0]
            want = [(kind, step) for kind, step in saved if step >= oldest_kept]
            if versions != want:
                _fail(f"{directory}: listed {versions}, want {want} (max_to_keep "
                      f"{saver.max_to_keep})")
            for _, step in versions:
                if saver.restore(sess, version=step) != step:
                    _fail(f"{directory}: restore of step {step} gave another step")
                (want_ids, want_values), want_w = held[step]
                got_ids, got_values = _shard(sess, table)
                np.testing.assert_array_equal(got_ids, want_ids)
                np.testing.assert_array_equal(got_values, want_values)
                np.testing.assert_array_equal(sess.run(weights), want_w)
            report.append(dict(run=run, pattern=pattern, versions=versions))
            # Later runs go on from the last step, as training would.
            saver.restore(sess, version=args.steps)
            sess.run(barrier)
    if rank == 0:
        with open(os.path.join(args.out, "report.json"), "w") as f:
            json.dump(report, f)
    print(f"rank {rank} of {size}: {len(runs)} runs checked", flush=True)
    terminate_config_initializer()


if __name__ == "__main__":
    main()

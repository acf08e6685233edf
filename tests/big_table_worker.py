"""One phase of tests/test_big_table.py, run inside a memory cgroup it joins first.

    big_table_worker.py CGROUP_DIR CKPT_DIR SSD_DIR IDS train|restore

train: every ID 0..IDS-1 trained once (Adagrad, gradient w(id) on every dim), a full save;
the IDs divisible by 3 trained again, a delta save. restore: the chain restored into a new
process, every ID read back by evaluation lookups a batch at a time and compared with
Adagrad's closed form; then the first batch trained once more and compared again (the
restored accumulators). Under `python -m mxrec.launch -n N` the restore reshards the chain
onto N ranks, each reading back its share of the IDs. export: the chain's serving export
(SavedModel) into CKPT_DIR/../export. Prints "OK <seconds per part>".
"""

import os
import sys
import time

cgroup, ckpt, ssd, ids_total, phase = sys.argv[1:6]
with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:  # before the table exists
    procs.write(str(os.getpid()))

import threading  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mxrec.core.embedding import create_table, sparse_lookup  # noqa: E402
from mxrec.optimizers.adagrad import create_hash_optimizer  # noqa: E402
from mxrec.saver.checkpoint import Saver  # noqa: E402
from mxrec.util.initialize import init  # noqa: E402
from mxrec.util.ranks import get_rank_id, get_rank_size  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

DIM = 128
BATCH = 1 << 15
LR, ACC0, INIT = 0.1, 0.9, 0.01
N = int(ids_total)
v1 = tf.compat.v1
v1.disable_eager_execution()


def weight(keys: np.ndarray) -> np.ndarray:
    """The gradient of ID k on every dim: distinct per ID, in [0.5, 1.5)."""
    return ((keys * 2654435761) % 1000003).astype(np.float64) / 1000003 + 0.5


def closed_form(keys: np.ndarray, updates: np.ndarray) -> np.ndarray:
    """Adagrad's embedding after `updates` steps of gradient w(k) from INIT."""
    w = weight(keys)
    value = np.full(len(keys), INIT)
    acc = np.full(len(keys), ACC0)
    for step in range(1, int(updates.max(initial=0)) + 1):
        hit = updates >= step
        acc = np.where(hit, acc + w * w, acc)
        value = np.where(hit, value - LR * w / np.sqrt(acc), value)
    return value


init()
if phase == "export":  # the serving export of the chain, a chunk of rows at a time
    from mxrec.export.saved_model import export_saved_model

    def build():
        query = v1.placeholder(tf.int64, [None], name="ids")
        serving = create_table(tf.int64, DIM, "big", v1.constant_initializer(INIT),
                               device_vocabulary_size=8)
        return {"ids": query}, {"emb": sparse_lookup(serving, query, is_train=False)}

    start = time.perf_counter()
    export_saved_model(os.path.join(os.path.dirname(ckpt), "export"), ckpt, build)
    print(f"OK export={time.perf_counter() - start:.1f}s", flush=True)
    sys.exit(0)
ids = v1.placeholder(tf.int64, [None])
grads = v1.placeholder(tf.float32, [None])
table = create_table(tf.int64, DIM, "big", v1.constant_initializer(INIT),
                     device_vocabulary_size=4 * BATCH, host_vocabulary_size=4 * BATCH,
                     ssd_vocabulary_size=N, ssd_data_path=ssd)
loss = tf.reduce_sum(sparse_lookup(table, ids, name="train") * grads[:, None])
_, sparse = get_dense_and_sparse_variable()
train = create_hash_optimizer(LR, ACC0).apply_gradients(zip(tf.gradients(loss, sparse), sparse))
read = sparse_lookup(table, ids, is_train=False, name="read")
saver = Saver(ckpt, checkpoint_memory_mb=64)
config = v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
times = {}
peak_kib = [0]


def sample_rss_anon():
    """The peak of this process's anonymous RSS, sampled every 20 ms."""
    while True:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    peak_kib[0] = max(peak_kib[0], int(line.split()[1]))
        time.sleep(0.02)


threading.Thread(target=sample_rss_anon, daemon=True).start()


def run_over(sess, keys):
    for begin in range(0, len(keys), BATCH):
        part = keys[begin:begin + BATCH]
        sess.run(train, {ids: part, grads: weight(part).astype(np.float32)})


def check(sess, keys, updates, what):
    worst = 0.0
    for begin in range(0, len(keys), BATCH):
        part = keys[begin:begin + BATCH]
        got = sess.run(read, {ids: part})
        want = closed_form(part, updates[begin:begin + BATCH])
        worst = max(worst, float(np.abs(got - want[:, None]).max()))
    if worst > 2e-5:
        raise SystemExit(f"{what}: off the closed form by {worst}")


with v1.Session(config=config) as sess:
    sess.run(v1.global_variables_initializer())
    every = np.arange(N, dtype=np.int64)
    start = time.perf_counter()
    if phase == "train":
        run_over(sess, every)
        times["train"] = time.perf_counter() - start
        start = time.perf_counter()
        saver.save(sess, 1)
        times["full"] = time.perf_counter() - start
        run_over(sess, every[every % 3 == 0])
        start = time.perf_counter()
        saver.save(sess, 2, kind="delta")
        times["delta"] = time.perf_counter() - start
    else:
        assert saver.restore(sess) == 2
        times["restore"] = time.perf_counter() - start
        start = time.perf_counter()
        # On several ranks each looks up its share of the IDs (as many batches on each).
        mine = every[get_rank_id()::get_rank_size()]
        check(sess, mine, 1 + (mine % 3 == 0), "restored")
        if get_rank_size() == 1:
            first = every[:BATCH]
            run_over(sess, first)
            check(sess, first, 2 + (first % 3 == 0), "trained after the restore")
        times["check"] = time.perf_counter() - start
print("OK", " ".join(f"{k}={v:.1f}s" for k, v in times.items()),
      f"peak_rss_anon={peak_kib[0] / 2**20:.2f}GiB", flush=True)

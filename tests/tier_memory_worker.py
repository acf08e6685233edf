"""Trains one tiered table of more IDs than the process's memory limit holds (run by
tests/test_tiers_larger_than_memory.py inside a memory cgroup) and checks probe IDs against
Adagrad's updates computed here in NumPy. Prints one JSON line with what it measured.

    python tests/tier_memory_worker.py IDS SSD_DIR
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mxrec.core import tiers  # noqa: E402
from mxrec.core.embedding import create_table, sparse_lookup  # noqa: E402
from mxrec.optimizers.adagrad import create_hash_optimizer  # noqa: E402
from mxrec.util.initialize import init  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

DIM = 64
BATCH = 1024
POSITIONS = 16
PROBES = 64
LR = np.float32(0.05)
ACC0 = np.float32(0.9)
START = np.float32(0.5)


def build(ids_total: int, ssd_dir: str):
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    init()
    table = create_table(tf.int64, DIM, "larger_than_memory", v1.constant_initializer(0.5),
                         device_vocabulary_size=100_000, host_vocabulary_size=200_000,
                         ssd_vocabulary_size=ids_total, ssd_data_path=ssd_dir)
    ids = v1.placeholder(tf.int64, [BATCH, POSITIONS])
    emb = sparse_lookup(table, ids)
    loss = tf.reduce_sum(tf.square(emb - 1.0))
    _, sparse = get_dense_and_sparse_variable()
    train = create_hash_optimizer(float(LR), initial_accumulator_value=float(ACC0)) \
        .apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    return ids, emb, train, table


def probe_steps(steps: int) -> list:
    """The steps probe p appears in: a few early ones, then after gaps long enough for its
    row to leave the device cache and the host tier, so it comes back from every tier."""
    return [sorted({(p + k * (3 + p % 7) ** 2) % steps for k in range(6)}) for p in range(PROBES)]


def main() -> int:
    ids_total, ssd_dir = int(sys.argv[1]), sys.argv[2]
    ids, emb, train, table = build(ids_total, ssd_dir)
    new = BATCH * POSITIONS - PROBES  # never-seen IDs per step, beside the probe slots
    steps = -(-ids_total // new)
    appears = probe_steps(steps)
    want = {p: (np.full(DIM, START, np.float32), np.full(DIM, ACC0, np.float32))
            for p in range(PROBES)}
    rng = np.random.default_rng(0)
    worst = 0.0
    checked = 0
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(steps):
            batch = np.arange(step * new, (step + 1) * new, dtype=np.int64) + PROBES
            here = [p for p in range(PROBES) if step in appears[p]]
            # Probes not in this step take their place from the filler IDs 0..PROBES-1's
            # range: the IDs PROBES + ... are new ones, each seen once.
            fill = np.arange(len(here), PROBES) + ids_total + 10 * PROBES + step * PROBES
            batch = rng.permutation(np.concatenate([batch, np.array(here, np.int64), fill]))
            batch = batch.reshape(BATCH, POSITIONS)
            got, _ = sess.run([emb, train], {ids: batch})
            flat = got.reshape(-1, DIM)
            for p in here:
                (where,) = np.nonzero(batch.reshape(-1) == p)
                value, acc = want[p]
                worst = max(worst, float(np.max(np.abs(flat[where[0]] - value))))
                checked += 1
                grad = np.float32(2) * (value - np.float32(1))
                acc = acc + grad * grad
                want[p] = (value - LR * grad / np.sqrt(acc), acc)
        stats = tiers.stats(table)
    print(json.dumps({"worst": worst, "checked": checked, "steps": steps,
                      "ssd_rows": stats["ssd_rows"], "host_rows": stats["host_rows"],
                      "device_rows": stats["device_rows"], "swap_in": stats["swap_in_total"],
                      "value_bytes": ids_total * DIM * 4 * 2}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

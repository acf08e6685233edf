"""Training throughput with a device cache over the host tier, against device-only mode.

Both variants train the same model on the same batches in one process (graph
modifier, prefetch 2, Adagrad): one table addressed by Zipf-distributed IDs,
26 features per sample. The device-only table holds every ID; the tiered table
holds `--cache` of them on the device and the rest in host memory (and, with
`--ssd_share`, part of those on disk). Both stay loaded (one graph and session
each) and take turns of `--block_steps` steps, `--blocks` turns each, so that a
change in the machine's speed falls on both alike. Prints a Markdown table with
samples/s, the ratio to device-only over all turns and the spread of the
per-turn ratios, swap traffic per step and host memory per million IDs.

    PYTHONPATH=. .venv/bin/python bench/bench_tiers.py --cache 0.1
"""

import argparse
import os
import platform
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mxrec._lib import loader  # noqa: E402
from mxrec.core import tiers  # noqa: E402
from mxrec.core.embedding import create_table, sparse_lookup  # noqa: E402
from mxrec.graph.modifier import modify_graph_and_start_emb_cache  # noqa: E402
from mxrec.optimizers import adagrad  # noqa: E402
from mxrec.util.initialize import get_initializer, init, terminate_config_initializer  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

_v1 = tf.compat.v1
FEATURES = 26


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=200_000, help="ID space of the Zipf draw")
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=60, help="batches in the data (repeated)")
    parser.add_argument("--blocks", type=int, default=20, help="turns of each variant")
    parser.add_argument("--block_steps", type=int, default=25, help="timed steps per turn")
    parser.add_argument("--warmup", type=int, default=60, help="untimed steps first")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--zipf", type=float, default=1.15, help="Zipf exponent")
    parser.add_argument("--cache", type=float, default=0.10,
                        help="device rows as a share of the distinct IDs")
    parser.add_argument("--ssd_share", type=float, default=0.0,
                        help="share of the distinct IDs kept on SSD (0: no SSD tier)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory_ids", type=int, default=1_000_000,
                        help="IDs streamed through a tiered table to measure host memory")
    parser.add_argument("--gather_swap", action="store_true",
                        help="swap through gather/scatter as a GPU table does, not in place")
    return parser.parse_args(argv)


def _build(args, ids, labels, name, device_rows, host_rows=0, ssd_rows=0, ssd_path=None):
    """One variant in a graph and session of its own: (session, train op, table)."""
    graph = tf.Graph()
    with graph.as_default():
        dataset = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(args.batch_size)
        iterator = _v1.data.make_initializable_iterator(dataset.repeat())
        x, y = iterator.get_next()
        extra = {}
        if ssd_rows:
            extra = {"ssd_vocabulary_size": ssd_rows, "ssd_data_path": ssd_path}
        table = create_table(tf.int64, args.dim, name, _v1.constant_initializer(0.01),
                             device_vocabulary_size=device_rows,
                             host_vocabulary_size=host_rows, **extra)
        emb = tf.reshape(sparse_lookup(table, x, modify_graph=True), [-1, FEATURES * args.dim])
        weight = _v1.get_variable("w", [FEATURES * args.dim, 1],
                                  initializer=_v1.glorot_uniform_initializer(seed=1))
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=emb @ weight))
        dense, sparse = get_dense_and_sparse_variable()
        train = tf.group(
            _v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
            adagrad.create_hash_optimizer(0.1).apply_gradients(
                zip(tf.gradients(loss, sparse), sparse)))
        modify_graph_and_start_emb_cache()
        sess = _v1.Session(graph=graph)
        sess.run(_v1.global_variables_initializer())
        sess.run(get_initializer(True))
        for _ in range(args.warmup):
            sess.run(train)
    return sess, train, table


def _time_steps(sess, train, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        sess.run(train)
    return time.perf_counter() - start


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def host_bytes_per_id(dim: int, total_ids: int, device_rows: int, batch: int) -> tuple:
    """Growth of the process's resident memory per ID held by a tiered table: a stream of
    `total_ids` new IDs through the key stage and the swaps of the embedding and one optimizer
    slot (Adagrad's), straight on the engine. Returns (RSS bytes per ID, tier store bytes per
    ID, IDs in the host tier)."""
    engine = loader.engine()
    key = "bench_tiers/memory"
    engine.create_table(key=key, name="memory", dim=dim, capacity=device_rows,
                        host_capacity=total_ids)
    engine.tier_register(key, "optimizer/slot")
    device = np.zeros((device_rows, dim), np.float32)
    before = _rss_bytes()
    for start in range(0, total_ids, batch):
        ids = np.arange(start, min(start + batch, total_ids), dtype=np.int64)
        (_, _, reused), = engine.process([key], [ids], True, start)
        for component in ("embedding", "optimizer/slot"):
            engine.tier_swap(key, component, reused, device[reused])
    grown = _rss_bytes() - before
    stats = engine.tier_stats(key)
    engine.drop_prefix(key)
    return grown / total_ids, stats["host_bytes"] / max(1, stats["host_rows"]), stats["host_rows"]


def main(argv=None):
    args = parse_args(argv)
    tiers.SWAP_IN_PLACE = not args.gather_swap
    if args.memory_ids:  # first, while the heap holds nothing TensorFlow freed
        rss, store, held = host_bytes_per_id(args.dim, args.memory_ids, 100_000, 50_000)
    rng = np.random.default_rng(args.seed)
    samples = args.batch_size * args.steps
    ids = (rng.zipf(args.zipf, size=(samples, FEATURES)) % args.ids).astype(np.int64)
    labels = rng.integers(0, 2, size=(samples, 1)).astype(np.float32)
    per_batch = [len(np.unique(ids[i * args.batch_size:(i + 1) * args.batch_size]))
                 for i in range(args.steps)]
    distinct = len(np.unique(ids))

    # The cache must hold one step's unique IDs (the step being trained is protected).
    cache = max(int(distinct * args.cache), max(per_batch) + 16)
    ssd_rows = int(distinct * args.ssd_share)
    host_rows = distinct - ssd_rows if ssd_rows else distinct
    ssd_dir = tempfile.mkdtemp(prefix="mxrec_bench_ssd_") if ssd_rows else None
    init(prefetch_batch_number=2)
    sessions = []
    try:
        device_variant = _build(args, ids, labels, "device_only", distinct + 16)
        sessions.append(device_variant[0])
        tiered_variant = _build(args, ids, labels, "tiered", cache, host_rows, ssd_rows,
                                ssd_dir)
        sessions.append(tiered_variant[0])
        # Both models stay loaded and take turns, a block of steps each, the order
        # alternating: a change in the machine's speed falls on both alike.
        seconds = {"device": 0.0, "tiered": 0.0}
        ratios = []
        for block in range(args.blocks):
            turns = [("device", device_variant), ("tiered", tiered_variant)]
            timed = {}
            for label, (sess, train, _) in (turns if block % 2 == 0 else turns[::-1]):
                timed[label] = _time_steps(sess, train, args.block_steps)
                seconds[label] += timed[label]
            ratios.append(timed["device"] / timed["tiered"])
        stats = tiers.stats(tiered_variant[2])
    finally:
        for sess in sessions:
            sess.close()
        terminate_config_initializer()
        if ssd_dir:
            shutil.rmtree(ssd_dir, ignore_errors=True)
    measured = args.blocks * args.block_steps * args.batch_size
    device_only = measured / seconds["device"]
    tiered = measured / seconds["tiered"]

    steps = args.warmup + args.blocks * args.block_steps  # steps each variant trained
    print(f"machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
          f"TensorFlow {tf.__version__}")
    print(f"data: {samples} samples x {FEATURES} features, Zipf({args.zipf}) over "
          f"{args.ids} IDs: {distinct} distinct, {np.mean(per_batch):.0f} unique per batch "
          f"(max {max(per_batch)}); batch {args.batch_size}, dim {args.dim}, Adagrad, "
          f"prefetch 2, {args.blocks} blocks of {args.block_steps} measured steps each")
    print()
    print("| mode | device rows | samples/s | ratio to device-only |")
    print("|---|---:|---:|---:|")
    print(f"| device-only | {distinct + 16} | {device_only:,.0f} | 1.00 |")
    label = "host tier" + (f" + SSD ({args.ssd_share:.0%})" if ssd_rows else "")
    label += ", gather/scatter swaps" if args.gather_swap else ""
    print(f"| {label} | {cache} ({cache / distinct:.0%}) | {tiered:,.0f} | "
          f"{tiered / device_only:.2f} |")
    print()
    print(f"ratio per block: median {np.median(ratios):.2f}, quartiles "
          f"{np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f}")
    print()
    print(f"swap traffic per step: {stats['swap_in_total'] / steps:,.0f} rows in from the "
          f"host tier, {stats['swap_out_total'] / steps:,.0f} out, "
          f"{stats['fresh_total'] / steps:,.0f} new rows from the initializer")
    if args.memory_ids:
        print(f"host memory, {args.memory_ids:,} new IDs streamed through a tiered table "
              f"(dim {args.dim}, embedding + one optimizer slot, {held:,} IDs in the host "
              f"tier): resident memory grew {rss * 1e6 / 2**20:,.0f} MiB per million IDs, "
              f"of which the tier's value store {store * 1e6 / 2**20:,.0f} MiB (the rest: "
              "the ID map and its records)")


if __name__ == "__main__":
    main()

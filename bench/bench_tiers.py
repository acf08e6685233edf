"""Training throughput with a device cache over the host (and SSD) tier, against device-only.

The variants train the same model on the same batches in one process (graph
modifier, prefetch 2, Adagrad): one table addressed by Zipf-distributed IDs,
26 features per sample. The device-only table holds every ID; the tiered tables
hold `--cache` of them on the device and the rest in host memory, or (with
`--ssd_share` > 0, a third variant) `--ssd_share` of the distinct IDs on disk and
the rest in host memory. By default no batch repeats (`--steps 0`: as many
batches as the run trains), so the Zipf tail brings new IDs throughout and
admission and row assignment are measured too. All variants stay loaded (one
graph and session each) and take turns of `--block_steps` steps, `--blocks`
turns each, so that a change in the machine's speed falls on all alike. Prints a
Markdown table with samples/s, the ratio to device-only over all turns (the ratio the goals
state) and the spread of the per-turn ratios, swap traffic per step and host memory per
million IDs.

    PYTHONPATH=. .venv/bin/python bench/bench_tiers.py [--cache 0.1 --ssd_share 0.5]
    PYTHONPATH=. .venv/bin/python bench/bench_tiers.py --quick --json tiers.json
"""

import argparse
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import report  # noqa: E402
from bench.machine import cpu_name  # noqa: E402
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
    parser.add_argument("--steps", type=int, default=0,
                        help="batches in the data, repeated (0: as many as the run trains, "
                             "so none repeats)")
    parser.add_argument("--blocks", type=int, default=None,
                        help="turns of each variant (20; --quick 6)")
    parser.add_argument("--block_steps", type=int, default=None,
                        help="timed steps per turn (25; --quick 15)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps first (60; --quick 20)")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--zipf", type=float, default=1.15, help="Zipf exponent")
    parser.add_argument("--cache", type=float, default=0.10,
                        help="device rows as a share of the distinct IDs")
    parser.add_argument("--ssd_share", type=float, default=0.5,
                        help="share of the distinct IDs kept on SSD by the third variant "
                             "(0: no SSD variant)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory_ids", type=int, default=None,
                        help="IDs streamed through a tiered table to measure host memory "
                             "(1000000; --quick 200000; 0: skip)")
    parser.add_argument("--gather_swap", action="store_true",
                        help="swap through gather/scatter as a GPU table does, not in place")
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    quick = {"blocks": (20, 6), "block_steps": (25, 15), "warmup": (60, 20),
             "memory_ids": (1_000_000, 200_000)}
    for name, (full, short) in quick.items():
        if getattr(args, name) is None:
            setattr(args, name, short if args.quick else full)
    if args.blocks < 1 or args.block_steps < 1 or args.warmup < 0 or args.steps < 0:
        parser.error("--blocks and --block_steps must be >= 1, --warmup and --steps >= 0")
    if not 0.0 < args.cache <= 1.0 or not 0.0 <= args.ssd_share < 1.0:
        parser.error("--cache must be in (0, 1] and --ssd_share in [0, 1)")
    return args


def _build(args, ids, labels, name, device_rows, host_rows=0, ssd_rows=0, ssd_path=None):
    """One variant in a graph and session of its own: (session, train op, table)."""
    graph = tf.Graph()
    with graph.as_default():
        # Fed through placeholders when the iterator starts, so the batches do not
        # become constants in the graph.
        arrays = [_v1.placeholder(a.dtype, a.shape) for a in (ids, labels)]
        dataset = tf.data.Dataset.from_tensor_slices(tuple(arrays)).batch(args.batch_size)
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
        sess.run(get_initializer(True), feed_dict=dict(zip(arrays, (ids, labels))))
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


# Unmeasured steps of a variant before each of its turns: while it waits for its
# turn its pipeline fills the prefetch buffer, and those batches must not count as free.
SETTLE = 3


def main(argv=None):
    args = parse_args(argv)
    tiers.SWAP_IN_PLACE = not args.gather_swap
    if args.memory_ids:  # first, while the heap holds nothing TensorFlow freed
        rss, store, held = host_bytes_per_id(args.dim, args.memory_ids, 100_000, 50_000)
    rng = np.random.default_rng(args.seed)
    trained = args.warmup + args.blocks * (args.block_steps + SETTLE) + 8  # + prefetch depth
    steps = args.steps or trained
    samples = args.batch_size * steps
    ids = (rng.zipf(args.zipf, size=(samples, FEATURES)) % args.ids).astype(np.int64)
    labels = rng.integers(0, 2, size=(samples, 1)).astype(np.float32)
    per_batch = [len(np.unique(ids[i * args.batch_size:(i + 1) * args.batch_size]))
                 for i in range(steps)]
    distinct = len(np.unique(ids))

    # The cache must hold one step's unique IDs (the step being trained is protected).
    cache = max(int(distinct * args.cache), max(per_batch) + 16)
    ssd_rows = int(distinct * args.ssd_share)
    ssd_dir = tempfile.mkdtemp(prefix="mxrec_bench_ssd_") if ssd_rows else None
    init(prefetch_batch_number=2)
    variants = {}
    try:
        variants["device"] = _build(args, ids, labels, "device_only", distinct + 16)
        variants["host"] = _build(args, ids, labels, "tiered", cache, distinct)
        if ssd_rows:
            variants["ssd"] = _build(args, ids, labels, "tiered_ssd", cache,
                                     distinct - ssd_rows, ssd_rows, ssd_dir)
        # All models stay loaded and take turns, a block of steps each, the order
        # rotating: a change in the machine's speed falls on all alike.
        seconds = dict.fromkeys(variants, 0.0)
        ratios = {label: [] for label in variants if label != "device"}
        order = list(variants)
        for block in range(args.blocks):
            timed = {}
            shift = block % len(order)
            for label in order[shift:] + order[:shift]:
                sess, train, _ = variants[label]
                _time_steps(sess, train, SETTLE)
                timed[label] = _time_steps(sess, train, args.block_steps)
                seconds[label] += timed[label]
            for label in ratios:
                ratios[label].append(timed["device"] / timed[label])
        stats = {label: tiers.stats(variants[label][2]) for label in ratios}
    finally:
        for sess, _, _ in variants.values():
            sess.close()
        terminate_config_initializer()
        if ssd_dir:
            shutil.rmtree(ssd_dir, ignore_errors=True)
    measured = args.blocks * args.block_steps * args.batch_size
    rate = {label: measured / seconds[label] for label in variants}

    trained_steps = args.warmup + args.blocks * (args.block_steps + SETTLE)
    repeats = "none repeats" if trained <= steps else f"repeated every {steps} batches"
    print(f"machine: {os.cpu_count()} CPUs ({cpu_name()}), TensorFlow {tf.__version__}")
    print(f"data: {samples} samples x {FEATURES} features ({repeats}), Zipf({args.zipf}) over "
          f"{args.ids} IDs: {distinct} distinct, {np.mean(per_batch):.0f} unique per batch "
          f"(max {max(per_batch)}); batch {args.batch_size}, dim {args.dim}, Adagrad, "
          f"prefetch 2, {args.blocks} blocks of {args.block_steps} measured steps each "
          f"(after {SETTLE} unmeasured)")
    print()
    print("| mode | device rows | host rows | SSD rows | samples/s | ratio to device-only "
          "| per-block ratio: median (quartiles) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    print(f"| device-only | {distinct + 16} | 0 | 0 | {rate['device']:,.0f} | 1.00 | |")
    swap = ", gather/scatter swaps" if args.gather_swap else ""
    rows = {"host": (distinct, 0), "ssd": (distinct - ssd_rows, ssd_rows)}
    labels_of = {"host": "host tier" + swap,
                 "ssd": f"host tier + SSD ({args.ssd_share:.0%} of the IDs)" + swap}
    for label in ratios:
        print(f"| {labels_of[label]} | {cache} ({cache / distinct:.0%}) | {rows[label][0]} | "
              f"{rows[label][1]} | {rate[label]:,.0f} | {rate[label] / rate['device']:.2f} | "
              f"{np.median(ratios[label]):.2f} ({np.percentile(ratios[label], 25):.2f}-"
              f"{np.percentile(ratios[label], 75):.2f}) |")
    print()
    for label in ratios:
        s = stats[label]
        print(f"swap traffic per step, {labels_of[label]}: "
              f"{s['swap_in_total'] / trained_steps:,.0f} rows in from the host tier, "
              f"{s['swap_out_total'] / trained_steps:,.0f} out, "
              f"{s['fresh_total'] / trained_steps:,.0f} new rows from the initializer; "
              f"{s.get('ssd_rows', 0):,} rows on disk at the end")
    if args.memory_ids:
        print(f"host memory, {args.memory_ids:,} new IDs streamed through a tiered table "
              f"(dim {args.dim}, embedding + one optimizer slot, {held:,} IDs in the host "
              f"tier): resident memory grew {rss * 1e6 / 2**20:,.0f} MiB per million IDs, "
              f"of which the tier's value store {store * 1e6 / 2**20:,.0f} MiB (the rest: "
              "the ID map and its records)")

    out = report.Report()
    out.figure("device-only samples/s", round(rate["device"]))
    for label in ratios:
        out.figure(f"{labels_of[label]} samples/s", round(rate[label]))
        out.figure(f"{labels_of[label]} swap-ins per step",
                   round(stats[label]["swap_in_total"] / trained_steps))
    # The goals state the ratio over the whole run (all turns' samples over all turns'
    # seconds: what a user's run gets); the median of the per-turn ratios, which a turn that
    # other work on the machine slowed down moves less, is a figure beside it.
    out.goal(f"host tier, {args.cache:.0%} device cache: x device-only (whole run: samples/s "
             "over all turns)", rate["host"] / rate["device"], 0.9)
    out.figure("host tier: x device-only, median of the per-turn ratios",
               round(float(np.median(ratios["host"])), 3))
    if "ssd" in ratios:
        out.goal(f"SSD tier, {args.ssd_share:.0%} of the IDs on disk: x device-only (whole "
                 "run: samples/s over all turns)", rate["ssd"] / rate["device"], 0.6)
        out.figure("SSD tier: x device-only, median of the per-turn ratios",
                   round(float(np.median(ratios["ssd"])), 3))
    if args.memory_ids:
        out.figure("tiered table, resident MiB per million IDs (dim 16 + one slot)",
                   round(rss * 1e6 / 2**20, 1))
    out.write(args.json)


if __name__ == "__main__":
    main()

"""Training throughput of the demo DLRM: mxrec tables against plain TensorFlow.

(a) mxrec: 26 tables addressed by raw int64 IDs (`sparse_lookup`: host key stage,
    gather of the unique rows), trained by an mxrec hash optimizer.
(b) baseline: 26 fixed-size tf.Variables with the same row counts, indexed by
    `ID mod rows` through `tf.gather`, trained by the same sparse rule as a TF1
    optimizer.

Both read the same pre-generated batches from memory (tf.data, repeated), so
data generation is not measured, and both run in this process, alternating in
rounds after warm-up steps, so that load from elsewhere falls on both alike.
The key stage runs inside the step here (there is no pipelining in this graph).

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_train.py [--steps 150 --profile 5 ...]
"""

import argparse
import collections
import os
import platform
import sys
import time

# Before TensorFlow loads: its C++ start-up lines would bury the table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from examples.model import (  # noqa: E402
    TrainConfig,
    build_hashed_training,
    build_mxrec_training,
)
from examples.synthetic_criteo import SyntheticCriteo  # noqa: E402
from mxrec.util.initialize import (  # noqa: E402
    get_config_initializer,
    init,
    terminate_config_initializer,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch_size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=150, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured steps per variant")
    parser.add_argument("--rounds", type=int, default=5,
                        help="the measured steps alternate between the variants in this many "
                             "rounds")
    parser.add_argument("--num_batches", type=int, default=64,
                        help="distinct pre-generated batches, repeated")
    parser.add_argument("--max_vocab", type=int, default=200_000,
                        help="cap on each feature's vocabulary")
    parser.add_argument("--sparse_optimizer", choices=("adagrad", "lazy_adam"),
                        default=TrainConfig().sparse_optimizer)
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also trace this many steps per variant and print the time by op "
                             "type")
    parser.add_argument("--key_threads", type=int, default=None,
                        help="key-stage threads (default: init()'s, from KEY_PROCESS_THREAD_NUM "
                             "or the CPU count up to 6)")
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args(argv)
    for name in ("batch_size", "steps", "rounds", "num_batches", "max_vocab"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.warmup < 0 or args.profile < 0:
        parser.error("--warmup and --profile must be >= 0")
    return args


class Variant:
    """One training graph with its own session."""

    def __init__(self, label, build, stacked, capacities, config):
        self.label = label
        self.graph = tf.Graph()
        with self.graph.as_default():
            # Fed through placeholders when the iterator starts, so the batches do not
            # become constants in the graph.
            arrays = [tf.compat.v1.placeholder(a.dtype, a.shape) for a in stacked]
            dataset = tf.data.Dataset.from_tensor_slices(tuple(arrays)).repeat().prefetch(2)
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            self.train = build(*iterator.get_next(), capacities, config)
            init_op = tf.compat.v1.global_variables_initializer()
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.session.run(init_op)
        self.session.run(iterator.initializer, feed_dict=dict(zip(arrays, stacked)))
        self.seconds = 0.0
        self.steps = 0
        self.last_loss = float("nan")

    def run(self, steps: int, measure: bool = True) -> None:
        fetches = [self.train.train_op, self.train.loss]
        started = time.perf_counter()
        for _ in range(steps):
            _, self.last_loss = self.session.run(fetches)
        if measure:
            self.seconds += time.perf_counter() - started
            self.steps += steps

    def profile(self, steps: int) -> collections.Counter:
        """Microseconds per op type over `steps` traced steps (summed over threads)."""
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        by_type = collections.Counter()
        for _ in range(steps):
            metadata = tf.compat.v1.RunMetadata()
            self.session.run(self.train.train_op, options=options, run_metadata=metadata)
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    name = node.node_name.split(":")[0]
                    try:
                        op_type = self.graph.get_operation_by_name(name).type
                    except KeyError:
                        op_type = name  # runtime nodes (_SOURCE, memcpy) keep their own name
                    by_type[op_type] += node.op_end_rel_micros
        return by_type

    def close(self) -> None:
        self.session.close()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    settings = {} if args.key_threads is None else {"key_process_thread_num": args.key_threads}
    init(train_steps=-1, prefetch_batch_number=1, **settings)
    stream = SyntheticCriteo(seed=args.seed, max_vocab=args.max_vocab,
                             growth_batches=args.num_batches)
    stacked = stream.stacked(0, args.num_batches, args.batch_size)
    capacities = stream.distinct_id_bound(args.num_batches)
    config = TrainConfig(sparse_optimizer=args.sparse_optimizer, seed=args.seed)

    variants = [
        Variant("(a) mxrec tables, sparse_lookup", build_mxrec_training, stacked, capacities,
                config),
        Variant("(b) TF tf.Variable, ID mod rows, tf.gather", build_hashed_training, stacked,
                capacities, config),
    ]
    for variant in variants:
        variant.run(args.warmup, measure=False)
    per_round = [args.steps // args.rounds + (i < args.steps % args.rounds)
                 for i in range(args.rounds)]
    for steps in per_round:
        for variant in variants:
            variant.run(steps)

    rates = [v.steps * args.batch_size / v.seconds for v in variants]
    rows_in_use = sum(t.stats()["rows_in_use"] for t in variants[0].train.tables)
    print(f"## Training throughput: DLRM, 26 tables x dim {config.dim}, "
          f"sparse {config.sparse_optimizer}, dense Adam\n")
    print(f"- machine: {os.cpu_count()} CPUs ({cpu_name()}), TensorFlow {tf.__version__}, "
          f"key-stage threads {get_config_initializer().config.key_process_thread_num}")
    print(f"- data: synthetic Criteo (13 dense, 26 sparse int64 IDs, power law), "
          f"{args.num_batches} pre-generated batches repeated, {args.batch_size * 26:,} IDs "
          f"per batch; {int(capacities.sum()):,} rows per store in all, {rows_in_use:,} in use "
          "by mxrec")
    print(f"- batch size {args.batch_size}; {args.warmup} warm-up steps, then {args.steps} "
          f"measured steps per variant, alternating in {args.rounds} rounds\n")
    print("| variant | batch | steps | ms/step | samples/s | last loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for variant, rate in zip(variants, rates):
        print(f"| {variant.label} | {args.batch_size} | {variant.steps} | "
              f"{1e3 * variant.seconds / variant.steps:.1f} | {rate:,.0f} | "
              f"{variant.last_loss:.4f} |")
    print(f"\nratio a/b (samples/s): **{rates[0] / rates[1]:.3f}**")

    if args.profile:
        print(f"\n### Op time by type over {args.profile} traced steps (ms per step, summed "
              "over threads)\n")
        profiles = [v.profile(args.profile) for v in variants]
        top = collections.Counter()
        for profile in profiles:
            top.update(profile)
        print("| op type | (a) mxrec | (b) TF |")
        print("|---|---:|---:|")
        for op_type, _ in top.most_common(15):
            print(f"| {op_type} | " + " | ".join(
                f"{p[op_type] / 1e3 / args.profile:.2f}" for p in profiles) + " |")
        print("| **all ops** | " + " | ".join(
            f"{sum(p.values()) / 1e3 / args.profile:.2f}" for p in profiles) + " |")

    for variant in variants:
        variant.close()
    terminate_config_initializer()
    return 0


if __name__ == "__main__":
    sys.exit(main())

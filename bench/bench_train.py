"""Training throughput of the demo DLRM: mxrec tables against plain TensorFlow.

(b) baseline: 26 fixed-size tf.Variables with the same row counts, indexed by
    `ID mod rows` through `tf.gather`, trained by the same sparse rule as a TF1
    optimizer.
(a) mxrec, direct: 26 tables addressed by raw int64 IDs (`sparse_lookup`: host key
    stage, gather of the unique rows), trained by an mxrec hash optimizer; the key
    stage runs inside the step.
(p<N>) mxrec, rewritten: the same model built with `sparse_lookup(...,
    modify_graph=True)` and rewritten by `modify_graph_and_start_emb_cache()`: the key
    stage runs in the tf.data pipeline, `prefetch_batch_number=N` batches ahead of the
    step (N = 0: in the pipeline, in the step's GetNext, no look-ahead).

All read the same pre-generated batches from memory (tf.data from_tensor_slices
over stacked arrays, repeated, prefetch(2)), so data generation is not measured,
and all run in this process, alternating in rounds after warm-up steps, so that
load from elsewhere falls on all alike. Each round starts with a few unmeasured
steps per variant (--settle, default the deepest prefetch + 1): while a variant
waits for its turn its pipeline fills its prefetch buffer, and those batches must
not count as free work. Each mxrec variant has its own host tables (its own
`scoped_config_initializer`, which also carries its prefetch depth).

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_train.py [--steps 150 --profile 5 ...]
    PYTHONPATH=. .venv/bin/python bench/bench_train.py --prefetch_depths 2 --rounds 3
    PYTHONPATH=. .venv/bin/python bench/bench_train.py --prefetch_depths ""  # no rewrite
"""

import argparse
import collections
import contextlib
import dataclasses
import os
import sys
import time

# Before TensorFlow loads: its C++ start-up lines would bury the table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from bench.machine import cpu_name  # noqa: E402
from examples.model import (  # noqa: E402
    TrainConfig,
    build_hashed_training,
    build_mxrec_training,
)
from examples.synthetic_criteo import SyntheticCriteo  # noqa: E402
from mxrec.graph.modifier import (  # noqa: E402
    get_initializer,
    modify_graph_and_start_emb_cache,
)
from mxrec.util.initialize import (  # noqa: E402
    get_config_initializer,
    init,
    scoped_config_initializer,
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
    parser.add_argument("--prefetch_depths", default="0,1,2,4",
                        help="comma-separated prefetch_batch_number values of the rewritten "
                             "variants (0 = rewrite without look-ahead); empty for none")
    parser.add_argument("--no_direct", action="store_true",
                        help="leave out the direct mxrec variant (no rewrite)")
    parser.add_argument("--settle", type=int, default=None,
                        help="unmeasured steps per variant at the start of each round "
                             "(default: the deepest prefetch + 1)")
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args(argv)
    for name in ("batch_size", "steps", "rounds", "num_batches", "max_vocab"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.warmup < 0 or args.profile < 0 or (args.settle is not None and args.settle < 0):
        parser.error("--warmup, --settle and --profile must be >= 0")
    try:
        args.prefetch_depths = [int(d) for d in args.prefetch_depths.split(",") if d.strip()]
    except ValueError:
        parser.error(f"--prefetch_depths must be comma-separated ints, got "
                     f"{args.prefetch_depths!r}")
    if any(not 0 <= d <= 64 for d in args.prefetch_depths):
        parser.error("--prefetch_depths must be in [0, 64]")
    if args.settle is None:
        args.settle = max(args.prefetch_depths, default=0) + 1
    return args


class Variant:
    """One training graph with its own session.

    Args:
        label: the variant's row label.
        build: build_mxrec_training or build_hashed_training.
        stacked: the pre-generated batches, (dense, sparse, labels) stacked.
        capacities, config: as `build`.
        key_stage: how the key stage runs, for the table ("-" for the baseline).
        prefetch: None: no rewrite; else the lookups are built with modify_graph=True
            and the graph is rewritten, prefetch_batch_number = prefetch.
    """

    def __init__(self, label, build, stacked, capacities, config, key_stage="-",
                 prefetch=None):
        self.label = label
        self.key_stage = key_stage
        self.prefetch = prefetch
        self.graph = tf.Graph()
        with self.graph.as_default():
            # Fed through placeholders when the iterator starts, so the batches do not
            # become constants in the graph.
            arrays = [tf.compat.v1.placeholder(a.dtype, a.shape) for a in stacked]
            dataset = tf.data.Dataset.from_tensor_slices(tuple(arrays)).repeat().prefetch(2)
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            if prefetch is None:
                self.train = build(*iterator.get_next(), capacities, config)
                iterator_init = iterator.initializer
            else:
                self.train = build(*iterator.get_next(), capacities, config,
                                   modify_graph=True)
                modify_graph_and_start_emb_cache()
                iterator_init = get_initializer(True)
            init_op = tf.compat.v1.global_variables_initializer()
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.session.run(init_op)
        self.session.run(iterator_init, feed_dict=dict(zip(arrays, stacked)))
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
        Variant("(b) TF tf.Variable, ID mod rows, tf.gather", build_hashed_training, stacked,
                capacities, config),
    ]
    if not args.no_direct:
        variants.append(Variant("(a) mxrec, direct (no rewrite)", build_mxrec_training,
                                stacked, capacities, config, key_stage="in the step"))
    base_config = get_config_initializer().config
    scopes = contextlib.ExitStack()
    for depth in args.prefetch_depths:
        # Host tables of their own, and the prefetch depth the rewrite reads.
        scopes.enter_context(scoped_config_initializer(
            dataclasses.replace(base_config, prefetch_batch_number=depth)))
        variants.append(Variant(
            f"(p{depth}) mxrec, rewrite, prefetch {depth}", build_mxrec_training, stacked,
            capacities, config, prefetch=depth,
            key_stage="tf.data, in GetNext" if depth == 0 else f"tf.data, {depth} ahead"))
    for variant in variants:
        variant.run(args.warmup, measure=False)
    per_round = [args.steps // args.rounds + (i < args.steps % args.rounds)
                 for i in range(args.rounds)]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    for index, steps in enumerate(per_round):
        # A different variant goes first each round.
        shift = index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            variant.run(args.settle, measure=False)
            variant.run(steps)
    measured_wall = time.perf_counter() - started
    load_after = os.getloadavg()[0]

    rates = [v.steps * args.batch_size / v.seconds for v in variants]
    baseline = rates[0]
    print(f"## Training throughput: DLRM, 26 tables x dim {config.dim}, "
          f"sparse {config.sparse_optimizer}, dense Adam\n")
    print(f"- machine: {os.cpu_count()} CPUs ({cpu_name()}), TensorFlow {tf.__version__}, "
          f"key-stage threads {base_config.key_process_thread_num}; 1-minute load average "
          f"{load_before:.1f} before the rounds, {load_after:.1f} after (this process alone "
          "keeps it near the CPU count; more means other work shared the CPUs)")
    print(f"- data: synthetic Criteo (13 dense, 26 sparse int64 IDs, power law), "
          f"{args.num_batches} pre-generated batches in memory (tf.data from_tensor_slices, "
          f"repeat, prefetch(2)) for every variant, {args.batch_size * 26:,} IDs per batch; "
          f"{int(capacities.sum()):,} rows per store in all")
    for variant in variants:
        if variant.key_stage != "-":
            rows = sum(t.stats()["rows_in_use"] for t in variant.train.tables)
            print(f"  - rows in use by {variant.label.split(')')[0]}): {rows:,}")
    print(f"- batch size {args.batch_size}; {args.warmup} warm-up steps, then {args.steps} "
          f"measured steps per variant in {args.rounds} rounds (each round: {args.settle} "
          f"unmeasured settle steps per variant, the order rotating); "
          f"{measured_wall:.0f} s for the rounds\n")
    print("| variant | key stage | batch | steps | ms/step | samples/s | ratio to (b) "
          "| last loss |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for variant, rate in zip(variants, rates):
        print(f"| {variant.label} | {variant.key_stage} | {args.batch_size} | {variant.steps} | "
              f"{1e3 * variant.seconds / variant.steps:.1f} | {rate:,.0f} | "
              f"{rate / baseline:.3f} | {variant.last_loss:.4f} |")
    print("\nratio to (b): samples/s of the variant / samples/s of the TF baseline (b), "
          "measured in this run")

    if args.profile:
        print(f"\n### Op time by type over {args.profile} traced steps (ms per step, summed "
              "over threads)\n")
        profiles = [v.profile(args.profile) for v in variants]
        top = collections.Counter()
        for profile in profiles:
            top.update(profile)
        print("| op type | " + " | ".join(v.label.split(")")[0] + ")" for v in variants) + " |")
        print("|---|" + "---:|" * len(variants))
        for op_type, _ in top.most_common(15):
            print(f"| {op_type} | " + " | ".join(
                f"{p[op_type] / 1e3 / args.profile:.2f}" for p in profiles) + " |")
        print("| **all ops** | " + " | ".join(
            f"{sum(p.values()) / 1e3 / args.profile:.2f}" for p in profiles) + " |")

    for variant in variants:
        variant.close()
    scopes.close()
    terminate_config_initializer()
    return 0


if __name__ == "__main__":
    sys.exit(main())

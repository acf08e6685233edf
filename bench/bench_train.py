"""Training throughput of the demo DLRM: mxrec tables against plain TensorFlow.

(b) baseline: 26 fixed-size tf.Variables with the same row counts, indexed by
    `ID mod rows` through `tf.gather`, trained by the same sparse rule as a TF1
    optimizer.
(a) mxrec, direct: 26 tables addressed by raw int64 IDs (`sparse_lookup`: host key
    stage, gather of the unique rows), trained by an mxrec hash optimizer; the key
    stage runs inside the step.
(t) TFRA 0.7.2 (where importable): 26 `dynamic_embedding` variables (cuckoo hash
    tables) addressed by raw IDs through `embedding_lookup_unique`, trained by the same
    sparse rule wrapped in `DynamicEmbeddingOptimizer`. TFRA is not a dependency: install
    it aside (`pip install --target /tmp/tfra --no-deps tensorflow-recommenders-addons==0.7.2
    typeguard==2.13.3`) and put that folder on PYTHONPATH; without it the table says the
    column was skipped.
(p<N>) mxrec, rewritten: the same model built with `sparse_lookup(...,
    modify_graph=True)` and rewritten by `modify_graph_and_start_emb_cache()`: the key
    stage runs in the tf.data pipeline, `prefetch_batch_number=N` batches ahead of the
    step (N = 0: in the pipeline, in the step's GetNext, no look-ahead).

All read the same pre-generated batches from memory (tf.data from_tensor_slices
over stacked arrays, prefetch(2)), so data generation is not measured; by default
there are as many batches as a variant trains (--num_batches 0), and the stream's
vocabulary grows over them, so new IDs arrive throughout and admission and row
assignment are measured too,
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
    PYTHONPATH=.:/tmp/tfra .venv/bin/python bench/bench_train.py --quick --json train.json
    PYTHONPATH=. .venv/bin/python bench/bench_train.py --gather_ab --quick --no_tfra

--gather_ab adds (a-old) and (p<N>-old): the same mxrec variants with the lookup's
restore gather built from TensorFlow's ops (concat + GatherV2, unsorted_segment_sum
+ slice as its gradient) instead of the fused MxrecGatherRows / MxrecGatherRowsGrad
(mxrec.core.gather), in the same rounds, so the change is an A/B of one run.
"""

import argparse
import collections
import contextlib
import dataclasses
import importlib
import os
import sys
import time

# Before TensorFlow loads: its C++ start-up lines would bury the table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from bench import report  # noqa: E402
from bench.machine import cpu_name  # noqa: E402
from examples.model import (  # noqa: E402
    DEFAULT_SPARSE_LEARNING_RATES,
    TrainConfig,
    TrainGraph,
    build_hashed_training,
    build_mxrec_training,
    dlrm_logits,
)
from examples.synthetic_criteo import SyntheticCriteo  # noqa: E402
from mxrec.core.gather import fused_gather  # noqa: E402
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
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per variant (150; --quick 40)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured steps per variant")
    parser.add_argument("--rounds", type=int, default=None,
                        help="the measured steps alternate between the variants in this many "
                             "rounds (5; --quick 4)")
    parser.add_argument("--num_batches", type=int, default=0,
                        help="distinct pre-generated batches, repeated (0: as many as a "
                             "variant trains, so none repeats)")
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
    parser.add_argument("--prefetch_depths", default=None,
                        help="comma-separated prefetch_batch_number values of the rewritten "
                             "variants (0 = rewrite without look-ahead); empty for none "
                             "(0,1,2,4; --quick 2)")
    parser.add_argument("--no_tfra", action="store_true",
                        help="leave out the TFRA variant even where TFRA imports")
    parser.add_argument("--no_direct", action="store_true",
                        help="leave out the direct mxrec variant (no rewrite)")
    parser.add_argument("--settle", type=int, default=None,
                        help="unmeasured steps per variant at the start of each round "
                             "(default: the deepest prefetch + 1)")
    parser.add_argument("--gather_ab", action="store_true",
                        help="also run each mxrec variant with the restore gather built from "
                             "TensorFlow's ops (the build before the fused op), in the same "
                             "rounds")
    parser.add_argument("--seed", type=int, default=2024)
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    quick = {"steps": (150, 40), "rounds": (5, 4), "prefetch_depths": ("0,1,2,4", "2")}
    for name, (full, short) in quick.items():
        if getattr(args, name) is None:
            setattr(args, name, short if args.quick else full)
    if args.num_batches < 0:
        parser.error("--num_batches must be >= 0")
    for name in ("batch_size", "steps", "rounds", "max_vocab"):
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
    if args.num_batches == 0:
        # Every batch a variant reads, its prefetched ones included, is new.
        args.num_batches = (args.warmup + args.steps + args.rounds * args.settle +
                            max(args.prefetch_depths, default=0) + 3)
    return args


def import_tfra():
    """TensorFlow Recommenders-Addons, or None with the reason it is not used."""
    try:
        return importlib.import_module("tensorflow_recommenders_addons"), None
    except Exception as error:  # noqa: BLE001 - any import failure means: no TFRA column
        return None, f"{type(error).__name__}: {error}"


def build_tfra_training(dense, sparse, labels, capacities, config, tfra=None) -> TrainGraph:
    """The same DLRM on TFRA dynamic embeddings (cuckoo hash tables, raw int64 IDs).

    Each table reserves its capacity up front (`init_size`), as mxrec's do; the sparse
    rows are trained by the same rule as the mxrec run's sparse optimizer (Adam on the
    looked-up rows' slots only, or Adagrad), wrapped in `DynamicEmbeddingOptimizer`.
    """
    if tfra is None:
        tfra, reason = import_tfra()
        if tfra is None:
            raise RuntimeError(f"TFRA does not import: {reason}")
    de = tfra.dynamic_embedding
    embeddings, trainables = [], []
    with tf.compat.v1.variable_scope("tfra"):
        for i, capacity in enumerate(capacities):
            table = de.get_variable(
                f"c{i + 1}", key_dtype=tf.int64, value_dtype=tf.float32, dim=config.dim,
                initializer=tf.compat.v1.truncated_normal_initializer(
                    stddev=config.init_stddev, seed=config.seed + i),
                init_size=int(capacity))
            embedding, trainable = de.embedding_lookup_unique(
                table, sparse[:, i], name=f"lookup{i + 1}", return_trainable=True)
            embeddings.append(tf.reshape(embedding, [-1, config.dim]))
            trainables.append(trainable)
    logits = dlrm_logits(dense, embeddings, config)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                  logits=logits))
    rate = config.sparse_learning_rate or DEFAULT_SPARSE_LEARNING_RATES[config.sparse_optimizer]
    if config.sparse_optimizer == "adagrad":
        sparse_rule = tf.compat.v1.train.AdagradOptimizer(rate, initial_accumulator_value=0.9)
    else:
        sparse_rule = tf.compat.v1.train.AdamOptimizer(rate)
    train_sparse = de.DynamicEmbeddingOptimizer(sparse_rule).minimize(loss, var_list=trainables)
    dense_vars = [v for v in tf.compat.v1.trainable_variables()
                  if v.name.startswith("dlrm")]
    train_dense = tf.compat.v1.train.AdamOptimizer(config.dense_learning_rate).minimize(
        loss, var_list=dense_vars)
    return TrainGraph(tf.group(train_sparse, train_dense), loss, logits, labels, [])


def with_composed_gather(build):
    """`build` with every lookup's restore gather from TensorFlow's ops (no fused op)."""

    def built(*args, **kwargs):
        with fused_gather(False):
            return build(*args, **kwargs)

    return built


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
            # Repeated only so that a pipeline reading ahead never runs dry at the end.
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
    tfra, tfra_missing = (None, "--no_tfra given") if args.no_tfra else import_tfra()
    if tfra is not None:
        variants.append(Variant(
            f"(t) TFRA {getattr(tfra, '__version__', '?')} dynamic_embedding, raw IDs",
            lambda *a: build_tfra_training(*a, tfra=tfra), stacked, capacities, config,
            key_stage="TFRA lookup_unique"))
    gathers = [("", build_mxrec_training)]
    if args.gather_ab:
        gathers.append(("-old", with_composed_gather(build_mxrec_training)))
    base_config = get_config_initializer().config
    scopes = contextlib.ExitStack()
    for suffix, build in gathers:
        note = ", TF ops' restore gather" if suffix else ""
        if not args.no_direct:
            if suffix:
                # Host tables of their own (the same names as (a)'s).
                scopes.enter_context(scoped_config_initializer(base_config))
            variants.append(Variant(f"(a{suffix}) mxrec, direct (no rewrite){note}", build,
                                    stacked, capacities, config, key_stage="in the step"))
        for depth in args.prefetch_depths:
            # Host tables of their own, and the prefetch depth the rewrite reads.
            scopes.enter_context(scoped_config_initializer(
                dataclasses.replace(base_config, prefetch_batch_number=depth)))
            variants.append(Variant(
                f"(p{depth}{suffix}) mxrec, rewrite, prefetch {depth}{note}", build, stacked,
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
        if variant.label.split(")")[1].strip().startswith("mxrec"):
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
    if tfra is None:
        print(f"\nTFRA column skipped: TensorFlow Recommenders-Addons does not import here "
              f"({tfra_missing}); see this file's docstring to install it aside.")
    out = report.Report()
    by_tag = {v.label.split(")")[0] + ")": rate for v, rate in zip(variants, rates)}
    for variant, rate in zip(variants, rates):
        out.figure(f"train {variant.label.split(')')[0]}) samples/s", round(rate))
    # Goals: mxrec (collision-free raw IDs) at least as fast as plain TF on buckets,
    # and twice TFRA, on both paths; the rewrite at its deepest prefetch measured.
    mxrec_paths = []
    if "(a)" in by_tag:
        mxrec_paths.append(("direct", by_tag["(a)"]))
    if args.prefetch_depths:
        depth = max(args.prefetch_depths)
        mxrec_paths.append((f"graph modifier, prefetch {depth}", by_tag[f"(p{depth})"]))
    for path, rate in mxrec_paths:
        out.goal(f"training, batch {args.batch_size}, {path}: x plain TF fixed buckets",
                 rate / baseline, 1.0)
        if "(t)" in by_tag:
            out.goal(f"training, batch {args.batch_size}, {path}: x TFRA", rate / by_tag["(t)"],
                     2.0)
    if "(t)" not in by_tag:
        out.figure("TFRA", f"skipped ({tfra_missing})")
    if args.gather_ab:
        print("\nA/B of the restore gather (same run): fused op / TF ops, and each against (b)")
        for tag in [t for t in by_tag if not t.endswith("-old)") and t[1] in "ap"]:
            old_tag = tag[:-1] + "-old)"
            if old_tag in by_tag:
                print(f"- {tag}: {by_tag[tag] / by_tag[old_tag]:.3f} x {old_tag}; x (b) "
                      f"{by_tag[tag] / baseline:.3f} fused, {by_tag[old_tag] / baseline:.3f} "
                      "TF ops")
                out.figure(f"train {tag} fused gather / TF ops' gather",
                           round(by_tag[tag] / by_tag[old_tag], 3))
    out.write(args.json)

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

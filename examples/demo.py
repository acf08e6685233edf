"""Trains a DLRM on mxrec tables over a synthetic Criteo-like stream, then evaluates it.

The 26 sparse features are raw 64-bit IDs (negatives included) whose vocabularies
grow during training; each feature gets an mxrec table sized for the IDs the
training stream can hold, with no hashing into buckets. Evaluation reads the
batches that follow the training data (a "next day"), through lookups with
is_train=False on the same tables: IDs never trained on read zeros and are not
inserted.

Options beyond the defaults:

- `--modify_graph [--prefetch N]`: the lookups are built with `modify_graph=True` and
  `modify_graph_and_start_emb_cache()` moves their host key stage into the tf.data
  pipeline, N batches ahead of the step (N = 0: in the pipeline, no look-ahead).
- `--access_threshold A [--eviction_threshold E --evict_every N]`: an ID gets a row once
  seen A times; the batch time is the batch index (one "second" per batch), so IDs
  unseen for more than E batches are evicted, checked every N steps.
- `--checkpoint_dir DIR [--full_every N --delta_every M]`: full saves every N steps,
  delta saves every M steps (the first save is a full one), and one at the last step; a
  run that finds a checkpoint in DIR restores it and continues from its step (up to
  --steps, which must be the same: the stream and the table sizes depend on it).
  `--stop_at S` ends training at step S with a save, to try a resume.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python examples/demo.py [--steps 1500 --batch_size 1024 ...]
    PYTHONPATH=. .venv/bin/python examples/demo.py --modify_graph --prefetch 2
    PYTHONPATH=. .venv/bin/python examples/demo.py --access_threshold 2 \
        --eviction_threshold 300 --evict_every 100
    PYTHONPATH=. .venv/bin/python examples/demo.py --checkpoint_dir /tmp/ckpt \
        --full_every 500 --delta_every 100
"""

import argparse
import os
import sys
import time

import numpy as np

# Before TensorFlow loads: its C++ start-up lines would bury the demo's output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from examples.model import (  # noqa: E402
    TrainConfig,
    build_mxrec_training,
    dlrm_logits,
    mxrec_embeddings,
)
from examples.synthetic_criteo import NUM_DENSE, NUM_SPARSE, SyntheticCriteo  # noqa: E402
from mxrec.core.embedding import add_timestamp  # noqa: E402
from mxrec.graph.modifier import modify_graph_and_start_emb_cache  # noqa: E402
from mxrec.saver.checkpoint import Saver  # noqa: E402
from mxrec.util.initialize import (  # noqa: E402
    get_initializer,
    init,
    terminate_config_initializer,
)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties).

    Example:
        >>> roc_auc(np.array([0, 1, 1]), np.array([0.1, 0.9, 0.4]))  # 1.0
    """
    labels = np.asarray(labels).astype(bool)
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = np.asarray(scores)[order]
    ranks = np.empty(labels.size, np.float64)
    ranks[order] = np.arange(1, labels.size + 1)
    # Tied scores share the mean of their ranks.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mean_rank = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, counts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def log_loss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of sigmoid(logits), computed stably."""
    softplus = np.log1p(np.exp(-np.abs(logits)))
    return float(np.mean(np.maximum(logits, 0) - logits * labels + softplus))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500, help="training steps (batches)")
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--eval_batches", type=int, default=20,
                        help="held-out batches, those that follow the training stream")
    parser.add_argument("--max_vocab", type=int, default=100_000,
                        help="cap on each feature's final vocabulary")
    defaults = TrainConfig()
    parser.add_argument("--sparse_optimizer", choices=("adagrad", "lazy_adam"),
                        default=defaults.sparse_optimizer)
    parser.add_argument("--sparse_learning_rate", type=float, default=None,
                        help="default: by optimizer, see model.DEFAULT_SPARSE_LEARNING_RATES")
    parser.add_argument("--dense_learning_rate", type=float, default=defaults.dense_learning_rate)
    parser.add_argument("--log_every", type=int, default=100, help="steps between progress lines")
    parser.add_argument("--seed", type=int, default=2024)
    group = parser.add_argument_group("graph modifier")
    group.add_argument("--modify_graph", action="store_true",
                       help="move the host key stage into the tf.data pipeline "
                            "(modify_graph_and_start_emb_cache)")
    group.add_argument("--prefetch", type=int, default=1,
                       help="prefetch_batch_number: batches the key stage runs ahead of the "
                            "step with --modify_graph (0..64; 0 = no look-ahead)")
    group = parser.add_argument_group("admission and eviction")
    group.add_argument("--access_threshold", type=int, default=None,
                       help="an ID gets a row once seen this many times (off by default)")
    group.add_argument("--eviction_threshold", type=int, default=None,
                       help="evict IDs unseen for more than this many batches (the batch time "
                            "is the batch index, in seconds); needs --access_threshold")
    group.add_argument("--evict_every", type=int, default=100,
                       help="steps between evictions, with --eviction_threshold")
    group = parser.add_argument_group("offload modes")
    group.add_argument("--device_cache", type=float, default=1.0,
                       help="share of each table's rows on the device; below 1 the rest is "
                            "in the host tier (DDR mode)")
    group.add_argument("--ssd_data_path", default=None,
                       help="with --device_cache < 1: put half of the host tier on disk here "
                            "(SSD mode)")
    group.add_argument("--dynamic_expansion", action="store_true",
                       help="init(use_dynamic_expansion=True): growing storage, by-address "
                            "optimizers")
    group = parser.add_argument_group("checkpoints")
    group.add_argument("--checkpoint_dir", default=None,
                       help="save here; restore from here and continue if it has a checkpoint")
    group.add_argument("--full_every", type=int, default=0,
                       help="steps between full saves (0: only the save at the last step)")
    group.add_argument("--delta_every", type=int, default=0,
                       help="steps between delta saves (0: none)")
    group.add_argument("--stop_at", type=int, default=None,
                       help="end training after this step, saving, as if the job stopped "
                            "there (to try a resume: run again without it)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "eval_batches", "max_vocab", "log_every",
                 "evict_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if not 0 <= args.prefetch <= 64:
        parser.error("--prefetch must be in [0, 64]")
    for name in ("access_threshold", "eviction_threshold", "full_every", "delta_every"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0")
    if args.eviction_threshold is not None and args.access_threshold is None:
        parser.error("--eviction_threshold needs --access_threshold (use 1 to admit every ID)")
    if (args.full_every or args.delta_every or args.stop_at) and not args.checkpoint_dir:
        parser.error("--full_every, --delta_every and --stop_at need --checkpoint_dir")
    if args.stop_at is not None and not 1 <= args.stop_at <= args.steps:
        parser.error("--stop_at must be in [1, --steps]")
    return args


def indexed_batches(stream: SyntheticCriteo, start, stop: int, batch_size: int):
    """Dataset of the stream's batches [start, stop) with their index: (dense, sparse,
    labels, index). `start` may be a tensor (fed when the iterator starts)."""

    def generate(index):
        return stream.batch(int(index), batch_size)

    def to_batch(index):
        dense, sparse, labels = tf.numpy_function(
            generate, [index], (tf.float32, tf.int64, tf.float32), stateful=False)
        dense.set_shape([batch_size, NUM_DENSE])
        sparse.set_shape([batch_size, NUM_SPARSE])
        labels.set_shape([batch_size])
        return dense, sparse, labels, index

    return tf.data.Dataset.range(start, stop).map(to_batch).prefetch(2)


def print_table_stats(tables, columns=("capacity", "rows_in_use", "ids_seen", "admitted",
                                       "rejected", "evicted")) -> None:
    print("\n| table | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    totals = dict.fromkeys(columns, 0)
    for table in tables:
        stats = table.stats()
        for column in columns:
            totals[column] += int(stats.get(column, 0))
        print(f"| {table.table_name} | "
              + " | ".join(str(stats.get(column, "-")) for column in columns) + " |")
    print("| **all** | " + " | ".join(str(totals[column]) for column in columns) + " |")


def total_stats(tables) -> dict:
    totals: dict = {}
    for table in tables:
        for key, value in table.stats().items():
            totals[key] = totals.get(key, 0) + int(value)
    return totals


class Checkpoints:
    """Full saves every `full_every` steps and deltas every `delta_every` steps."""

    def __init__(self, directory: str, full_every: int, delta_every: int):
        self.saver = Saver(directory)
        self.directory = directory
        self.full_every = full_every
        self.delta_every = delta_every
        self.has_base = False  # a delta needs a full save or a restore before it
        self.last_saved = None
        self.counts = {"full": 0, "delta": 0}
        self.seconds = 0.0

    def restore(self, sess) -> int:
        """Restores the latest version if there is one; returns its step (0 if none)."""
        versions = self.saver.versions()
        if not versions:
            print(f"checkpoints: none in {self.directory}; starting at step 0")
            return 0
        started = time.perf_counter()
        step = self.saver.restore(sess)
        base = max(s for kind, s in versions if kind == "full" and s <= step)
        deltas = [s for kind, s in versions if kind == "delta" and base < s <= step]
        print(f"restored step {step} from {self.directory} (full@{base}"
              + "".join(f" + delta@{s}" for s in deltas)
              + f") in {time.perf_counter() - started:.1f} s; continuing from step {step + 1}")
        self.has_base = True
        self.last_saved = step
        return step

    def after_step(self, sess, step: int, last: bool) -> None:
        kind = None
        if self.full_every and step % self.full_every == 0:
            kind = "full"
        elif (self.delta_every and step % self.delta_every == 0) or last:
            kind = "delta" if self.has_base else "full"
        if kind is None:
            return
        started = time.perf_counter()
        self.saver.save(sess, step, kind=kind)
        self.seconds += time.perf_counter() - started
        self.counts[kind] += 1
        self.has_base = True
        self.last_saved = step

    def summary(self) -> str:
        return (f"checkpoints: {self.counts['full']} full and {self.counts['delta']} delta saves "
                f"in {self.seconds:.1f} s; latest step {self.last_saved} in {self.directory}")


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    if args.dynamic_expansion and (args.modify_graph or args.device_cache < 1.0
                                   or args.eviction_threshold is not None):
        raise SystemExit("--dynamic_expansion goes without --modify_graph, --device_cache and "
                         "eviction (as in mx_rec)")
    init(train_steps=args.steps, prefetch_batch_number=args.prefetch,
         use_dynamic_expansion=args.dynamic_expansion)
    # The vocabularies reach their final size at the last training step.
    stream = SyntheticCriteo(seed=args.seed, max_vocab=args.max_vocab, growth_batches=args.steps)
    capacities = stream.distinct_id_bound(args.steps)
    config = TrainConfig(sparse_optimizer=args.sparse_optimizer,
                         sparse_learning_rate=args.sparse_learning_rate,
                         dense_learning_rate=args.dense_learning_rate, seed=args.seed,
                         device_cache=args.device_cache,
                         # a step's unique IDs and those of the prefetched batches
                         min_device_rows=(args.prefetch + 3) * args.batch_size,
                         ssd_data_path=args.ssd_data_path)
    admission = None
    if args.access_threshold is not None:
        admission = {"access_threshold": args.access_threshold, "faae_coefficient": 1}
        if args.eviction_threshold is not None:
            admission["eviction_threshold"] = args.eviction_threshold

    # The first training batch: 0, or the step of the checkpoint restored.
    start_batch = tf.compat.v1.placeholder_with_default(tf.constant(0, tf.int64), [],
                                                        name="start_batch")
    train_data = indexed_batches(stream, start_batch, args.steps, args.batch_size)
    eval_data = indexed_batches(stream, args.steps, args.steps + args.eval_batches,
                                args.batch_size)
    train_iterator = tf.compat.v1.data.make_initializable_iterator(train_data)
    eval_iterator = tf.compat.v1.data.make_initializable_iterator(eval_data)

    dense, sparse, labels, batch_index = train_iterator.get_next()
    if admission and "eviction_threshold" in admission:
        # Batch time in seconds: declared before the lookups that it stamps.
        add_timestamp(batch_index)
    graph = build_mxrec_training(dense, sparse, labels, capacities, config,
                                 modify_graph=args.modify_graph,
                                 access_and_evict_config=admission)
    eval_dense, eval_sparse, eval_labels, eval_index = eval_iterator.get_next()
    # Fetched through an op: the graph modifier rewires the consumers of get_next()'s
    # outputs to the rewritten iterator, not fetches of those outputs themselves.
    eval_labels = tf.identity(eval_labels)
    if admission and "eviction_threshold" in admission:
        add_timestamp(eval_index)  # the evaluation lookups read their own batch's time
    eval_logits = dlrm_logits(
        eval_dense, mxrec_embeddings(graph.tables, eval_sparse, False,
                                     modify_graph=args.modify_graph), config)
    if args.modify_graph:
        # After the whole model, optimizers included: moves the key stages into the
        # input pipelines (training and evaluation), prefetch_batch_number ahead.
        modify_graph_and_start_emb_cache()
        train_init, eval_init = get_initializer(True), get_initializer(False)
    else:
        train_init, eval_init = train_iterator.initializer, eval_iterator.initializer
    checkpoints = (Checkpoints(args.checkpoint_dir, args.full_every, args.delta_every)
                   if args.checkpoint_dir else None)

    device_rows = sum(int(t.device_vocabulary_size) for t in graph.tables)
    print(f"DLRM on {len(graph.tables)} mxrec tables, dim {config.dim}, "
          f"{device_rows:,} device rows; {args.steps} steps of {args.batch_size}, "
          f"sparse {config.sparse_optimizer} (lr {config.sparse_learning_rate}), dense Adam")
    if args.modify_graph:
        print(f"key stage: in the input pipeline (graph modifier), prefetch {args.prefetch}")
    if args.device_cache < 1.0:
        print(f"offload: device cache of {args.device_cache:.0%} of each table over the host "
              f"tier" + (f" and an SSD tier in {args.ssd_data_path}" if args.ssd_data_path
                          else ""))
    if args.dynamic_expansion:
        print("offload: dynamic expansion (growing storage, by-address optimizers)")
    if admission:
        line = f"admission: access_threshold {args.access_threshold}"
        if args.eviction_threshold is not None:
            line += (f"; eviction of IDs unseen for > {args.eviction_threshold} batches, "
                     f"every {args.evict_every} steps")
        print(line)
    if checkpoints:
        print(f"checkpoints: {args.checkpoint_dir}, full every {args.full_every or '-'}, "
              f"delta every {args.delta_every or '-'} steps, and at the last step")
    evicting = admission is not None and args.eviction_threshold is not None
    evicted_ids = 0
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        # Restore before the input pipeline starts: with prefetch it plans batches ahead
        # against the host state.
        first = checkpoints.restore(sess) if checkpoints else 0
        sess.run(train_init, {start_batch: min(first, args.steps)})
        window_loss, window_start, window_steps = 0.0, time.perf_counter(), 0
        started = window_start
        last = args.steps if args.stop_at is None else args.stop_at
        for step in range(first + 1, last + 1):
            _, loss = sess.run([graph.train_op, graph.loss])
            window_loss += loss
            window_steps += 1
            if evicting and step % args.evict_every == 0:
                evicted_ids += sum(table.evict(args.eviction_threshold)
                                   for table in graph.tables)
            if checkpoints:
                checkpoints.after_step(sess, step, last=step == last)
            if step % args.log_every == 0 or step == last:
                now = time.perf_counter()
                rate = window_steps * args.batch_size / (now - window_start)
                line = (f"step {step:5d}  loss {window_loss / window_steps:.4f}  "
                        f"{rate:9.0f} samples/s")
                if admission:
                    totals = total_stats(graph.tables)
                    line += (f"  rows_in_use {totals['rows_in_use']:,}  admitted "
                             f"{totals['admitted']:,}  evicted {totals['evicted']:,}")
                print(line)
                window_loss, window_start, window_steps = 0.0, now, 0
        if first >= last:
            print(f"the checkpoint is at step {first} >= {last}: nothing to train")
        else:
            if last < args.steps:
                print(f"stopped at step {last} of {args.steps} (--stop_at)")
            trained = (last - first) * args.batch_size
            print(f"trained {trained:,} samples in {time.perf_counter() - started:.1f} s")
        if checkpoints and checkpoints.last_saved is not None:
            print(checkpoints.summary())

        # Started after training: a rewritten evaluation pipeline reads the rows of its
        # IDs when it plans a batch, so it must not plan before the last step.
        sess.run(eval_init)
        labels, logits = [], []
        for _ in range(args.eval_batches):
            batch_labels, batch_logits = sess.run([eval_labels, eval_logits])
            labels.append(batch_labels)
            logits.append(batch_logits)
    labels, logits = np.concatenate(labels), np.concatenate(logits)

    # References: the hidden model's own scores (the best any model can do) and
    # the constant prediction at the held-out positive rate.
    hidden = np.concatenate([stream.batch(i, args.batch_size, return_logits=True)[3]
                             for i in range(args.steps, args.steps + args.eval_batches)])
    rate = float(labels.mean())
    constant_loss = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    print(f"\nheld-out: {labels.size:,} samples, positive rate {rate:.3f}")
    print("| scores | log loss | AUC |\n|---|---:|---:|")
    print(f"| DLRM on mxrec | {log_loss(labels, logits):.4f} | {roc_auc(labels, logits):.4f} |")
    print(f"| constant (positive rate) | {constant_loss:.4f} | 0.5000 |")
    print(f"| hidden model (ceiling) | {log_loss(labels, hidden):.4f} "
          f"| {roc_auc(labels, hidden):.4f} |")
    if admission:
        print_table_stats(graph.tables, ("capacity", "rows_in_use", "ids_tracked", "ids_seen",
                                         "admitted", "rejected", "evicted", "evicted_rows"))
        if evicting:
            print(f"\nevictions (every {args.evict_every} steps) removed {evicted_ids:,} IDs")
    else:
        print_table_stats(graph.tables)
    if args.device_cache < 1.0:
        from mxrec.core import tiers

        totals = {}
        for table in graph.tables:
            for key, value in tiers.stats(table).items():
                if isinstance(value, (int, float)):
                    totals[key] = totals.get(key, 0) + value
        print("\ntiers, all tables: " + ", ".join(f"{k} {v:,}" for k, v in sorted(totals.items())))
    terminate_config_initializer()
    return 0


if __name__ == "__main__":
    sys.exit(main())

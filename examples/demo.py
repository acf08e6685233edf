"""Trains a DLRM on mxrec tables over a synthetic Criteo-like stream, then evaluates it.

The 26 sparse features are raw 64-bit IDs (negatives included) whose vocabularies
grow during training; each feature gets an mxrec table sized for the IDs the
training stream can hold, with no hashing into buckets. Evaluation reads the
batches that follow the training data (a "next day"), through lookups with
is_train=False on the same tables: IDs never trained on read zeros and are not
inserted.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python examples/demo.py [--steps 1500 --batch_size 1024 ...]
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
from examples.synthetic_criteo import SyntheticCriteo  # noqa: E402
from mxrec.util.initialize import init, terminate_config_initializer  # noqa: E402


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
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "eval_batches", "max_vocab", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def print_table_stats(tables) -> None:
    columns = ("capacity", "rows_in_use", "ids_seen", "admitted", "rejected", "evicted")
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


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    init(train_steps=args.steps, prefetch_batch_number=1)
    # The vocabularies reach their final size at the last training step.
    stream = SyntheticCriteo(seed=args.seed, max_vocab=args.max_vocab, growth_batches=args.steps)
    capacities = stream.distinct_id_bound(args.steps)
    config = TrainConfig(sparse_optimizer=args.sparse_optimizer,
                         sparse_learning_rate=args.sparse_learning_rate,
                         dense_learning_rate=args.dense_learning_rate, seed=args.seed)

    train_data = stream.dataset(0, args.steps, args.batch_size).prefetch(2)
    eval_data = stream.dataset(args.steps, args.eval_batches, args.batch_size).prefetch(2)
    train_iterator = tf.compat.v1.data.make_initializable_iterator(train_data)
    eval_iterator = tf.compat.v1.data.make_initializable_iterator(eval_data)

    graph = build_mxrec_training(*train_iterator.get_next(), capacities, config)
    eval_dense, eval_sparse, eval_labels = eval_iterator.get_next()
    eval_logits = dlrm_logits(eval_dense, mxrec_embeddings(graph.tables, eval_sparse, False),
                              config)

    print(f"DLRM on {len(graph.tables)} mxrec tables, dim {config.dim}, "
          f"{int(capacities.sum()):,} device rows; {args.steps} steps of {args.batch_size}, "
          f"sparse {config.sparse_optimizer} (lr {config.sparse_learning_rate}), dense Adam")
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  train_iterator.initializer, eval_iterator.initializer])
        window_loss, window_start, window_steps = 0.0, time.perf_counter(), 0
        started = window_start
        for step in range(1, args.steps + 1):
            _, loss = sess.run([graph.train_op, graph.loss])
            window_loss += loss
            window_steps += 1
            if step % args.log_every == 0 or step == args.steps:
                now = time.perf_counter()
                rate = window_steps * args.batch_size / (now - window_start)
                print(f"step {step:5d}  loss {window_loss / window_steps:.4f}  "
                      f"{rate:9.0f} samples/s")
                window_loss, window_start, window_steps = 0.0, now, 0
        elapsed = time.perf_counter() - started
        print(f"trained {args.steps * args.batch_size:,} samples in {elapsed:.1f} s")

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
    print_table_stats(graph.tables)
    terminate_config_initializer()
    return 0


if __name__ == "__main__":
    sys.exit(main())

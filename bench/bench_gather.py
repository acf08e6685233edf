"""The lookup's restore gather alone: the fused ops against TensorFlow's composition.

One step is what the demo DLRM's 26 lookups do after their unique rows are gathered:
per feature, emb = restore_rows(unique_emb [U, dim], restore [batch]) forward and
d unique_emb backward, for a real key-stage plan of a synthetic Criteo batch (the
feature's distinct IDs in first-occurrence order, restore into them). (f) builds it
with MxrecGatherRows / MxrecGatherRowsGrad (mxrec.core.gather), (c) with TensorFlow's
ops (concat + GatherV2, unsorted_segment_sum + slice), both in one graph and one
session, run alternately in --repeats blocks of --steps steps each; the figure is the
median over blocks of (c)'s time per step / (f)'s (> 1: the fused ops are faster).
Every block also checks that both give the same floats.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_gather.py [--batch_size 4096 --repeats 15]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import report  # noqa: E402
from bench.machine import cpu_name  # noqa: E402
from examples.synthetic_criteo import SyntheticCriteo  # noqa: E402
from mxrec.core import gather  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch_size", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--steps", type=int, default=None, help="steps per block (20; quick 10)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="blocks per variant, alternating (15; quick 6)")
    parser.add_argument("--seed", type=int, default=2024)
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 10 if args.quick else 20
    if args.repeats is None:
        args.repeats = 6 if args.quick else 15
    if min(args.batch_size, args.dim, args.steps, args.repeats) < 1:
        parser.error("--batch_size, --dim, --steps and --repeats must be >= 1")
    return args


def plans(sparse: np.ndarray):
    """Per feature: (number of distinct IDs, restore into them in first-occurrence order)."""
    out = []
    for column in sparse.T:
        _, first, inverse = np.unique(column, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # distinct IDs by first occurrence
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        out.append((len(order), rank[inverse].astype(np.int32)))
    return out


def build(feature_plans, dim, seed, fused):
    """The 26 lookups' restore gathers, forward and backward, as one fetch."""
    rng = np.random.default_rng(seed)
    outputs, grads = [], []
    with gather.fused_gather(fused):
        for k, (num_unique, restore) in enumerate(feature_plans):
            unique = tf.Variable(rng.standard_normal((num_unique, dim)).astype(np.float32),
                                 name=f"unique{k}_{int(fused)}")
            unique_emb = tf.identity(unique.read_value())
            emb = gather.restore_rows(unique_emb, tf.constant(restore), device="/device:CPU:0")
            # A variable, not a constant: Grappler would fold a gradient of constants.
            dy = tf.Variable(rng.standard_normal((len(restore), dim)).astype(np.float32),
                             name=f"dy{k}_{int(fused)}").read_value()
            outputs.append(emb)
            grads.append(tf.gradients(emb, unique_emb, grad_ys=dy)[0])
    assert (grads[0].op.type == "MxrecGatherRowsGrad") == fused
    # A fetched value, not a tf.group: Grappler turns ops whose outputs only feed
    # control edges into no-ops.
    step = tf.add_n([tf.reduce_sum(g) for g in grads] + [tf.reduce_sum(e) for e in outputs])
    return step, outputs, grads


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    _, sparse, _ = SyntheticCriteo(seed=args.seed).batch(index=0, batch_size=args.batch_size)
    feature_plans = plans(sparse)
    fused = build(feature_plans, args.dim, args.seed, True)
    composed = build(feature_plans, args.dim, args.seed, False)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got_f, got_c = sess.run([fused[1:], composed[1:]])
        for x, y in zip(got_f[0] + got_f[1], got_c[0] + got_c[1]):
            np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))
        for step in (fused[0], composed[0]):
            for _ in range(5):
                sess.run(step)
        times = {"f": [], "c": []}
        load_before = os.getloadavg()[0]
        for block in range(args.repeats):
            order = (("f", fused[0]), ("c", composed[0]))
            for tag, step in order if block % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                for _ in range(args.steps):
                    sess.run(step)
                times[tag].append((time.perf_counter() - started) / args.steps)
        load_after = os.getloadavg()[0]
    ratios = [c / f for f, c in zip(times["f"], times["c"])]
    ratio = statistics.median(ratios)
    unique_total = sum(u for u, _ in feature_plans)
    print("## Restore gather alone: fused ops vs TensorFlow's composition\n")
    print(f"- machine: {os.cpu_count()} CPUs ({cpu_name()}), TensorFlow {tf.__version__}; "
          f"1-minute load average {load_before:.1f} before, {load_after:.1f} after")
    print(f"- {len(feature_plans)} features, batch {args.batch_size}, dim {args.dim}, "
          f"{unique_total:,} unique rows in all; {args.repeats} alternating blocks of "
          f"{args.steps} steps per variant; forward and backward bit-equal (checked)\n")
    print("| variant | median ms/step | min ms/step |")
    print("|---|---:|---:|")
    for tag, label in (("f", "(f) MxrecGatherRows + MxrecGatherRowsGrad"),
                       ("c", "(c) concat + GatherV2, unsorted_segment_sum + slice")):
        print(f"| {label} | {1e3 * statistics.median(times[tag]):.2f} | "
              f"{1e3 * min(times[tag]):.2f} |")
    print(f"\n(c) / (f) per block: median {ratio:.3f}, range {min(ratios):.3f}-"
          f"{max(ratios):.3f}")
    out = report.Report()
    out.figure("restore gather, fused / TF ops speed (median of blocks)", round(ratio, 3))
    out.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Model.fit throughput: mxrec.keras tables against plain Keras with fixed Embeddings, with
and without the plan-ahead stage, and on several ranks against one process.

(k) baseline: one tf.keras.layers.Embedding of `rows` rows per feature, indexed by
    `ID mod rows`, trained by Keras' Adagrad (its sparse update of the rows in the batch).
(m) mxrec.keras: one mk.Embedding of `rows` device rows per feature addressed by the raw
    int64 IDs (the host key stage inside the train step: dedupe, count, admit, give rows),
    trained by mk.optimizers.Adagrad.
(p) the same model fed by mk.data.plan_ahead(dataset, model, prefetch=2): the key stage of
    batch k + 2 runs in the tf.data pipeline while step k trains.

The same model otherwise (features concatenated, Dense 64 relu, Dense 1, binary
cross-entropy), the same pre-generated batches from memory (tf.data from_tensor_slices over
stacked arrays, prefetch 2), in this process, alternating in rounds after a warm-up round so
that load from elsewhere falls on all alike. The stream's vocabulary grows over the batches,
so new IDs arrive throughout. Prints samples/s per variant (median over rounds) and the
ratios p / k and m / k measured in the same run.

With --ranks N (2 by default; 0 skips it) the (p) variant then runs twice more, each in
processes of its own: on N ranks (`python -m mxrec.launch -n N`, each rank fitting its slice
of every global batch, the tables sharded over the ranks) and in one process, alternating;
the ratio is global samples/s on N ranks over one process's. Both share this machine's
cores, so N ranks on 2 cores measure the exchange's cost, not a scale-out.

Run from the repository root (short by default):
    PYTHONPATH=. .venv/bin/python bench/bench_keras.py [--steps 20 --rounds 3 --ranks 2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxrec.keras as mk  # noqa: E402
from bench.report import Report, add_arguments  # noqa: E402

PLAN_GOAL, RANKS_GOAL = 1.0, 0.8


def stream(args, batches):
    rng = np.random.default_rng(0)
    ids = np.empty((batches, args.batch, args.features), np.int64)
    for step in range(batches):  # the vocabulary grows with the step
        vocab = int(args.vocab * (step + 1) / batches) + 1
        picks = rng.zipf(1.2, size=(args.batch, args.features)) % vocab
        ids[step] = picks * 2654435761 + np.arange(args.features) * (2**40) - 2**62
    labels = rng.integers(0, 2, size=(batches, args.batch, 1)).astype(np.float32)
    return ids, labels


def model_of(tables, features, ids_transform):
    ids = tf.keras.Input([features], dtype=tf.int64, name="ids")
    columns = [tf.keras.layers.Flatten()(table(ids_transform(ids[:, i:i + 1])))
               for i, table in enumerate(tables)]
    x = tf.keras.layers.Dense(64, activation="relu")(tf.keras.layers.Concatenate()(columns))
    return tf.keras.Model(ids, tf.keras.layers.Dense(1)(x))


def mxrec_model(args):
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    ours = model_of([mk.Embedding(args.dim, f"m{i}", args.rows)
                     for i in range(args.features)], args.features, lambda ids: ids)
    ours.compile(optimizer=mk.optimizers.Adagrad(0.05), loss=loss)
    return ours


def plain_model(args):
    plain = model_of([tf.keras.layers.Embedding(args.rows, args.dim, name=f"k{i}")
                      for i in range(args.features)], args.features,
                     lambda ids: tf.math.floormod(ids, args.rows))
    plain.compile(optimizer=tf.keras.optimizers.Adagrad(0.05),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    return plain


def timed_rounds(args, fits):
    """{name: [seconds per measured round]}: each of `fits` (name -> fit(round)) once per
    round, round 0 (tracing, first rows) unmeasured."""
    times = {name: [] for name in fits}
    for round_ in range(args.rounds + 1):
        for name, fit in fits.items():
            start = time.perf_counter()
            fit(round_)
            if round_ > 0:
                times[name].append(time.perf_counter() - start)
    return times


def in_process(args):
    """samples/s of (k), (m) and (p) in this process."""
    mk.init()
    plain, ours = plain_model(args), mxrec_model(args)
    ids, labels = stream(args, args.steps * (args.rounds + 1))
    data = tf.data.Dataset.from_tensor_slices((ids, labels)).prefetch(2)

    def part(round_):
        return data.skip(round_ * args.steps).take(args.steps)

    # Planned before the clock runs (plan_ahead traces the model once per call).
    planned = [mk.data.plan_ahead(part(r), ours, prefetch=2) for r in range(args.rounds + 1)]
    # (m) and (p) train one model in turn, so each round's IDs are new to both alike.
    fits = {"k": lambda r: plain.fit(part(r), epochs=1, verbose=0),
            "m": lambda r: ours.fit(part(r), epochs=1, verbose=0),
            "p": lambda r: ours.fit(planned[r], epochs=1, verbose=0)}
    times = timed_rounds(args, fits)
    return {name: args.steps * args.batch / statistics.median(t) for name, t in times.items()}


def rank_worker(args):
    """(p) alone on this process's slice of every global batch (one of several ranks, or
    one process); rank 0 writes the global samples/s to args.worker_json."""
    mk.init()
    rank, size = mk.rank_and_size()
    ours = mxrec_model(args)
    ids, labels = stream(args, args.steps * (args.rounds + 1))
    mine = slice(rank * args.batch // size, (rank + 1) * args.batch // size)
    data = tf.data.Dataset.from_tensor_slices((ids[:, mine], labels[:, mine])).prefetch(2)

    planned = [mk.data.plan_ahead(data.skip(r * args.steps).take(args.steps), ours,
                                  prefetch=2) for r in range(args.rounds + 1)]

    def fit(round_):
        ours.fit(planned[round_], epochs=1, verbose=0)

    times = timed_rounds(args, {"p": fit})["p"]
    if rank == 0:
        with open(args.worker_json, "w") as out:
            json.dump({"samples_per_s": args.steps * args.batch / statistics.median(times),
                       "ranks": size}, out)


def on_ranks(args, ranks: int, repeats: int = 2):
    """Median global samples/s of (p) on `ranks` ranks and in one process, alternating."""
    rates = {1: [], ranks: []}
    common = [os.path.abspath(__file__), "--steps", str(args.steps), "--rounds",
              str(args.rounds), "--batch", str(args.batch), "--features", str(args.features),
              "--dim", str(args.dim), "--rows", str(args.rows), "--vocab", str(args.vocab)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for count in (1, ranks):
                path = os.path.join(tmp, f"r{count}_{repeat}.json")
                command = [sys.executable, *common, "--worker_json", path]
                if count > 1:
                    command = [sys.executable, "-m", "mxrec.launch", "-n", str(count),
                               *command[1:]]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"bench_keras on {count} rank(s) failed:\n"
                                       f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
                with open(path) as f:
                    rates[count].append(json.load(f)["samples_per_s"])
    return statistics.median(rates[1]), statistics.median(rates[ranks])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds")
    parser.add_argument("--batch", type=int, default=4096, help="global batch")
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--rows", type=int, default=1 << 17)
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, default=2, help="ranks against one process "
                        "(0: skip that comparison)")
    parser.add_argument("--worker_json", help=argparse.SUPPRESS)  # one rank's run (internal)
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = min(args.steps, 8), min(args.rounds, 2)
    if args.worker_json:
        rank_worker(args)
        return
    report = Report()
    rate = in_process(args)
    ratio_p, ratio_m = rate["p"] / rate["k"], rate["m"] / rate["k"]
    report.figure("plain Keras Embedding (ID mod rows): samples/s", rate["k"])
    report.figure("mxrec.keras Embedding (raw IDs): samples/s", rate["m"])
    report.figure("mxrec.keras with plan_ahead(prefetch=2): samples/s", rate["p"])
    report.figure("Model.fit: mxrec.keras x plain Keras fixed buckets", ratio_m)
    report.goal(f"Model.fit with plan_ahead: mxrec.keras x plain Keras (batch {args.batch}, "
                f"{args.features} features) >= {PLAN_GOAL}", ratio_p, PLAN_GOAL)
    if args.ranks > 1:
        one, several = on_ranks(args, args.ranks)
        report.figure("plan_ahead, one process: samples/s", one)
        report.figure(f"plan_ahead, {args.ranks} ranks on this machine: global samples/s",
                      several)
        report.goal(f"Model.fit with plan_ahead: {args.ranks} ranks x one process "
                    f">= {RANKS_GOAL}", several / one, RANKS_GOAL)
    report.figure("tensorflow", tf.__version__)
    report.figure("args", {k: v for k, v in vars(args).items() if k != "json"})
    for label, value in report.figures.items():
        print(f"{label}: {value:,.3f}" if isinstance(value, float) else f"{label}: {value}")
    for goal in report.goals:
        print(f"goal: {goal['goal']}: {goal['value']} ({'met' if goal['met'] else 'NOT met'})")
    report.write(args.json)


if __name__ == "__main__":
    main()

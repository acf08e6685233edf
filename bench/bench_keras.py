"""Model.fit throughput: mxrec.keras tables against plain Keras with fixed Embeddings.

(k) baseline: one tf.keras.layers.Embedding of `rows` rows per feature, indexed by
    `ID mod rows`, trained by Keras' Adagrad (its sparse update of the rows in the batch).
(m) mxrec.keras: one mk.Embedding of `rows` device rows per feature addressed by the raw
    int64 IDs (the host key stage inside the train step: dedupe, count, admit, give rows),
    trained by mk.optimizers.Adagrad.

The same model otherwise (features concatenated, Dense 64 relu, Dense 1, binary
cross-entropy), the same pre-generated batches from memory (tf.data from_tensor_slices over
stacked arrays, prefetch 2), in this process, alternating in rounds after a warm-up round so
that load from elsewhere falls on both alike. The stream's vocabulary grows over the batches,
so new IDs arrive throughout. Prints samples/s per variant (median over rounds) and the
ratio m / k measured in the same run.

Run from the repository root (short by default):
    PYTHONPATH=. .venv/bin/python bench/bench_keras.py [--steps 20 --rounds 3 --batch 2048]
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mxrec.keras as mk  # noqa: E402


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


def variants(args):
    mk.init()
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    plain = model_of([tf.keras.layers.Embedding(args.rows, args.dim, name=f"k{i}")
                      for i in range(args.features)], args.features,
                     lambda ids: tf.math.floormod(ids, args.rows))
    plain.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss=loss)
    ours = model_of([mk.Embedding(args.dim, f"m{i}", args.rows)
                     for i in range(args.features)], args.features, lambda ids: ids)
    ours.compile(optimizer=mk.optimizers.Adagrad(0.05), loss=loss)
    return {"k": plain, "m": ours}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--rows", type=int, default=1 << 17)
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    models = variants(args)
    batches = args.steps * (args.rounds + 1)
    ids, labels = stream(args, batches)
    data = tf.data.Dataset.from_tensor_slices((ids, labels)).prefetch(2)
    times = {name: [] for name in models}
    for round_ in range(args.rounds + 1):  # round 0 warms up (tracing, first rows)
        part = data.skip(round_ * args.steps).take(args.steps)
        for name, model in models.items():
            start = time.perf_counter()
            model.fit(part, epochs=1, verbose=0)
            if round_ > 0:
                times[name].append(time.perf_counter() - start)
    rate = {name: args.steps * args.batch / statistics.median(t) for name, t in times.items()}
    figures = {"plain Keras Embedding (ID mod rows): samples/s": rate["k"],
               "mxrec.keras Embedding (raw IDs): samples/s": rate["m"],
               "Model.fit: mxrec.keras x plain Keras fixed buckets": rate["m"] / rate["k"]}
    for label, value in figures.items():
        print(f"{label}: {value:,.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(figures, tensorflow=tf.__version__, args=vars(args)), out, indent=1)


if __name__ == "__main__":
    main()

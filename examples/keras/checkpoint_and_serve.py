"""Keras training that checkpoints, resumes after a restart, and exports for serving.

1. Model.fit on a first part of a stream with mk.callbacks.Evict and
   mk.callbacks.Checkpoint (full versions and deltas in mxrec's format, the one the
   Session path's hooks write);
2. a "restart": a new init() and a new model, whose Model.fit restores the latest version
   first (tables, slots, dense weights, the optimizer's step) and trains on the rest;
3. mk.export_serving: a SavedModel of core ops, loaded by mxrec's REST predictor's model
   loader, which must answer what model.predict answers.

Run from the repository root (TF 2.15 or 2.21; build the ops for that TensorFlow first):
    PYTHONPATH=. .venv/bin/python examples/keras/checkpoint_and_serve.py [--steps 60]
"""

import argparse
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

import mxrec.keras as mk
from mxrec.serving.predictor import ModelInstance


def stream(rng, steps, batch, vocab):
    """(user IDs [B, 2] raw int64, batch time [B]), click [B, 1]: a label the IDs decide."""
    users = rng.integers(-(2**62), 2**62, size=vocab, dtype=np.int64)
    taste = rng.normal(size=vocab)
    pick = rng.zipf(1.3, size=(steps, batch, 2)) % vocab
    label = (taste[pick].sum(-1) > 0).astype(np.float32)[..., None]
    time = np.repeat(np.arange(steps, dtype=np.int64)[:, None], batch, axis=1)
    return (users[pick].reshape(-1, 2), time.reshape(-1)), label.reshape(-1, 1)


def build(args):
    mk.init()
    user = mk.Embedding(8, "user", device_vocabulary_size=args.vocab, access_threshold=2,
                        eviction_threshold=args.steps // 3)
    ids = tf.keras.Input([2], dtype=tf.int64, name="user_ids")
    time = tf.keras.Input([], dtype=tf.int64, name="time")
    x = tf.keras.layers.Flatten()(user(ids, timestamp=time))
    x = tf.keras.layers.Dense(16, activation="relu", name="hidden")(x)
    model = tf.keras.Model([ids, time], tf.keras.layers.Dense(1, name="click")(x))
    model.compile(optimizer=mk.optimizers.Adagrad(0.05),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    return model, user


def fit(model, args, x, y, directory):
    callbacks = [mk.callbacks.Evict(every_steps=10),
                 mk.callbacks.Checkpoint(directory, full_every=20, delta_every=5)]
    history = model.fit(x, y, batch_size=args.batch_size, shuffle=False, verbose=0,
                        callbacks=callbacks)
    return history.history["loss"][-1], callbacks[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=3000)
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="mxrec_keras_example_")
    try:
        run(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args, workdir):
    directory = os.path.join(workdir, "ckpt")

    (ids, time), label = stream(np.random.default_rng(0), args.steps, args.batch_size,
                                args.vocab)
    half = args.steps // 2 * args.batch_size
    model, _ = build(args)
    loss, _ = fit(model, args, (ids[:half], time[:half]), label[:half], directory)
    print(f"first run: {args.steps // 2} steps, loss {loss:.4f}")

    mk.terminate()  # the "restart": new host tables, a new model
    tf.keras.backend.clear_session()
    model, user = build(args)
    loss, checkpoint = fit(model, args, (ids[half:], time[half:]), label[half:], directory)
    print(f"restarted from step {checkpoint.restored_step}: now at step "
          f"{int(model.optimizer.iterations.numpy())}, loss {loss:.4f}, "
          f"{user.stats()['rows_in_use']} IDs with rows")
    print("versions:", " ".join(sorted(os.listdir(directory))))

    export_dir = os.path.join(workdir, "serving", "1")
    mk.export_serving(model, export_dir)
    query = {"user_ids": ids[:256], "time": time[:256]}
    served = ModelInstance(export_dir).predict(query)["click"]
    expected = model.predict([query["user_ids"], query["time"]], verbose=0)
    gap = float(np.abs(served - expected).max())
    print(f"served {export_dir}: max |served - model.predict| = {gap:.2e}")
    if gap > 1e-5:
        raise SystemExit("the export does not serve the model's predictions")


if __name__ == "__main__":
    main()

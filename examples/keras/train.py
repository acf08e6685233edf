"""A tiny CTR model on mxrec tables with Keras (TF2): Model.fit, then a tf.function loop.

Two tables of raw int64 IDs (user and item, negatives included, never hashed into
buckets), admission on the user table, eviction between epochs, a Dense head; trained
with mk.optimizers.Adagrad (Keras' Adagrad for the Dense weights, mxrec's hash Adagrad on
the table rows the batches touched). Then a custom training loop (tf.function +
tf.GradientTape) continues on the same layers, and the model is evaluated: IDs never
trained on read zeros and are not inserted (training=False).

Run from the repository root (TF 2.15 or 2.21; build the ops for that TensorFlow first):
    PYTHONPATH=. .venv/bin/python examples/keras/train.py [--steps 200 --batch_size 256]
"""

import argparse

import numpy as np
import tensorflow as tf

import mxrec.keras as mk


def stream(rng, steps, batch, vocab_user, vocab_item):
    """(ids_user [B, 2], ids_item [B, 1], time [B]), label: the label depends on the IDs."""
    users = rng.integers(-(2**62), 2**62, size=vocab_user, dtype=np.int64)
    items = rng.integers(-(2**62), 2**62, size=vocab_item, dtype=np.int64)
    taste = rng.normal(size=(vocab_user, vocab_item))
    pick_u = rng.zipf(1.3, size=(steps, batch, 2)) % vocab_user
    pick_i = rng.zipf(1.3, size=(steps, batch, 1)) % vocab_item
    label = (taste[pick_u[..., 0], pick_i[..., 0]] > 0).astype(np.float32)[..., None]
    time = np.repeat(np.arange(steps, dtype=np.int64)[:, None], batch, axis=1)
    return (users[pick_u], items[pick_i], time), label


def build(args):
    user = mk.Embedding(8, "user", device_vocabulary_size=args.vocab_user,
                        access_threshold=2, eviction_threshold=args.steps // 8)
    item = mk.Embedding(8, "item", device_vocabulary_size=args.vocab_item)
    ids_user = tf.keras.Input([2], dtype=tf.int64, name="user_ids")
    ids_item = tf.keras.Input([1], dtype=tf.int64, name="item_ids")
    time = tf.keras.Input([], dtype=tf.int64, name="time")
    x = tf.keras.layers.Concatenate()([
        tf.keras.layers.Flatten()(user(ids_user, timestamp=time)),
        tf.keras.layers.Flatten()(item(ids_item))])
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    out = tf.keras.layers.Dense(1)(x)
    return tf.keras.Model([ids_user, ids_item, time], out), user, item


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--vocab_user", type=int, default=5000)
    parser.add_argument("--vocab_item", type=int, default=500)
    args = parser.parse_args()

    mk.init()
    rng = np.random.default_rng(0)
    (users, items, time), label = stream(rng, 2 * args.steps, args.batch_size,
                                         args.vocab_user, args.vocab_item)
    model, user, item = build(args)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    optimizer = mk.optimizers.Adagrad(0.05, initial_accumulator_value=0.1)
    model.compile(optimizer=optimizer, loss=loss_fn, metrics=[tf.keras.metrics.AUC()])

    half = args.steps // 2
    data = tf.data.Dataset.from_tensor_slices(((users, items, time), label))
    model.fit(data.take(half), epochs=1, verbose=2)
    print("evicted after the fit:", user.evict(), "user stats:", user.stats())

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    for i, (features, labels) in enumerate(data.skip(half).take(args.steps - half)):
        loss = step(features, labels)
        if i % 50 == 0:
            print(f"loop step {i}: loss {float(loss):.4f}")

    auc = tf.keras.metrics.AUC()
    for features, labels in data.skip(args.steps).take(20):
        auc.update_state(labels, tf.sigmoid(model(features, training=False)))
    print(f"next-day AUC {float(auc.result()):.4f}; user rows in use "
          f"{user.stats()['rows_in_use']}, item rows {item.stats()['rows_in_use']}")


if __name__ == "__main__":
    main()

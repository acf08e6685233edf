"""The little demo's data and model, shared by the Session demo and the Estimator demo.

Data: a synthetic click log made in NumPy, fixed by a seed. Each row has a user
ID (int32), three item IDs (int32) and a category as a string ("c17"); the label
comes from hidden per-ID weights, so the embeddings have something to learn.

Model: three mxrec tables (user, item, category), looked up with
`modify_graph=True`; the IDs go through ordinary preprocessing (cast, slicing,
`tf.strings` parsing) between `get_next()` and `sparse_lookup`, which the graph
modifier moves into the input pipeline. The embeddings feed a small MLP.

Example:
    >>> features, labels = iterator.get_next()  # {"user": [B], "items": [B, 3], "cat": [B]}
    >>> tables = create_tables()
    >>> logits = model_logits(tables, features, is_train=True)  # [B]
"""

import dataclasses
from typing import Dict, Tuple

import numpy as np
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers.lazy_adam import create_hash_optimizer
from mxrec.util.variable import get_dense_and_sparse_variable

DIM = 8
BATCH_SIZE = 128
NUM_USERS, NUM_ITEMS, NUM_CATS = 400, 800, 40


@dataclasses.dataclass
class DemoData:
    """Train and eval rows as NumPy arrays: (features dict, labels [n])."""

    train: Tuple[Dict[str, np.ndarray], np.ndarray]
    eval: Tuple[Dict[str, np.ndarray], np.ndarray]


def make_data(seed: int = 7, train_rows: int = 8192, eval_rows: int = 2048) -> DemoData:
    rng = np.random.default_rng(seed)
    user_w = rng.normal(0, 1.0, NUM_USERS)
    item_w = rng.normal(0, 1.0, NUM_ITEMS)
    cat_w = rng.normal(0, 1.0, NUM_CATS)

    def rows(n):
        user = rng.integers(0, NUM_USERS, n)
        items = rng.zipf(1.3, (n, 3)) % NUM_ITEMS
        cat = rng.integers(0, NUM_CATS, n)
        logit = user_w[user] + item_w[items].sum(axis=1) / 2 + cat_w[cat]
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        features = {
            "user": user.astype(np.int32),
            "items": items.astype(np.int32),
            "cat": np.array([f"c{c}" for c in cat], dtype=object),
        }
        return features, labels

    return DemoData(train=rows(train_rows), eval=rows(eval_rows))


def dataset(rows, batch_size: int = BATCH_SIZE) -> tf.data.Dataset:
    """One pass over `rows` in batches; the last partial batch is kept."""
    return tf.data.Dataset.from_tensor_slices(rows).batch(batch_size)


def create_tables():
    """The three tables; initial rows are seeded, so every run starts alike."""

    def init(seed):
        return tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=seed)

    return {
        "user": create_table(tf.int64, DIM, "user_table", init(1), device_vocabulary_size=1000),
        "item": create_table(tf.int64, DIM, "item_table", init(2), device_vocabulary_size=1000),
        "cat": create_table(tf.int64, DIM, "cat_table", init(3), device_vocabulary_size=100),
    }


def model_logits(tables, features, is_train: bool) -> tf.Tensor:
    """Logits [B] of the demo model; dense weights are shared between calls."""
    user = tf.cast(features["user"], tf.int64)
    items = tf.cast(features["items"], tf.int64)
    cat = tf.strings.to_number(tf.strings.substr(features["cat"], 1, -1), out_type=tf.int64)
    emb = [
        sparse_lookup(tables["user"], user, is_train=is_train, modify_graph=True,
                      name="user_lookup"),
        tf.reduce_sum(sparse_lookup(tables["item"], items, is_train=is_train,
                                    modify_graph=True, name="item_lookup"), axis=1),
        sparse_lookup(tables["cat"], cat, is_train=is_train, modify_graph=True,
                      name="cat_lookup"),
    ]
    x = tf.concat(emb, axis=1)
    with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
        hidden = tf.nn.relu(_dense(x, 16, "hidden", seed=4))
        logits = _dense(hidden, 1, "out", seed=5)
    return tf.reshape(logits, [-1])


def _dense(x, units: int, name: str, seed: int) -> tf.Tensor:
    """A fully connected layer from get_variable (tf.compat.v1.layers needs Keras 2)."""
    with tf.compat.v1.variable_scope(name):
        kernel = tf.compat.v1.get_variable(
            "kernel", [x.shape[-1], units],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
        bias = tf.compat.v1.get_variable("bias", [units], initializer=tf.zeros_initializer())
    return tf.matmul(x, kernel) + bias


def loss_fn(logits, labels) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def train_op_fn(loss, global_step=None) -> tf.Operation:
    """Adam on the MLP, LazyAdam (mxrec hash optimizer) on the tables."""
    dense, sparse = get_dense_and_sparse_variable()
    dense_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, var_list=dense, global_step=global_step)
    sparse_grads = tf.gradients(loss, sparse)
    sparse_op = create_hash_optimizer(learning_rate=0.01).apply_gradients(
        zip(sparse_grads, sparse))
    return tf.group(dense_op, sparse_op)

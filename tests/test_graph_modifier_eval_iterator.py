"""A long-lived evaluation iterator through the graph modifier reads the tables as they are
when its step runs: one iterator over a `repeat()`ed dataset, built once and never
re-initialised, read after every few training steps, predicts what the direct path
(which plans in the step) predicts, at any prefetch depth, device-only and host tier."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.graph.modifier import modify_graph_and_start_emb_cache
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.util.initialize import get_initializer, init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

BATCH, FEATURES, DIM = 8, 3, 4
ROUNDS, STEPS_PER_ROUND, EVAL_BATCHES = 4, 5, 3
POOL = 60  # IDs 0..59 in training; evaluation also asks for 60..69, never trained


def _train_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, POOL, size=(ROUNDS * STEPS_PER_ROUND * BATCH, FEATURES))
    labels = (rng.random((len(ids), 1)) < 0.4).astype(np.float32)
    return ids.astype(np.int64), labels


def _eval_ids():
    rng = np.random.default_rng(1)
    return rng.integers(0, POOL + 10, size=(EVAL_BATCHES * BATCH, FEATURES)).astype(np.int64)


def _run(modify_graph: bool, prefetch: int, host_tier: bool):
    """Predictions of every evaluation round: [ROUNDS, EVAL_BATCHES * BATCH]."""
    init(prefetch_batch_number=prefetch)
    tf.compat.v1.set_random_seed(3)
    ids, labels = _train_data()
    train_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices((ids, labels)).batch(BATCH))
    # Built once, over a repeated dataset, never re-initialised.
    eval_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(_eval_ids()).batch(BATCH).repeat())
    tiers = dict(device_vocabulary_size=24, host_vocabulary_size=200) if host_tier else dict(
        device_vocabulary_size=100)
    table = create_table(tf.int64, DIM, "emb",
                         tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1), **tiers)
    features, label = train_it.get_next()
    emb = sparse_lookup(table, features, modify_graph=modify_graph, name="train_lookup",
                        access_and_evict_config=dict(access_threshold=2))
    eval_emb = sparse_lookup(table, eval_it.get_next(), is_train=False,
                             modify_graph=modify_graph, name="eval_lookup")
    kernel = tf.compat.v1.get_variable("kernel", [FEATURES * DIM, 1],
                                       initializer=tf.compat.v1.glorot_uniform_initializer(2))
    logits = tf.matmul(tf.reshape(emb, [-1, FEATURES * DIM]), kernel)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
    predictions = tf.sigmoid(tf.matmul(tf.reshape(eval_emb, [-1, FEATURES * DIM]), kernel))
    dense, sparse = get_dense_and_sparse_variable()
    train_op = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss, var_list=dense),
        create_hash_optimizer(0.5).apply_gradients(zip(tf.gradients(loss, sparse), sparse)))
    if modify_graph:
        modify_graph_and_start_emb_cache()
        starts = [get_initializer(True), get_initializer(False)]
    else:
        starts = [train_it.initializer, eval_it.initializer]
    rounds = []
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(starts)
        for _ in range(ROUNDS):
            for _ in range(STEPS_PER_ROUND):
                sess.run(train_op)
            rounds.append(np.concatenate([sess.run(predictions)[:, 0]
                                          for _ in range(EVAL_BATCHES)]))
        stats = table.stats()
    terminate_config_initializer()
    return np.stack(rounds), stats


@pytest.fixture(scope="module", params=[False, True], ids=["device_only", "host_tier"])
def direct(request):
    with tf.Graph().as_default():
        return request.param, _run(modify_graph=False, prefetch=1, host_tier=request.param)


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_long_lived_eval_iterator_equals_direct_path(direct, prefetch):
    host_tier, (want, want_stats) = direct
    with tf.Graph().as_default():
        got, stats = _run(modify_graph=True, prefetch=prefetch, host_tier=host_tier)
    # The model learns between rounds, so a stale plan would show (IDs admitted since
    # read as unseen, rows moved since between the tiers).
    assert np.abs(want[-1] - want[0]).max() > 1e-2
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert stats["eval_batches"] == want_stats["eval_batches"] == ROUNDS * EVAL_BATCHES
    assert stats["ids_seen"] == want_stats["ids_seen"]  # evaluation counted nothing
    assert stats["rows_in_use"] == want_stats["rows_in_use"]

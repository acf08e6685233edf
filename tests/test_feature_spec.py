"""FeatureSpec and the FeatureSpec path's dataset stage (get_asc_insert_func)."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func, planned_tensors, start_asc_pipeline
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import adagrad
from mxrec.util.initialize import init, terminate_config_initializer


def test_feature_spec_checks():
    assert FeatureSpec("user", table_name="t").ids_key == "user"
    assert FeatureSpec("u", table_name="t", index_key="user").ids_key == "user"
    FeatureSpec("timestamp", is_timestamp=True)
    assert FeatureSpec("user").table_name == "user"  # mx_rec: the table named like the feature
    with pytest.raises(ValueError, match="eviction_threshold needs access_threshold"):
        FeatureSpec("user", table_name="t", eviction_threshold=10)
    with pytest.raises(ValueError, match="faae_coefficient"):
        FeatureSpec("user", table_name="t", faae_coefficient=0)
    with pytest.raises(ValueError, match="timestamp feature has no table_name"):
        FeatureSpec("ts", table_name="t", is_timestamp=True)


def test_insert_func_plans_in_the_dataset():
    init()
    start_asc_pipeline()
    table = create_table(tf.int64, 4, "user_table", tf.zeros_initializer(),
                         device_vocabulary_size=50)
    specs = [FeatureSpec("user", table_name="user_table"),
             FeatureSpec("again", table_name="user_table", index_key="user2"),
             FeatureSpec("timestamp", is_timestamp=True)]
    features = {"user": np.array([[1, 2], [2, 3], [7, 7], [8, 9]], np.int64),
                "user2": np.array([1, 5, 6, 7], np.int64),
                "timestamp": np.array([100, 101, 102, 103], np.int64)}
    dataset = tf.data.Dataset.from_tensor_slices((features, np.zeros(4, np.float32))).batch(2)
    dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset.prefetch(1)).get_next()
    rows, restore, _ = planned_tensors(batch, specs[0])
    with tf.compat.v1.Session() as sess:
        got_rows, got_restore = sess.run([rows, restore])
        np.testing.assert_array_equal(got_rows, [0, 1, 2])
        np.testing.assert_array_equal(got_restore, [0, 1, 1, 2])
        sess.run(batch)
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(batch)
    assert table.stats()["ids_seen"] == 8 + 4


def test_insert_func_errors():
    init()
    with pytest.raises(TypeError, match="list of FeatureSpec"):
        get_asc_insert_func(tgt_key_specs=[])
    dataset = tf.data.Dataset.from_tensor_slices({"user": np.array([1, 2], np.int64)})
    with pytest.raises(ValueError, match=r"no feature\(s\) \['item'\]"):
        dataset.map(get_asc_insert_func(tgt_key_specs=[FeatureSpec("item", table_name="t")]))
    with pytest.raises(ValueError, match="no planned rows"):
        planned_tensors({"user": tf.constant([1])}, FeatureSpec("user", table_name="t"))


def _train_feature_spec_model(use_feature_spec: bool):
    """Trains one table on a fixed stream, via FeatureSpec or via the direct path."""
    rng = np.random.default_rng(3)
    users = rng.integers(-(2**62), 2**62, size=30)
    batches = users[rng.zipf(1.5, size=(12, 8)) % 30]
    labels = rng.random((12, 8)).astype(np.float32)
    init(prefetch_batch_number=2)
    table = create_table(tf.int64, 4, "user_table",
                         tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=5),
                         device_vocabulary_size=64)
    dataset = tf.data.Dataset.from_tensor_slices(({"user": batches}, labels))
    spec = FeatureSpec("user", table_name="user_table", access_threshold=2, faae_coefficient=1)
    if use_feature_spec:
        dataset = dataset.map(get_asc_insert_func(tgt_key_specs=[spec], is_training=True))
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    batch = iterator.get_next()
    features, label = batch
    if use_feature_spec:
        emb = sparse_lookup(table, spec, batch=batch)
    else:
        emb = sparse_lookup(table, features["user"],
                            access_and_evict_config={"access_threshold": 2,
                                                     "faae_coefficient": 1})
    logits = tf.reduce_sum(emb, axis=-1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
    grads = tf.gradients(loss, [table.variable])
    train = adagrad.create_hash_optimizer(0.1).apply_gradients(zip(grads, [table.variable]))
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
        for _ in range(len(batches)):
            sess.run(train)
        values = sess.run(table.variable)
    ids, rows = table.export_rows()
    stats = table.stats()
    terminate_config_initializer()
    return dict(zip(ids.tolist(), values[rows])), stats


def test_feature_spec_lookup_trains_like_the_direct_path():
    with tf.Graph().as_default():
        planned, planned_stats = _train_feature_spec_model(use_feature_spec=True)
    with tf.Graph().as_default():
        direct, direct_stats = _train_feature_spec_model(use_feature_spec=False)
    assert planned.keys() == direct.keys()
    for key, row in direct.items():
        np.testing.assert_allclose(planned[key], row, atol=1e-6)
    assert planned_stats["ids_seen"] == direct_stats["ids_seen"] == 12 * 8
    assert planned_stats["admitted"] == direct_stats["admitted"] < 30


def test_feature_spec_lookup_errors():
    init()
    table = create_table(tf.int64, 4, "user_table", tf.zeros_initializer(),
                         device_vocabulary_size=8)
    spec = FeatureSpec("user", table_name="user_table")
    with pytest.raises(ValueError, match="pass batch="):
        sparse_lookup(table, spec)
    with pytest.raises(ValueError, match="names table 'other'"):
        sparse_lookup(table, FeatureSpec("user", table_name="other"), batch={})

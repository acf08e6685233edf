"""FeatureSpec and the FeatureSpec path's dataset stage (get_asc_insert_func)."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func, planned_tensors, start_asc_pipeline
from mxrec.core.embedding import create_table
from mxrec.util.initialize import init, terminate_config_initializer


@pytest.fixture(autouse=True)
def _graph_mode():
    with tf.Graph().as_default():
        yield
    terminate_config_initializer()


def test_feature_spec_checks():
    assert FeatureSpec("user", table_name="t").ids_key == "user"
    assert FeatureSpec("u", table_name="t", index_key="user").ids_key == "user"
    FeatureSpec("timestamp", is_timestamp=True)
    with pytest.raises(ValueError, match="table_name is required"):
        FeatureSpec("user")
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

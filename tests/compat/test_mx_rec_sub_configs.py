"""ConfigInitializer's sub-configs as mx_rec's scripts use them (optimizer_config,
train_params_config, sparse_embed_config), the ones refused by name, and the later RecSDK
DLRM's create_hash_optimizer (examples/mx_rec_zoo/dlrm_later), which records its optimizer in
optimizer_config, against a NumPy update."""

import importlib.util

import numpy as np
import pytest
import tensorflow as tf
from zoo_support import ZOO

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.util.initialize import ConfigInitializer

_v1 = tf.compat.v1


def test_optimizer_config_records_the_optimizer_and_checks_it(mx):
    mx()
    runtime = ConfigInitializer.get_instance()
    config = runtime.optimizer_config
    assert config is runtime.optimizer_config  # one object per init(), as in mx_rec
    assert config.optimizer_instance is None and config.optim_params_list == []
    adam = _v1.train.AdamOptimizer(0.1)
    config.optimizer_instance = adam
    assert runtime.optimizer_config.optimizer_instance is adam
    with pytest.raises(TypeError, match="optimizer_instance must be a tf.compat.v1.train"):
        config.optimizer_instance = "adam"
    for name in ("set_optimizer_for_table", "get_optimizer_by_table_name"):
        with pytest.raises(AttributeError, match=f"OptimizerConfig.{name} is not available"):
            getattr(config, name)
    # A later init() starts with a record of its own.
    mx()
    assert ConfigInitializer.get_instance().optimizer_config.optimizer_instance is None


def test_sub_configs_are_replaced_by_fresh_ones_only(mx):
    from mxrec.util.config_utils.optimizer_utils import OptimizerConfig
    from mxrec.util.config_utils.train_param import TrainParamsConfig

    mx()
    runtime = ConfigInitializer.get_instance()
    old = runtime.optimizer_config
    runtime.optimizer_config = OptimizerConfig()
    assert runtime.optimizer_config is not old
    with pytest.raises(TypeError, match="optimizer_config must be a OptimizerConfig"):
        runtime.optimizer_config = TrainParamsConfig()
    params = TrainParamsConfig()
    params.insert_training_mode_channel_id(is_training=False)
    runtime.train_params_config = params
    assert runtime.train_params_config.get_training_mode_channel_id(False) == 1
    assert runtime.train_params_config.get_training_mode_channel_id(True) is None
    mx()
    with pytest.raises(ValueError, match="belongs to another init"):
        ConfigInitializer.get_instance().train_params_config = params


def test_train_params_config_channels_follow_the_lookups(mx):
    mx()
    params = ConfigInitializer.get_instance().train_params_config
    assert params.get_training_mode_channel_id(True) is None
    table = create_table(tf.int64, 4, "t", _v1.zeros_initializer(), device_vocabulary_size=8)
    sparse_lookup(table, tf.constant([1, 2], tf.int64), is_train=True)
    assert params.get_training_mode_channel_id(True) == 0
    assert params.get_training_mode_channel_id(False) is None
    import mxrec

    assert params.ascend_global_hashtable_collection == mxrec.ASCEND_GLOBAL_HASHTABLE_COLLECTION
    assert _v1.get_collection(mxrec.ASCEND_GLOBAL_HASHTABLE_COLLECTION) == [table.variable]
    for name in ("is_last_round", "sparse_dir", "iterator_type",
                 "ascend_global_hashtable_collection"):
        with pytest.raises(AttributeError, match=f"TrainParamsConfig.{name}"):
            setattr(params, name, "x")
    with pytest.raises(AttributeError, match="set_initializer is not available"):
        params.set_initializer(True, None)


def test_sparse_embed_config_answers_the_tables(mx):
    mx()
    sparse = ConfigInitializer.get_instance().sparse_embed_config
    assert sparse.table_instance_dict == {}
    table = create_table(tf.int64, 4, "emb", _v1.zeros_initializer(), device_vocabulary_size=8)
    assert sparse.table_instance_dict == {"emb": table}
    assert sparse.get_table_instance_by_name("emb") is table
    assert sparse.get_table_instance_by_name("other") is None
    assert sparse.get_table_instance(table.variable) is table
    with pytest.raises(KeyError, match="not the variable of a table"):
        sparse.get_table_instance(_v1.get_variable("dense", [2]))
    with pytest.raises(AttributeError, match="insert_table_instance is not available"):
        sparse.insert_table_instance("x", None, None, False)


@pytest.mark.parametrize("name", ["hybrid_manager_config", "feature_spec_config"])
def test_mx_rec_only_sub_configs_are_refused_naming_why(mx, name):
    mx()
    with pytest.raises(AttributeError, match=f"ConfigInitializer.{name} is not available: mx_rec"):
        getattr(ConfigInitializer.get_instance(), name)


def _later_dlrm_optimizer_module(monkeypatch):
    monkeypatch.syspath_prepend(str(ZOO / "dlrm_later"))
    spec = importlib.util.spec_from_file_location(
        "later_gradient_descent_w", ZOO / "dlrm_later" / "gradient_descent_w.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_later_dlrm_create_hash_optimizer_records_itself_and_matches_numpy(
        mx, make_session, monkeypatch):
    module = _later_dlrm_optimizer_module(monkeypatch)
    mx()
    table = create_table(tf.int64, 4, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=20)
    weights = np.random.default_rng(0).normal(size=(3, 4))
    emb = sparse_lookup(table, tf.constant([7, 3, 7], tf.int64))
    loss = tf.reduce_sum(emb * tf.constant(weights, tf.float32))
    opt = module.create_hash_optimizer(learning_rate=0.1, weight_decay=0.01)
    assert ConfigInitializer.get_instance().optimizer_config.optimizer_instance is opt
    train = opt.apply_gradients([(tf.gradients(loss, [table.variable])[0], table.variable)])
    sess = make_session()
    values = np.full((2, 4), 0.5)  # rows of 7 and 3, in first-seen order
    grad = np.stack([weights[0] + weights[2], weights[1]])
    for _ in range(3):
        sess.run(train)
        values = values - 0.1 * (grad + 0.01 * values)
    np.testing.assert_allclose(sess.run(table.variable)[:2], values, rtol=1e-5, atol=1e-6)

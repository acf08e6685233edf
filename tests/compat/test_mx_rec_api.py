"""mx_rec's documented API under mxrec: every module path and name a script imports, and the
behaviour of each (README.md's compatibility table)."""

import importlib
import logging
import os
import time

import numpy as np
import pytest
import tensorflow as tf
from support import wait_for_planned_batches

from mxrec._lib import loader
from mxrec.constants import constants
from mxrec.core import tiers as tiers_module
from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import gradient_descent, lazy_adam_by_addr
from mxrec.util import initialize
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1

# mx_rec module path -> names its documentation and public examples import from it.
MX_REC_API = {
    "constants.constants": ["ASCEND_TIMESTAMP", "BaseEnum", "CacheModeEnum",
                            "ApplyGradientsStrategy", "All2allGradientsOp",
                            "ASCEND_SPARSE_LOOKUP_LOCAL_EMB", "ASCEND_SPARSE_LOOKUP_ID_OFFSET",
                            "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"],
    "util.initialize": ["init", "terminate_config_initializer", "get_rank_id", "get_rank_size",
                        "get_initializer", "set_if_load", "get_host_pipeline_ops",
                        "clear_channel", "ConfigInitializer", "get_use_dynamic_expansion",
                        "get_training_mode_channel_id"],
    "util.communication.hccl_ops": ["get_rank_id", "get_rank_size", "allreduce"],
    "util.tf_version_adapter": ["hccl_ops", "npu_ops"],
    "util.log": ["logger"],
    "util.ops": ["import_host_pipeline_ops"],
    "util.variable": ["get_dense_and_sparse_variable"],
    "core.embedding": ["create_table", "sparse_lookup"],
    "core.asc.feature_spec": ["FeatureSpec"],
    "core.asc.helper": ["get_asc_insert_func", "FeatureSpec"],
    "core.asc.manager": ["start_asc_pipeline"],
    "core.feature_process": ["EvictHook"],
    "graph.modifier": ["modify_graph_and_start_emb_cache", "GraphModifierHook"],
    "graph.acg_push_ops": ["ACGPushOpsToDatasetHook"],
    "optimizers.gradient_descent": ["create_hash_optimizer"],
    "optimizers.adagrad": ["create_hash_optimizer"],
    "optimizers.lazy_adam": ["create_hash_optimizer"],
    "optimizers.ftrl": ["create_hash_optimizer"],
    "optimizers.momentum": ["create_hash_optimizer"],
    "optimizers.gradient_descent_by_addr": ["create_hash_optimizer_by_address",
                                            "create_hash_optimizer_by_addr"],
    "optimizers.adagrad_by_addr": ["create_hash_optimizer_by_address",
                                   "create_hash_optimizer_by_addr"],
    "optimizers.lazy_adam_by_addr": ["create_hash_optimizer_by_address",
                                     "create_hash_optimizer_by_addr"],
    "saver.warm_start": ["WarmStart"],
}


@pytest.mark.parametrize("path", sorted(MX_REC_API))
def test_mx_rec_module_paths_import(path):
    module = importlib.import_module(f"mxrec.{path}")
    missing = [name for name in MX_REC_API[path] if not hasattr(module, name)]
    assert not missing, f"mxrec.{path} lacks {missing}"


def test_constants_and_enums():
    assert constants.ASCEND_TIMESTAMP == "ASCEND_TIMESTAMP"
    assert constants.TIMESTAMP_COLLECTION == constants.ASCEND_TIMESTAMP
    assert constants.CacheModeEnum.mapping("DDR") is constants.CacheModeEnum.DDR
    assert [m.value for m in constants.CacheModeEnum] == ["HBM", "DDR", "SSD"]
    strategy = constants.ApplyGradientsStrategy
    assert strategy.mapping(strategy.DIRECT_APPLY) is strategy.DIRECT_APPLY
    with pytest.raises(KeyError, match="sum_same_id_gradients_and_apply"):
        strategy.mapping(None)  # mx_rec's scripts read an unset env var this way too
    assert issubclass(constants.CacheModeEnum, constants.BaseEnum)


def test_ascend_timestamp_collection_stamps_the_batch(make_session):
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, 4, "t", tf.zeros_initializer(), device_vocabulary_size=8)
    stamp = _v1.placeholder(tf.int64, [])
    _v1.add_to_collection(constants.ASCEND_TIMESTAMP, stamp)  # as mx_rec scripts do
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64),
                        access_and_evict_config=dict(access_threshold=1, eviction_threshold=5))
    make_session().run(emb, {stamp: 1234})
    assert loader.engine().newest_timestamp(table.table_key) == 1234


def test_hccl_ops_and_npu_ops(make_session):
    from mxrec.util.communication import (  # the module's API stays
        allreduce,
        hccl_ops,
        session_kwargs,
    )
    from mxrec.util.tf_version_adapter import hccl_ops as adapter_hccl
    from mxrec.util.tf_version_adapter import npu_ops

    assert adapter_hccl is hccl_ops and callable(allreduce) and session_kwargs() == {}
    assert (hccl_ops.get_rank_id(), hccl_ops.get_rank_size()) == (0, 1)
    x = tf.constant([1.0, 2.0])
    sess = make_session()
    np.testing.assert_array_equal(sess.run(hccl_ops.allreduce(x, "sum")), [1.0, 2.0])
    np.testing.assert_array_equal(sess.run(npu_ops.dropout(x, keep_prob=1.0)), [1.0, 2.0])
    for kwargs, match in (({"reduction": "prod"}, "prod"), ({"group": "g"}, "group"),
                          ({"fusion": 2}, "fusion")):
        with pytest.raises(NotImplementedError, match=match):
            hccl_ops.allreduce(x, **kwargs)


def test_logger():
    from mxrec.util.log import logger

    assert isinstance(logger, logging.Logger) and logger.name == "mxrec"


def test_initialize_names(make_session):
    runtime = init(use_dynamic=False)
    assert runtime.if_load is False
    initialize.set_if_load(True)
    config = initialize.ConfigInitializer.get_instance()
    assert config.if_load is True and config.use_static and not config.use_dynamic
    with pytest.raises(TypeError, match="if_load"):
        initialize.set_if_load(1)
    params = config.train_params_config
    assert params.get_training_mode_channel_id(False) is None
    table = create_table(tf.int64, 4, "t", tf.zeros_initializer(), device_vocabulary_size=8)
    sparse_lookup(table, tf.constant([1], tf.int64), send_count=4, is_train=False)
    assert params.get_training_mode_channel_id(False) == constants.EVAL_CHANNEL_ID
    assert initialize.get_training_mode_channel_id(True) is None
    initialize.clear_channel(is_train_channel=False)
    with pytest.raises(TypeError):
        initialize.clear_channel(is_train_channel=0)
    ops = initialize.get_host_pipeline_ops()
    assert type(config.host_pipeline_ops) is type(ops)
    before = int(time.time())
    stamp = make_session().run([ops.return_timestamp(tf.constant([1], tf.int64)),
                                ops.clear_channel(1)])[0]
    assert before <= stamp <= int(time.time())
    with pytest.raises(ValueError, match="channel_id"):
        ops.clear_channel(2)
    with pytest.raises(TypeError, match="int64"):
        ops.return_timestamp(tf.constant([1], tf.int32))


def test_by_addr_spelling():
    for module in ("gradient_descent_by_addr", "adagrad_by_addr", "lazy_adam_by_addr"):
        mod = importlib.import_module(f"mxrec.optimizers.{module}")
        assert mod.create_hash_optimizer_by_addr is mod.create_hash_optimizer_by_address


@pytest.mark.parametrize("tiers, capacity", [({}, 50), ({"host_vocabulary_size": 100}, 150),
                                             ({"host_vocabulary_size": 100,
                                               "ssd_vocabulary_size": 200}, 350)])
def test_table_size_and_capacity(make_session, tmp_path, monkeypatch, tiers, capacity):
    monkeypatch.chdir(tmp_path)  # an SSD tier without ssd_data_path goes to the working dir
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, 4, "t", tf.zeros_initializer(), device_vocabulary_size=50,
                         is_dp=True, **tiers)
    emb = sparse_lookup(table, tf.constant([3, 4, 4, 9], tf.int64))
    assert table.size() == 0 and table.capacity() == capacity
    make_session().run(emb)
    assert table.size() == 3
    if "ssd_vocabulary_size" in tiers:  # mx_rec's default ssd_data_path, (os.getcwd(),)
        assert tiers_module.check_settings("t", 100, 200, ())[2] == str(tmp_path)


def test_dynamic_table_capacity(make_session):
    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, 4, "t", tf.zeros_initializer(), device_vocabulary_size=300)
    emb = sparse_lookup(table, tf.constant(np.arange(1000), tf.int64))
    make_session().run(emb)
    assert table.size() == 1000 and table.capacity() >= 1000


def test_optimizer_list_is_checked(make_session):
    init()
    listed = gradient_descent.create_hash_optimizer(0.1)
    other = gradient_descent.create_hash_optimizer(0.1)
    table = create_table(tf.int64, 4, "t", tf.zeros_initializer(), device_vocabulary_size=8,
                         optimizer_list=[listed])
    emb = sparse_lookup(table, tf.constant([1], tf.int64))
    grads = tf.gradients(tf.reduce_sum(emb), [table.variable])
    listed.apply_gradients(zip(grads, [table.variable]))
    with pytest.raises(ValueError, match="does not list it"):
        other.apply_gradients(zip(grads, [table.variable]))
    with pytest.raises(TypeError, match="optimizer_list"):
        create_table(tf.int64, 4, "u", tf.zeros_initializer(), optimizer_list=["sgd"])


def _spec_dataset(specs, batch_size=None):
    features = {"user": np.array([[1, 2], [2, 3], [5, 5], [7, 1]], np.int64)}
    dataset = tf.data.Dataset.from_tensor_slices(features).batch(batch_size or 2)
    return dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))


def test_feature_spec_multi_lookup(make_session):
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, 3, "user_table", _v1.truncated_normal_initializer(seed=1),
                         device_vocabulary_size=20)
    specs = [FeatureSpec("user", table_name="user_table") for _ in range(3)]
    # One batch of all 8 IDs: how far the pipeline plans ahead cannot change the counts.
    batch = _v1.data.make_one_shot_iterator(_spec_dataset(specs, batch_size=4)).get_next()
    embs = [sparse_lookup(table, spec, batch=batch, name="user_table_lookup", is_grad=i == 0)
            for i, spec in enumerate(specs)]
    first, second, third = make_session().run(embs)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, third)
    assert table.stats()["ids_seen"] == 3 * 8  # each lookup counts its IDs, as in mx_rec


def test_insert_func_checks():
    init()
    create_table(tf.int64, 3, "user_table", tf.zeros_initializer(), device_vocabulary_size=20)
    spec = FeatureSpec("user", table_name="user_table")
    with pytest.raises(ValueError, match="listed twice"):
        get_asc_insert_func(tgt_key_specs=[spec, spec])
    with pytest.raises(NotImplementedError, match="table_names"):
        get_asc_insert_func(table_names=["user_table"])
    with pytest.raises(TypeError, match="unexpected keyword"):
        get_asc_insert_func(tgt_key_specs=[spec], no_such=1)


def test_feature_spec_batch_size_is_checked(make_session):
    init()
    create_table(tf.int64, 3, "user_table", tf.zeros_initializer(), device_vocabulary_size=20)
    spec = FeatureSpec("user", table_name="user_table", batch_size=3, feat_count=2)
    batch = _v1.data.make_one_shot_iterator(_spec_dataset([spec])).get_next()
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch_size=3"):
        make_session().run(batch)


def test_dump_graph_writes_the_insert_function(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    init()
    create_table(tf.int64, 3, "user_table", tf.zeros_initializer(), device_vocabulary_size=20)
    dataset = tf.data.Dataset.from_tensor_slices({"user": np.ones([2, 2], np.int64)})
    dataset.map(get_asc_insert_func(tgt_key_specs=[FeatureSpec("user", table_name="user_table")],
                                    dump_graph=True))
    assert os.path.exists(tmp_path / "export_graph" / "asc_insert_func_train.pbtxt")


def test_saver_writes_the_sparse_folder(tmp_path, make_session):
    init()
    table = create_table(tf.int64, 3, "user_table", tf.zeros_initializer(),
                         device_vocabulary_size=20)
    emb = sparse_lookup(table, tf.constant([5, 6], tf.int64))
    sess = make_session()
    sess.run(emb)
    _v1.train.Saver().save(sess, str(tmp_path / "saved-model" / "model-0"), global_step=7)
    keys_file = tmp_path / "saved-model" / "sparse-model-0-7" / "user_table" / "keys"
    keys = tf.io.parse_tensor(tf.io.read_file(str(keys_file)), tf.int64)
    assert sorted(sess.run(keys).tolist()) == [5, 6]


def test_dynamic_expansion_refusals_cite_the_documentation():
    init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match="on-chip"):
        create_table(tf.int64, 3, "t", tf.zeros_initializer(), host_vocabulary_size=10)
    table = create_table(tf.int64, 3, "t", tf.zeros_initializer())
    with pytest.raises(ValueError, match="does not support feature eviction"):
        sparse_lookup(table, tf.constant([1], tf.int64),
                      access_and_evict_config=dict(access_threshold=1, eviction_threshold=5))


def _dynamic_run(path, steps=3):
    """Trains a dynamic table three steps through `path`; returns {id: row}."""
    tf.compat.v1.reset_default_graph()
    init(use_dynamic_expansion=True, prefetch_batch_number=2)
    table = create_table(tf.int64, 3, "user_table", tf.constant_initializer(0.1),
                         device_vocabulary_size=16)
    data = {"user": np.array([[1, 2], [2, 3], [5, 5], [7, 1], [9, 2], [3, 3]], np.int64),
            "label": np.arange(6, dtype=np.float32)}
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(2)
    if path == "feature_spec":
        spec = FeatureSpec("user", table_name="user_table")
        dataset = dataset.map(get_asc_insert_func(tgt_key_specs=[spec]))
    batch = _v1.data.make_initializable_iterator(dataset)
    features = batch.get_next()
    ids = spec if path == "feature_spec" else features["user"]
    emb = sparse_lookup(table, ids, batch=features, modify_graph=path == "modify_graph")
    loss = tf.reduce_sum(tf.reduce_sum(emb, axis=[1, 2]) * features["label"])
    local = _v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = _v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    train = lazy_adam_by_addr.create_hash_optimizer_by_addr(0.1).apply_gradients(
        list(zip(tf.gradients(loss, local), addresses)))
    if path == "modify_graph":
        from mxrec.graph.modifier import get_initializer, modify_graph_and_start_emb_cache

        modify_graph_and_start_emb_cache()
        start = get_initializer(True)
    else:
        start = batch.initializer
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(start)
        for _ in range(steps):
            sess.run(train)
    from mxrec.core import dynamic

    ids, values = dynamic.export_values(table)
    initialize.terminate_config_initializer()
    return {int(i): v for i, v in zip(ids, values)}


def test_dynamic_expansion_through_every_lookup_path():
    direct = _dynamic_run("direct")
    for path in ("feature_spec", "modify_graph"):
        other = _dynamic_run(path)
        assert sorted(other) == sorted(direct)
        for key, value in direct.items():
            np.testing.assert_allclose(other[key], value, rtol=1e-6)


def test_acg_push_ops_hook_refuses_string_ops_it_cannot_move():
    from mxrec.graph.acg_push_ops import ACGPushOpsToDatasetHook

    init()
    table = create_table(tf.int64, 3, "t", tf.zeros_initializer(), device_vocabulary_size=20)
    dataset = tf.data.Dataset.from_tensor_slices({"a": ["1", "2"], "b": ["3", "4"]}).batch(2)
    features = _v1.data.make_initializable_iterator(dataset).get_next()
    sparse_lookup(table, tf.strings.to_number(features["a"], tf.int64), modify_graph=True)
    hook = ACGPushOpsToDatasetHook(dump_graph=False)
    hook.begin()
    assert [op.type for op in hook.pushed_ops] == ["StringToNumber"]
    tf.strings.to_number(features["b"], tf.int64)  # feeds no lookup: would stay in the step
    with pytest.raises(NotImplementedError, match="feeds no sparse_lookup"):
        hook.begin()


def test_restoring_the_current_state_keeps_planned_batches(tmp_path):
    """An evaluation graph restoring the checkpoint training just wrote (Estimator's
    train_and_evaluate) must not drop the batches training planned ahead; restoring any
    other state still drops them, and a step reading one says so."""
    from mxrec.graph.modifier import get_initializer, modify_graph_and_start_emb_cache

    init(prefetch_batch_number=2)
    table = create_table(tf.int64, 3, "t", tf.constant_initializer(0.5),
                         device_vocabulary_size=8, host_vocabulary_size=64)
    ids = np.arange(40, dtype=np.int64).reshape(10, 4)
    dataset = tf.data.Dataset.from_tensor_slices(ids).batch(1)
    batch = _v1.data.make_initializable_iterator(dataset).get_next()
    emb = sparse_lookup(table, batch, modify_graph=True)
    _, sparse_vars = get_dense_and_sparse_variable()
    train = gradient_descent.create_hash_optimizer(0.1).apply_gradients(
        zip(tf.gradients(tf.reduce_sum(emb), sparse_vars), sparse_vars))
    modify_graph_and_start_emb_cache()
    saver = _v1.train.Saver()
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(get_initializer(True))
        sess.run(train)
        first = saver.save(sess, str(tmp_path / "m"), global_step=1)
        saver.restore(sess, first)  # the state as it is: planned batches stay
        sess.run(train)
        sess.run(train)
        # The restore below must find the pipeline's two batches pending (a batch planned
        # after it would be valid).
        wait_for_planned_batches(table, 2)
        saver.restore(sess, first)  # an older state: planned batches are dropped
        with pytest.raises(tf.errors.InvalidArgumentError, match="planned before the table"):
            sess.run(train)

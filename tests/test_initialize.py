"""init(): validation, environment, getters and the lifetime of tables."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.util import initialize
from mxrec.util.initialize import MxrecConfig, init, terminate_config_initializer


def test_defaults():
    runtime = init()
    config = runtime.config
    assert isinstance(config, MxrecConfig)
    assert config.use_mpi is False
    assert (config.rank_id, config.rank_size) == (0, 1)
    assert config.train_steps == config.eval_steps == config.save_steps == config.max_steps == -1
    assert 1 <= config.key_process_thread_num <= 64
    assert initialize.is_initialized()
    assert initialize.get_config_initializer() is runtime


def test_getters(engine):
    init(rank_id=0, rank_size=1, train_steps=10, eval_steps=5, save_steps=3, max_steps=100,
         prefetch_batch_number=2, use_dynamic=False, use_dynamic_expansion=True,
         key_process_thread_num=3, if_load=True)
    assert initialize.get_rank_id() == 0
    assert initialize.get_rank_size() == 1
    assert initialize.get_train_steps() == 10
    assert initialize.get_eval_steps() == 5
    assert initialize.get_save_steps() == 3
    assert initialize.get_max_steps() == 100
    assert initialize.get_prefetch_batch_number() == 2
    assert initialize.get_use_dynamic() is False
    assert initialize.get_use_dynamic_expansion() is True
    assert engine.num_threads() == 3
    # mx_rec's spelling: ConfigInitializer.get_instance().if_load.
    assert initialize.ConfigInitializer.get_instance().if_load is True


def test_getters_before_init_raise():
    assert not initialize.is_initialized()
    with pytest.raises(RuntimeError, match="init"):
        initialize.get_rank_id()
    with pytest.raises(RuntimeError, match="init"):
        initialize.get_config_initializer()
    init()
    terminate_config_initializer()
    assert not initialize.is_initialized()
    with pytest.raises(RuntimeError):
        initialize.get_train_steps()
    terminate_config_initializer()  # a second terminate is harmless


def test_unknown_setting():
    with pytest.raises(TypeError, match="no_such_setting"):
        init(no_such_setting=1)


@pytest.mark.parametrize("name,value", [
    ("rank_id", "0"), ("rank_size", 1.0), ("train_steps", 1.5), ("prefetch_batch_number", None),
    ("use_dynamic", 1), ("use_dynamic_expansion", "yes"), ("if_load", 0),
    ("key_process_thread_num", True), ("restore_model_version", "3"),
    ("save_checkpoint_due_time", 2.0),
])
def test_wrong_type(name, value):
    with pytest.raises(TypeError, match=name):
        init(**{name: value})
    assert not initialize.is_initialized()


@pytest.mark.parametrize("kwargs,name", [
    (dict(rank_id=1), "rank_id"),
    (dict(rank_id=3, rank_size=3), "rank_id"),
    (dict(rank_id=-1), "rank_id"),
    (dict(rank_size=0), "rank_size"),
    (dict(prefetch_batch_number=-1), "prefetch_batch_number"),
    (dict(prefetch_batch_number=65), "prefetch_batch_number"),
    (dict(train_steps=0), "train_steps"),
    (dict(train_steps=-2), "train_steps"),
    (dict(eval_steps=0), "eval_steps"),
    (dict(save_steps=0), "save_steps"),
    (dict(max_steps=-5), "max_steps"),
    (dict(key_process_thread_num=0), "key_process_thread_num"),
    (dict(key_process_thread_num=65), "key_process_thread_num"),
    (dict(save_checkpoint_due_time=-1), "save_checkpoint_due_time"),
    (dict(is_incremental_checkpoint=True), "save_delta_checkpoints_secs"),
])
def test_out_of_range(kwargs, name):
    with pytest.raises(ValueError, match=name):
        init(**kwargs)
    assert not initialize.is_initialized()


@pytest.mark.parametrize("kwargs", [
    dict(prefetch_batch_number=0), dict(prefetch_batch_number=64), dict(rank_id=0, rank_size=1),
    dict(use_mpi=False), dict(bind_cpu=False), dict(use_lccl=False), dict(use_hot=False),
    dict(recent_key_count_threshold=0),
    dict(train_steps=1, eval_steps=-1), dict(key_process_thread_num=1),
    dict(key_process_thread_num=64), dict(restore_model_version=7),
    dict(is_incremental_checkpoint=True, save_delta_checkpoints_secs=10),
])
def test_boundaries_accepted(kwargs):
    config = init(**kwargs).config
    for name, value in kwargs.items():
        assert getattr(config, name) == value


def test_multi_worker_settings_need_a_launcher(monkeypatch):
    """Several ranks need their addresses: without a launcher's environment, init() says
    how to start them (the multi-worker tests start real ranks: test_multiworker.py)."""
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="mxrec.launch.*mpirun"):
        init(use_mpi=True)
    monkeypatch.setenv("MXREC_CLUSTER", "127.0.0.1:1")
    with pytest.raises(ValueError, match="MXREC_CLUSTER lists 1 addresses for rank_size 2"):
        init(rank_id=0, rank_size=2)
    with pytest.raises(ValueError, match="MXREC_CLUSTER lists 1 addresses"):
        init(rank_id=0, rank_size=2, use_dynamic_expansion=True)
    assert not initialize.is_initialized()


def test_ranks_come_from_the_launchers_environment(monkeypatch):
    from mxrec.distributed import communication

    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert communication.ranks_from_environment(True, 0, 1) == (1, 3)
    monkeypatch.setenv("MXREC_RANK", "2")
    monkeypatch.setenv("MXREC_SIZE", "4")
    assert communication.ranks_from_environment(False, 0, 1) == (2, 4)
    monkeypatch.setenv("MXREC_SIZE", "four")
    with pytest.raises(ValueError, match="MXREC_RANK/MXREC_SIZE must be integers"):
        communication.ranks_from_environment(False, 0, 1)


@pytest.mark.parametrize("kwargs,name", [
    (dict(bind_cpu=True), "bind_cpu"),
    (dict(use_lccl=True), "use_lccl"),
    (dict(recent_key_count_threshold=5), "recent_key_count_threshold"),
])
def test_unavailable_settings_are_refused(kwargs, name):
    with pytest.raises(NotImplementedError, match=name):
        init(**kwargs)
    assert not initialize.is_initialized()


def test_use_hot_is_a_hint_that_warns():
    with pytest.warns(UserWarning, match="use_hot"):
        init(use_hot=True)
    assert initialize.is_initialized()


def test_config_dataclass_checks_itself():
    with pytest.raises(ValueError, match="rank_id"):
        MxrecConfig(rank_id=4, rank_size=2)
    names = {f.name for f in dataclasses.fields(MxrecConfig)}
    assert {"train_steps", "prefetch_batch_number", "key_process_thread_num"} <= names


def test_thread_env_var(monkeypatch, engine):
    monkeypatch.setenv("KEY_PROCESS_THREAD_NUM", "3")
    assert init().config.key_process_thread_num == 3
    assert engine.num_threads() == 3
    # An explicit setting wins over the environment.
    assert init(key_process_thread_num=2).config.key_process_thread_num == 2
    assert engine.num_threads() == 2


@pytest.mark.parametrize("raw", ["0", "65", "-1", "four", "2.5"])
def test_thread_env_var_invalid(monkeypatch, raw):
    monkeypatch.setenv("KEY_PROCESS_THREAD_NUM", raw)
    with pytest.raises(ValueError, match="KEY_PROCESS_THREAD_NUM"):
        init()


def _lookup_rows(ids):
    table = create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer(),
                         device_vocabulary_size=8)
    emb = sparse_lookup(table, tf.constant(ids, tf.int64))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(emb)
    return table


def test_terminate_then_init_gives_fresh_tables(engine):
    init()
    first = _lookup_rows([10, 20, 30])
    assert first.stats()["rows_in_use"] == 3
    terminate_config_initializer()
    assert first.table_key not in engine.table_keys()
    with pytest.raises(RuntimeError):
        create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer(),
                     device_vocabulary_size=8)
    tf.compat.v1.reset_default_graph()
    init()
    second = _lookup_rows([30, 40])
    assert second.stats()["rows_in_use"] == 2
    ids, rows = second.export_rows()
    np.testing.assert_array_equal(ids, [30, 40])
    np.testing.assert_array_equal(rows, [0, 1])


def test_init_again_replaces_the_previous_tables(engine):
    init()
    first = _lookup_rows([1, 2])
    tf.compat.v1.reset_default_graph()
    init()
    assert first.table_key not in engine.table_keys()
    second = _lookup_rows([2])
    np.testing.assert_array_equal(second.export_rows()[0], [2])


def test_failed_init_keeps_the_current_one(engine):
    runtime = init()
    table = _lookup_rows([5, 6])
    with pytest.raises(ValueError):
        init(rank_id=9)
    assert initialize.get_config_initializer() is runtime
    assert table.stats()["rows_in_use"] == 2
    np.testing.assert_array_equal(table.export_rows()[0], [5, 6])

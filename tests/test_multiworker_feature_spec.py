"""The FeatureSpec path and replicated tables (is_dp=True) on several ranks, against one
process on the global batch (examples/multiworker/train.py, within 1e-5): the FeatureSpec
path (`get_asc_insert_func` maps each rank's dataset, `sparse_lookup(table, spec,
batch=...)` plans it in the step like a lookup of tensor IDs), a replicated table through
the graph modifier (planned ahead, prefetch 2) and through the FeatureSpec path. Every run
trains until the data ends, with admission and an evaluation stream; the errors of the
FeatureSpec path on several ranks are built as rank 0 of 2 without a server."""

import numpy as np
import pytest
import tensorflow as tf
from test_multiworker import (
    _assert_equal_to_one_process,
    _assert_same_steps_and_evaluation,
    _replicas,
    _shards,
    _train,
)

from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func, planned_tensors
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.distributed import communication
from mxrec.util.initialize import init, terminate_config_initializer

COMMON = ["--steps", "12", "--threshold", "2", "--eval_every", "4"]
# (ranks, the run's arguments, the one-process reference's beyond COMMON)
CASES = {
    "feature_spec-2-adagrad": (2, ["--feature_spec", "--optimizer", "adagrad"],
                               ["--feature_spec", "--optimizer", "adagrad"]),
    "is_dp-2-modify_graph-prefetch2-lazy_adam": (
        2, ["--is_dp", "--modify_graph", "--prefetch", "2", "--optimizer", "lazy_adam"],
        ["--optimizer", "lazy_adam"]),
    "is_dp-2-feature_spec-sgd": (2, ["--is_dp", "--feature_spec", "--optimizer", "sgd"],
                                 ["--optimizer", "sgd"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ranks_equal_one_process(tmp_path, case):
    ranks, args, reference = CASES[case]
    single = _train(1, tmp_path / "one", COMMON + reference)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    several = _train(ranks, tmp_path / "many", COMMON + args)
    assert several.returncode == 0, several.stdout[-3000:] + several.stderr[-3000:]
    if "--is_dp" in args:  # every rank holds the whole table, bitwise the same
        want, (want_w,) = _shards(tmp_path / "one", 1)
        got, got_w = _replicas(tmp_path / "many", ranks)
        assert sorted(got) == sorted(want) and len(want) > 50
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=str(key))
        for w in got_w:
            np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-5)
    else:
        _assert_equal_to_one_process(tmp_path / "one", tmp_path / "many", ranks)
    _assert_same_steps_and_evaluation(tmp_path / "one", tmp_path / "many", ranks, 12,
                                      evaluations=3)


def test_feature_spec_on_one_process_equals_tensor_ids(tmp_path):
    """The reference of the FeatureSpec case: in one process the FeatureSpec path (planned
    in the dataset) and tensor IDs (planned in the step) train the same, bit for bit."""
    for path in ("direct", "spec"):
        extra = ["--feature_spec"] if path == "spec" else []
        done = _train(1, tmp_path / path, COMMON + extra)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    direct, spec = (np.load(tmp_path / p / "rank-0.npz") for p in ("direct", "spec"))
    for field in ("ids", "values", "w", "eval", "trained"):
        np.testing.assert_array_equal(spec[field], direct[field], err_msg=field)


@pytest.fixture
def two_ranks(monkeypatch):
    """A graph built as rank 0 of 2 (no server: nothing runs)."""
    monkeypatch.setattr(communication, "_CLUSTER",
                        communication.Cluster(rank=0, size=2, addresses=["a:1", "b:2"]))
    with tf.Graph().as_default():
        init(rank_id=0, rank_size=2)
        try:
            table = create_table(tf.int64, 4, "user_table", tf.compat.v1.zeros_initializer(),
                                 device_vocabulary_size=16)
            yield table
        finally:
            terminate_config_initializer()


def _batch(specs, is_training):
    dataset = tf.data.Dataset.from_tensors({"user_ids": tf.constant([[1, 2]], tf.int64),
                                            "time": tf.constant([5], tf.int64)})
    dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=is_training))
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def test_feature_spec_lookup_on_ranks_is_built(two_ranks):
    """The insert function checks and marks the batch (no plan in the dataset); the lookup
    builds the sharded planner's exchange in the step."""
    spec = FeatureSpec("user_ids", table_name="user_table")
    batch = _batch([spec, FeatureSpec("time", is_timestamp=True)], True)
    assert spec.checked_key(True) in batch and spec.time_key in batch
    assert spec.rows_key not in batch
    emb = sparse_lookup(two_ranks, spec, batch=batch, name="user_lookup")
    assert emb.shape.as_list() == [1, 2, 4]
    graph = tf.compat.v1.get_default_graph()
    kinds = {op.type for op in graph.get_operations()}
    # The key stage, after the exchange's agreement all-reduce (the all-to-alls sit in the
    # chunk ladder's functions).
    assert {"MxrecKeyStage", "CollectiveReduce"} <= kinds, kinds


def test_feature_spec_mode_must_agree_on_ranks(two_ranks):
    spec = FeatureSpec("user_ids", table_name="user_table")
    batch = _batch([spec], False)
    with pytest.raises(ValueError) as error:
        sparse_lookup(two_ranks, spec, batch=batch, is_train=True)
    message = str(error.value)
    assert "'user_ids'" in message and "is_training=False" in message
    assert "is_train=True" in message and "on 2 ranks" in message


def test_feature_spec_batch_not_mapped_on_ranks(two_ranks):
    spec = FeatureSpec("user_ids", table_name="user_table")
    batch = {"user_ids": tf.constant([[1, 2]], tf.int64)}
    with pytest.raises(ValueError, match="not mapped by get_asc_insert_func"):
        sparse_lookup(two_ranks, spec, batch=batch)


def test_planned_tensors_on_ranks_says_the_lookup_plans(two_ranks):
    del two_ranks
    spec = FeatureSpec("user_ids", table_name="user_table")
    batch = _batch([spec], True)
    with pytest.raises(ValueError) as error:
        planned_tensors(batch, spec)
    assert "on 2 ranks" in str(error.value) and "sparse_lookup(table, spec" in str(error.value)


def test_graph_modifier_lookup_of_a_replicated_table_is_recorded(two_ranks):
    """modify_graph=True on an is_dp=True table: recorded with the replicated route, so the
    graph modifier plans it ahead as a sharded lookup."""
    from mxrec.core.planners import modify_graph_lookups
    from mxrec.distributed import replicated

    del two_ranks
    table = create_table(tf.int64, 4, "dp_table", tf.compat.v1.zeros_initializer(),
                         device_vocabulary_size=16, is_dp=True)
    emb = sparse_lookup(table, tf.constant([[1, 2]], tf.int64), modify_graph=True)
    assert emb.shape.as_list() == [1, 2, 4]
    (record,) = modify_graph_lookups(tf.compat.v1.get_default_graph())
    assert record.sharded.router is replicated.route

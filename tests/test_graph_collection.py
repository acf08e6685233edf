"""Graphs mxrec built in are freed once dropped (an Estimator builds one per train/evaluate).

Each case builds a model in a fresh graph again and again (a table, lookups, gradients,
a hash optimizer, one training step where one process can run it), drops the graph, and
counts with `weakref` which graphs `gc` cannot free: at most the latest (init()'s `tables`
holds the latest table of each name, and a table holds its graph), none once
`terminate_config_initializer()` released the tables. Plain TensorFlow frees every graph;
before mxrec kept per-graph state in the graph itself, every graph stayed alive.
"""

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

from mxrec.constants.constants import ASCEND_SPARSE_LOOKUP_ID_OFFSET, ASCEND_SPARSE_LOOKUP_LOCAL_EMB
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.distributed import communication
from mxrec.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
from mxrec.optimizers import adagrad, adagrad_by_addr
from mxrec.saver.checkpoint import save_persistables
from mxrec.util.initialize import init, terminate_config_initializer

_v1 = tf.compat.v1
GRAPHS = 6
DIM = 4


def _alive(refs):
    gc.collect()
    return sum(ref() is not None for ref in refs)


def _train_op(table, emb, dynamic=False):
    loss = tf.reduce_sum(tf.square(emb))
    if dynamic:
        sparse_in = _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        sparse_vars = _v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        optimizer = adagrad_by_addr.create_hash_optimizer_by_address(0.1)
    else:
        sparse_in = sparse_vars = [table.variable]
        optimizer = adagrad.create_hash_optimizer(0.1)
    grads = tf.gradients(loss, sparse_in)
    return optimizer.apply_gradients(list(zip(grads, sparse_vars)))


def _direct(settings, table_args, modify_graph=False, run=True, save_to=None):
    """One graph: a table, a lookup (placeholder or dataset IDs), its training step."""
    graph = tf.Graph()
    with graph.as_default():
        table = create_table(tf.int64, DIM, "t", _v1.random_normal_initializer(),
                             **table_args)
        if modify_graph:
            data = tf.data.Dataset.from_tensor_slices(
                np.arange(24, dtype=np.int64).reshape(6, 4)).repeat()
            iterator = _v1.data.make_initializable_iterator(data)
            ids, feed = iterator.get_next(), {}
        else:
            ids = _v1.placeholder(tf.int64, [None, 4])
            feed = {ids: np.arange(8, dtype=np.int64).reshape(2, 4)}
        emb = sparse_lookup(table, ids, modify_graph=modify_graph)
        train = _train_op(table, emb, dynamic=settings.get("use_dynamic_expansion", False))
        if modify_graph:
            modify_graph_and_start_emb_cache()
        if run:
            with _v1.Session() as sess:
                sess.run([_v1.global_variables_initializer(), _v1.local_variables_initializer()])
                if modify_graph:
                    sess.run(get_initializer(True))
                sess.run(train, feed)
                if save_to is not None:  # one default Saver per graph and directory
                    save_persistables(sess, save_to, mode=0, step=1)
    return weakref.ref(graph)


CASES = {
    "device-only": ({}, dict(device_vocabulary_size=64), {}),
    "device-only-modify_graph": ({}, dict(device_vocabulary_size=64), dict(modify_graph=True)),
    "host-tier": ({}, dict(device_vocabulary_size=16, host_vocabulary_size=64), {}),
    "dynamic-expansion": (dict(use_dynamic_expansion=True), dict(device_vocabulary_size=64), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dropped_graphs_are_freed(case):
    settings, table_args, lookup_args = CASES[case]
    init(**settings)
    refs = [_direct(settings, table_args, **lookup_args) for _ in range(GRAPHS)]
    assert _alive(refs) <= 1, f"{_alive(refs)} of {GRAPHS} dropped graphs alive"
    terminate_config_initializer()
    assert _alive(refs) == 0


def test_graphs_saved_by_save_persistables_are_freed(tmp_path):
    init()
    refs = [_direct({}, dict(device_vocabulary_size=64), save_to=str(tmp_path / f"ckpt{i}"))
            for i in range(GRAPHS)]
    assert _alive(refs) <= 1, f"{_alive(refs)} of {GRAPHS} dropped graphs alive"
    terminate_config_initializer()
    assert _alive(refs) == 0


@pytest.mark.parametrize("is_dp", [False, True], ids=["sharded", "replicated"])
def test_dropped_graphs_of_several_ranks_are_freed(monkeypatch, is_dp):
    """Sharded and replicated tables, built as rank 0 of 2 (a cluster without a server: the
    graphs are built, not run), with TF's Saver over them (ShardedTableSaveable)."""
    monkeypatch.setattr(communication, "_CLUSTER",
                        communication.Cluster(rank=0, size=2, addresses=["a:1", "b:2"]))
    init(rank_id=0, rank_size=2, use_dynamic=True)
    refs = []
    for _ in range(GRAPHS):
        graph = tf.Graph()
        with graph.as_default():
            table = create_table(tf.int64, DIM, "t", _v1.random_normal_initializer(),
                                 device_vocabulary_size=64, is_dp=is_dp)
            ids = _v1.placeholder(tf.int64, [None, 4])
            _train_op(table, sparse_lookup(table, ids))
            if not is_dp:
                _v1.train.Saver()
        refs.append(weakref.ref(graph))
        del graph, table, ids
    assert _alive(refs) <= 1, f"{_alive(refs)} of {GRAPHS} dropped graphs alive"
    terminate_config_initializer()
    assert _alive(refs) == 0


def test_plain_tensorflow_frees_its_graphs():
    """The reference: the same count for graphs without mxrec."""
    refs = []
    for _ in range(GRAPHS):
        graph = tf.Graph()
        with graph.as_default():
            x = _v1.get_variable("x", [4, DIM])
            _v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(tf.gather(x, [1, 2])))
        refs.append(weakref.ref(graph))
        del graph, x
    assert _alive(refs) == 0

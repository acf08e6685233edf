"""A table looked up once per step has one gradient index per row already (the key stage's
unique rows): the hash optimizers update it without TF's duplicate sum (Unique +
UnsortedSegmentSum), bit for bit as with it. Two lookups of a table, or padded rows, are
summed as TF does."""

import numpy as np
import pytest
import tensorflow as tf
from test_optimizers import OPTIMIZERS, MxrecRun, _stream

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import adagrad, base
from mxrec.util.initialize import init

_v1 = tf.compat.v1


def _update_ops(graph, table_name):
    """Types of the ops that the hash optimizer built to update `table_name`."""
    return {op.type for op in graph.get_operations()
            if f"update_{table_name}/" in op.name or f"update_{table_name}_" in op.name}


def _train(opt_name, batches):
    """(the graph's update op types of table_a and table_c, losses, every table and slot
    value) after training `batches`."""
    run = MxrecRun(opt_name)
    ops = (_update_ops(run.graph, "table_a"), _update_ops(run.graph, "table_c"))
    losses = [run.step(batch) for batch in batches]
    values = {"table_a": run.table(run.ta), "table_c": run.table(run.tc)}
    for (table, slot), variable in run.slots.items():
        values[(table.table_name, slot)] = run.sess.run(variable)
    run.sess.close()
    return ops, losses, values


@pytest.mark.parametrize("opt_name", [name for name in OPTIMIZERS if name != "sgd"])
def test_one_lookup_skips_the_duplicate_sum_and_changes_no_bit(opt_name, monkeypatch):
    batches, _, _ = _stream(seed=11, steps=12)
    (ops_a, ops_c), losses, values = _train(opt_name, batches)
    # table_c has one lookup per step, table_a two (features a and b): concatenated indices.
    assert "Unique" not in ops_c
    assert "Unique" in ops_a
    monkeypatch.setattr(base, "distinct_indices", lambda indices: False)
    (_, summed_ops_c), summed_losses, summed_values = _train(opt_name, batches)
    assert "Unique" in summed_ops_c
    assert losses == summed_losses
    assert values.keys() == summed_values.keys() and len(values) > 2
    for name, value in values.items():
        np.testing.assert_array_equal(value, summed_values[name], err_msg=str(name))


def test_padded_rows_are_summed():
    """Static shapes pad the unique rows with the padding row, repeated: TF's sum stays."""
    with tf.Graph().as_default() as graph:
        init(use_dynamic=False)
        table = create_table(tf.int64, 4, "padded", _v1.zeros_initializer(),
                             device_vocabulary_size=32)
        ids = _v1.placeholder(tf.int64, [8])
        emb = sparse_lookup(table, ids, send_count=8)
        loss = tf.reduce_sum(emb)
        grad = tf.gradients(loss, [table.variable])
        adagrad.create_hash_optimizer(0.1).apply_gradients(zip(grad, [table.variable]))
        assert "Unique" in _update_ops(graph, "padded")


def test_indices_of_other_origin_are_not_distinct():
    with tf.Graph().as_default():
        assert not base.distinct_indices(tf.constant([1, 2, 3]))
        assert not base.distinct_indices(tf.reshape(_v1.placeholder(tf.int32, [None]), [-1]))

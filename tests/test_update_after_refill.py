"""A step's update of a table row runs after the step's refill of that row.

A lookup that hands rows to new IDs rewrites them first (the initializer, or a tiered
table's swap with the host tier) and reads them after. The optimizer's update of those rows
must run after the rewrite too, or the rewrite overwrites the update (a tiered table would
also send the updated row to its old owner on the host). The gradient orders the update
after the gather, and so after the refill, only where it depends on the rows' values: a
loss linear in the embeddings (`reduce_sum(emb)`, as several tests use) leaves the two
unordered, and the result then depends on scheduling. These tests check the order in the
graph, which holds or not whatever the scheduling of one run.
"""

import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import adagrad, gradient_descent, gradient_descent_by_addr, lazy_adam
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
DIM = 4
HASH_OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(0.1),
    "adagrad": lambda: adagrad.create_hash_optimizer(0.1),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(0.01),
}


def _ancestors(op: tf.Operation) -> set:
    """Every op `op` waits for: data inputs and control inputs, transitively."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def _assert_refills_precede(table, train_op):
    refills = table.refills(_v1.get_default_graph())
    assert refills, "the lookup built no refill: the test would check nothing"
    waits_for = _ancestors(train_op)
    for refill in refills:
        op = getattr(refill, "op", refill)  # a variable's scatter_update returns a variable
        assert op in waits_for, f"the update does not wait for {op.name}"


def _linear_loss_lookup(table, ids):
    # Linear in the rows: the gradient does not depend on the gathered values.
    return tf.reduce_sum(sparse_lookup(table, ids, name="lookup"))


@pytest.mark.parametrize("name", sorted(HASH_OPTIMIZERS))
def test_device_table_with_eviction(name):
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, DIM, "evicting", _v1.zeros_initializer(),
                         device_vocabulary_size=16)
    ids = _v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(sparse_lookup(
        table, ids, access_and_evict_config=dict(access_threshold=1, eviction_threshold=5)))
    _, sparse = get_dense_and_sparse_variable()
    train_op = HASH_OPTIMIZERS[name]().apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    _assert_refills_precede(table, train_op)


@pytest.mark.parametrize("name", sorted(HASH_OPTIMIZERS))
def test_tiered_table(name):
    init(prefetch_batch_number=0)
    table = create_table(tf.int64, DIM, "tiered", _v1.zeros_initializer(),
                         device_vocabulary_size=8, host_vocabulary_size=100)
    loss = _linear_loss_lookup(table, _v1.placeholder(tf.int64, [None]))
    _, sparse = get_dense_and_sparse_variable()
    train_op = HASH_OPTIMIZERS[name]().apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    _assert_refills_precede(table, train_op)


def test_dynamic_expansion_table_by_address():
    init(prefetch_batch_number=0, use_dynamic_expansion=True)
    table = create_table(tf.int64, DIM, "dynamic", _v1.zeros_initializer(),
                         device_vocabulary_size=16)
    loss = _linear_loss_lookup(table, _v1.placeholder(tf.int64, [None]))
    from mxrec.core import dynamic  # pylint: disable=import-outside-toplevel
    embs = _v1.get_collection(dynamic.LOCAL_EMB_COLLECTION)
    addresses = _v1.get_collection(dynamic.ID_OFFSET_COLLECTION)
    optimizer = gradient_descent_by_addr.create_hash_optimizer_by_address(0.1)
    train_op = optimizer.apply_gradients(list(zip(tf.gradients(loss, embs), addresses)))
    _assert_refills_precede(table, train_op)

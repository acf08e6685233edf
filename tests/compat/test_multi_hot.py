"""Multi-hot lookups (mxrec.core.multi_hot): SparseTensor and RaggedTensor IDs with combiners,
exact against tf.nn.safe_embedding_lookup_sparse on the table's own rows."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.export import saved_model as serving
from mxrec.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
from mxrec.optimizers import gradient_descent
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
DIM = 4
# Rows of IDs (-1: no ID at that position); row 2 is empty; IDs repeat across rows.
IDS = np.array([[11, 12, 13], [12, -1, -1], [-1, -1, -1], [40, 11, -1], [7, 7, 12]], np.int64)
WEIGHTS = np.array([[1.0, 0.5, 2.0], [3.0, 0, 0], [0, 0, 0], [0.0, 1.5, 0], [1.0, 0.25, -1.0]],
                   np.float32)  # 0 and -1 where an ID is present: TF prunes them unless "sum"


def _sparse(values):
    present = IDS >= 0
    return tf.SparseTensor(np.argwhere(present).astype(np.int64), values[present],
                           IDS.shape)


def _ragged(values):
    return tf.RaggedTensor.from_row_lengths(values[IDS >= 0], (IDS >= 0).sum(axis=1))


def _table():
    return create_table(tf.int64, DIM, "t", _v1.truncated_normal_initializer(seed=3),
                        device_vocabulary_size=64)


def _reference(sess, table, combiner, weights):
    """tf.nn.safe_embedding_lookup_sparse over the table's variable, IDs mapped to rows."""
    ids, rows = table.export_rows()
    row_of = dict(zip(ids.tolist(), rows.tolist()))
    params = sess.run(table.variable)
    present = IDS >= 0
    mapped = np.array([row_of.get(i, 0) for i in IDS[present]], np.int64)  # pruned -> any row
    with tf.Graph().as_default(), _v1.Session() as ref:
        sp_rows = tf.SparseTensor(np.argwhere(present).astype(np.int64), mapped, IDS.shape)
        sp_w = None if weights is None else tf.SparseTensor(
            np.argwhere(present).astype(np.int64), weights[present], IDS.shape)
        return ref.run(tf.nn.safe_embedding_lookup_sparse(
            tf.constant(params), sp_rows, sp_w, combiner=combiner))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kind", ["sparse", "ragged"])
def test_combiners_match_safe_embedding_lookup_sparse(make_session, combiner, weighted, kind):
    init(prefetch_batch_number=0)
    table = _table()
    to_ids = _sparse if kind == "sparse" else _ragged
    weights = to_ids(WEIGHTS) if weighted else None
    emb = sparse_lookup(table, to_ids(IDS), combiner=combiner, weights=weights)
    assert emb.shape.as_list() == [len(IDS), DIM]
    sess = make_session()
    got = sess.run(emb)
    want = _reference(sess, table, combiner, WEIGHTS if weighted else None)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.any(got[2])  # the empty row gives zeros
    if weighted:  # mean/sqrtn: IDs of weight <= 0 are neither looked up nor counted
        assert (40 in set(table.export_rows()[0].tolist())) == (combiner == "sum")


def test_ragged_without_combiner_and_dense_with_one(make_session):
    init(prefetch_batch_number=0)
    table = _table()
    ragged = sparse_lookup(table, _ragged(IDS))
    assert isinstance(ragged, tf.RaggedTensor) and ragged.shape.as_list() == [len(IDS), None,
                                                                              DIM]
    dense_ids = tf.constant([[11, 12], [13, 12]], tf.int64)
    dense_mean = sparse_lookup(table, dense_ids, combiner="mean")
    plain = sparse_lookup(table, dense_ids)
    assert dense_mean.shape.as_list() == [2, DIM]
    sess = make_session()
    got_ragged, got_mean, got_plain = sess.run([ragged, dense_mean, plain])
    np.testing.assert_allclose(got_mean, got_plain.mean(axis=1), rtol=1e-6)
    flat = sess.run(sparse_lookup(table, tf.constant(IDS[IDS >= 0]), is_train=False))
    np.testing.assert_allclose(got_ragged.flat_values, flat, rtol=1e-6)


def test_combiner_gradient_trains_the_rows(make_session):
    init(prefetch_batch_number=0)
    table = _table()
    emb = sparse_lookup(table, _sparse(IDS), combiner="sum", weights=_sparse(WEIGHTS))
    _, sparse_vars = get_dense_and_sparse_variable()
    loss = tf.reduce_sum(emb)
    train = gradient_descent.create_hash_optimizer(0.5).apply_gradients(
        zip(tf.gradients(loss, sparse_vars), sparse_vars))
    sess = make_session()
    before = sess.run(table.variable)
    sess.run(train)
    after = sess.run(table.variable)
    ids, rows = table.export_rows()
    # d loss / d row = the sum of the ID's weights over all rows; SGD subtracts 0.5 of it.
    present = IDS >= 0
    assert sorted(ids.tolist()) == sorted(set(IDS[present].tolist()))
    for key, row in zip(ids.tolist(), rows.tolist()):
        total = WEIGHTS[present & (IDS == key)].sum()  # "sum" keeps weights <= 0 too
        np.testing.assert_allclose(after[row], before[row] - 0.5 * total, rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_combiner_gradients_match_tf(make_session, combiner, weighted):
    """One SGD step through each combiner (mean and sqrtn prune weights <= 0) moves every row
    as TF's own gradient of tf.nn.safe_embedding_lookup_sparse over a plain variable does."""
    init(prefetch_batch_number=0)
    table = _table()
    weights = WEIGHTS if weighted else None
    emb = sparse_lookup(table, _sparse(IDS), combiner=combiner,
                        weights=_sparse(WEIGHTS) if weighted else None)
    scale = np.random.default_rng(5).normal(size=(len(IDS), DIM)).astype(np.float32)
    loss = tf.reduce_sum(emb * scale)
    _, sparse_vars = get_dense_and_sparse_variable()
    train = gradient_descent.create_hash_optimizer(1.0).apply_gradients(
        zip(tf.gradients(loss, sparse_vars), sparse_vars))
    sess = make_session()
    before = sess.run(table.variable)
    sess.run(train)
    after = sess.run(table.variable)
    ids, rows = table.export_rows()
    row_of = dict(zip(ids.tolist(), rows.tolist()))
    present = IDS >= 0
    kept = present if combiner == "sum" or not weighted else present & (WEIGHTS > 0)
    assert sorted(row_of) == sorted(set(IDS[kept].tolist()))
    with tf.Graph().as_default(), _v1.Session() as ref:
        variable = tf.Variable(before)
        index = np.argwhere(present).astype(np.int64)
        sp_rows = tf.SparseTensor(index, np.array([row_of.get(i, 0) for i in IDS[present]],
                                                  np.int64), IDS.shape)  # pruned: any row
        sp_w = None if weights is None else tf.SparseTensor(index, weights[present], IDS.shape)
        ref_loss = tf.reduce_sum(tf.nn.safe_embedding_lookup_sparse(
            variable, sp_rows, sp_w, combiner=combiner) * scale)
        step = _v1.train.GradientDescentOptimizer(1.0).minimize(ref_loss)
        ref.run(_v1.global_variables_initializer())
        ref.run(step)
        want = ref.run(variable)
    moved = {k for k, r in row_of.items() if not np.array_equal(want[r], before[r])}
    # Every looked-up ID has a gradient but 40 under weighted "sum" (its only weight is 0).
    assert moved == set(row_of) - ({40} if weighted and combiner == "sum" else set())
    # Not bit for bit (measured: at most 1 ulp): the hash optimizer sums a repeated ID's
    # gradients, then updates once; TF's scatter update subtracts each occurrence in turn.
    # Rows no ID holds stay as they were in both.
    np.testing.assert_allclose(after, want, rtol=1e-6, atol=1e-6)


def test_errors():
    init()
    table = _table()
    with pytest.raises(ValueError, match="needs a combiner"):
        sparse_lookup(table, _sparse(IDS))
    with pytest.raises(ValueError, match="combiner must be None or one of"):
        sparse_lookup(table, _ragged(IDS), combiner="max")
    with pytest.raises(ValueError, match="pass a combiner too"):
        sparse_lookup(table, _ragged(IDS), weights=_ragged(WEIGHTS))
    with pytest.raises(TypeError, match="weights of SparseTensor IDs"):
        sparse_lookup(table, _sparse(IDS), combiner="sum", weights=_ragged(WEIGHTS))


def _ragged_dataset():
    rows = [IDS[i][IDS[i] >= 0] for i in range(len(IDS))]
    ragged = tf.ragged.constant(rows, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices({"ids": ragged}).apply(
        tf.data.experimental.dense_to_ragged_batch(len(IDS)))


def test_graph_modifier_path(make_session):
    init(prefetch_batch_number=2)
    table = _table()
    iterator = _v1.data.make_initializable_iterator(_ragged_dataset().repeat(2))
    batch = iterator.get_next()
    emb = sparse_lookup(table, batch["ids"], combiner="mean", modify_graph=True)
    modify_graph_and_start_emb_cache()
    sess = make_session()
    sess.run(get_initializer(True))
    got = sess.run(emb)
    np.testing.assert_allclose(got, _reference(sess, table, "mean", None), rtol=1e-6, atol=1e-6)


def test_serving_export_combines_too(tmp_path, make_session):
    init(prefetch_batch_number=0)
    table = _table()
    emb = sparse_lookup(table, _sparse(IDS), combiner="sqrtn", weights=_sparse(WEIGHTS))
    sess = make_session()
    trained = sess.run(emb)
    ckpt = _v1.train.Saver().save(sess, str(tmp_path / "ckpt" / "model"))

    def build():
        ids = _v1.sparse_placeholder(tf.int64, name="ids")
        w_values = _v1.placeholder(tf.float32, [None], name="weights")
        weights = tf.SparseTensor(ids.indices, w_values, ids.dense_shape)
        serving_table = _table()
        out = sparse_lookup(serving_table, ids, combiner="sqrtn", weights=weights,
                            is_train=False)
        return ({"ids_indices": ids.indices, "ids_values": ids.values,
                 "ids_shape": ids.dense_shape, "w_values": w_values}, {"emb": out})

    export_dir = serving.export_saved_model(str(tmp_path / "export"), ckpt, build)
    present = IDS >= 0
    with tf.Graph().as_default(), _v1.Session() as served:
        meta = _v1.saved_model.loader.load(served, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        feeds = {signature.inputs["ids_indices"].name: np.argwhere(present),
                 signature.inputs["ids_values"].name: IDS[present],
                 signature.inputs["ids_shape"].name: np.array(IDS.shape, np.int64),
                 signature.inputs["w_values"].name: WEIGHTS[present]}
        got = served.run(signature.outputs["emb"].name, feeds)
    np.testing.assert_allclose(got, trained, rtol=1e-6, atol=1e-6)

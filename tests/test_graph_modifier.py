"""The graph modifier: rewritten training equals the direct path, IDs are counted once,
evaluation inserts nothing, and each unsupported graph has its error."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.graph.modifier import (
    GraphModifierHook,
    modify_graph_and_start_emb_cache,
    rewritten_tensor,
)
from mxrec.optimizers.lazy_adam import create_hash_optimizer
from mxrec.util.initialize import get_initializer, init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

BATCH = 8
NUM_BATCHES = 12
DIM = 4


def _data(seed=0, num_batches=NUM_BATCHES):
    rng = np.random.default_rng(seed)
    n = BATCH * num_batches
    ids = rng.integers(0, 40, size=(n, 3)).astype(np.int32)
    str_ids = rng.integers(1000, 1030, size=(n, 2)).astype(str).astype(object)
    labels = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    return {"ids": ids, "str_ids": str_ids}, labels


def _dataset(data):
    features, labels = data
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)


def _build_model(features, labels, modify_graph, is_train=True, tables=None):
    """Two tables; table "a" is looked up twice. IDs go through cast, slicing, to_number."""
    if tables is None:
        init_a = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1)
        init_b = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=2)
        tables = (create_table(tf.int64, DIM, "a", init_a, device_vocabulary_size=100),
                  create_table(tf.int64, DIM, "b", init_b, device_vocabulary_size=100))
    table_a, table_b = tables
    ids = tf.cast(features["ids"], tf.int64)
    str_ids = tf.reshape(tf.strings.to_number(features["str_ids"], out_type=tf.int64), [-1, 2])
    emb = [
        sparse_lookup(table_a, ids[:, :2], is_train=is_train, modify_graph=modify_graph,
                      name="a_first"),
        sparse_lookup(table_a, ids[:, 2:], is_train=is_train, modify_graph=modify_graph,
                      name="a_second"),
        sparse_lookup(table_b, str_ids, is_train=is_train, modify_graph=modify_graph,
                      name="b_lookup"),
    ]
    flat = tf.concat([tf.reshape(e, [-1, e.shape[1] * DIM]) for e in emb], axis=1)
    # get_variable rather than tf.compat.v1.layers, which TF 2.21 (Keras 3) lacks.
    kernel = tf.compat.v1.get_variable(
        "dense/kernel", [flat.shape[-1], 1],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
    bias = tf.compat.v1.get_variable("dense/bias", [1], initializer=tf.zeros_initializer())
    logits = tf.matmul(flat, kernel) + bias
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return tables, loss, tf.sigmoid(logits)


def _train_op(loss):
    dense, sparse = get_dense_and_sparse_variable()
    dense_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, var_list=dense)
    sparse_grads = tf.gradients(loss, sparse)
    sparse_op = create_hash_optimizer(learning_rate=0.01).apply_gradients(
        zip(sparse_grads, sparse))
    return tf.group(dense_op, sparse_op)


def _table_rows(sess, table):
    ids, rows = table.export_rows()
    values = sess.run(table.variable)
    return {int(i): values[r] for i, r in zip(ids, rows)}


def _train(modify_graph, prefetch=1, threads=1, one_shot=False, steps=NUM_BATCHES):
    """Trains the model on the same batches; returns per-ID table rows, dense weights, stats."""
    init(prefetch_batch_number=prefetch, key_process_thread_num=threads)
    tf.compat.v1.set_random_seed(7)
    dataset = _dataset(_data())
    if one_shot:
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    else:
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    features, labels = iterator.get_next()
    tables, loss, _ = _build_model(features, labels, modify_graph)
    train_op = _train_op(loss)
    if modify_graph:
        modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(get_initializer(True) if modify_graph else iterator.initializer)
        for _ in range(steps):
            sess.run(train_op)
        result = {t.table_name: _table_rows(sess, t) for t in tables}
        kernel = sess.run(tf.compat.v1.trainable_variables()[0])
    stats = {t.table_name: t.stats() for t in tables}
    return result, kernel, stats


@pytest.fixture(scope="module")
def reference():
    with tf.Graph().as_default():
        out = _train(modify_graph=False)
    terminate_config_initializer()
    return out


def _assert_same(got, want):
    """Bit for bit: the rewritten pipeline plans the same rows and the step runs the same ops,
    only earlier, so prefetch and threads change no float."""
    rows, kernel, _ = got
    want_rows, want_kernel, _ = want
    for name in want_rows:
        assert sorted(rows[name]) == sorted(want_rows[name]), name
        for key, value in want_rows[name].items():
            np.testing.assert_array_equal(rows[name][key], value, err_msg=f"{name}/{key}")
    np.testing.assert_array_equal(kernel, want_kernel)


@pytest.mark.parametrize("prefetch", [1, 2, 4])
@pytest.mark.parametrize("threads", [1, 2])
def test_rewrite_trains_like_direct_path(reference, prefetch, threads):
    _assert_same(_train(modify_graph=True, prefetch=prefetch, threads=threads), reference)


def test_rewrite_without_prefetch_and_one_shot(reference):
    _assert_same(_train(modify_graph=True, prefetch=0), reference)


def test_one_shot_iterator(reference):
    _assert_same(_train(modify_graph=True, prefetch=2, one_shot=True), reference)


def test_ids_counted_once_per_batch(reference):
    _, _, stats = _train(modify_graph=True, prefetch=2)
    fed = BATCH * NUM_BATCHES
    assert stats["a"]["ids_seen"] == fed * 3
    assert stats["b"]["ids_seen"] == fed * 2
    assert stats["a"]["ids_seen"] == reference[2]["a"]["ids_seen"]
    assert stats["a"]["train_batches"] == 2 * NUM_BATCHES


def test_eval_pipeline_inserts_nothing_and_unseen_ids_are_zero():
    init(prefetch_batch_number=2)
    train_ds = _dataset(_data(seed=0, num_batches=2))
    eval_features = {"ids": np.array([[1, 2, 3], [500, 501, 502]] * 4, np.int32),
                     "str_ids": np.array([["1000", "1001"], ["9998", "9999"]] * 4, object)}
    eval_ds = _dataset((eval_features, np.zeros([8, 1], np.float32)))
    train_it = tf.compat.v1.data.make_initializable_iterator(train_ds)
    eval_it = tf.compat.v1.data.make_initializable_iterator(eval_ds)
    features, labels = train_it.get_next()
    tables, loss, _ = _build_model(features, labels, modify_graph=True)
    train_op = _train_op(loss)
    eval_features_t, _ = eval_it.get_next()
    ids = tf.cast(eval_features_t["ids"], tf.int64)
    eval_emb = sparse_lookup(tables[0], ids, is_train=False, modify_graph=True, name="eval_a")
    modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(get_initializer(True))
        sess.run(train_op)
        sess.run(train_op)
        before = tables[0].stats()
        sess.run(get_initializer(False))
        emb = sess.run(eval_emb)
        after = tables[0].stats()
        known = _table_rows(sess, tables[0])
    assert after["ids_seen"] == before["ids_seen"]
    assert after["rows_in_use"] == before["rows_in_use"]
    assert after["eval_batches"] == before["eval_batches"] + 1
    np.testing.assert_array_equal(emb[1], np.zeros([3, DIM], np.float32))
    for col, key in enumerate([1, 2, 3]):
        want = known.get(key, np.zeros(DIM, np.float32))
        np.testing.assert_allclose(emb[0, col], want, atol=1e-6)


def _train_single_table(use_dynamic, send_count=None):
    init(prefetch_batch_number=1, use_dynamic=use_dynamic)
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    features, labels = iterator.get_next()
    init_a = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1)
    table = create_table(tf.int64, DIM, "a", init_a, device_vocabulary_size=100)
    ids = tf.cast(features["ids"], tf.int64)
    emb = sparse_lookup(table, ids, modify_graph=True, send_count=send_count)
    loss = tf.reduce_sum(emb * tf.reshape(labels, [-1, 1, 1]))
    grads = tf.gradients(loss, [table.variable])
    train_op = create_hash_optimizer(learning_rate=0.01).apply_gradients(
        zip(grads, [table.variable]))
    modify_graph_and_start_emb_cache()
    gather = [op for op in tf.compat.v1.get_default_graph().get_operations()
              if op.type == "ResourceGather"][0]
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(get_initializer(True))
        for _ in range(NUM_BATCHES):
            sess.run(train_op)
        return gather.inputs[1].shape.as_list(), sess.run(table.variable)


def test_static_shapes_pad_to_send_count():
    """Padded rows get no update: LazyAdam ends with the same table as without padding."""
    shape, padded = _train_single_table(use_dynamic=False, send_count=BATCH * 3)
    assert shape == [BATCH * 3]
    terminate_config_initializer()
    with tf.Graph().as_default():
        shape, dynamic = _train_single_table(use_dynamic=True)
    assert shape == [None]
    # Static shapes add one padding row at the end, which no ID ever gets.
    assert padded.shape[0] == dynamic.shape[0] + 1
    np.testing.assert_allclose(padded[:-1], dynamic, atol=1e-6)


def test_static_shapes_too_many_unique_ids():
    init(prefetch_batch_number=1, use_dynamic=False)
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    features, _ = iterator.get_next()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=100)
    emb = sparse_lookup(table, tf.cast(features["ids"], tf.int64), modify_graph=True,
                        send_count=2)
    modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(get_initializer(True))
        with pytest.raises(tf.errors.InvalidArgumentError, match="send_count=2"):
            sess.run(emb)


def test_static_shapes_need_send_count():
    init(use_dynamic=False)
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    features, _ = iterator.get_next()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=100)
    sparse_lookup(table, tf.cast(features["ids"], tf.int64), modify_graph=True)
    with pytest.raises(ValueError, match="send_count"):
        modify_graph_and_start_emb_cache()


def test_dump_graph(tmp_path):
    init()
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    features, labels = iterator.get_next()
    _build_model(features, labels, modify_graph=True)
    modify_graph_and_start_emb_cache(dump_graph=True, dump_dir=str(tmp_path))
    before = (tmp_path / "graph_before_modify.pbtxt").read_text()
    after = (tmp_path / "graph_after_modify.pbtxt").read_text()
    assert "MxrecKeyStage" in before and "PrefetchDataset" not in before
    assert "PrefetchDataset" in after


def test_gradients_built_after_rewrite_error():
    init()
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    features, labels = iterator.get_next()
    _, loss, _ = _build_model(features, labels, modify_graph=True)
    (rewritten,) = modify_graph_and_start_emb_cache()
    train_op = _train_op(loss)
    with pytest.raises(RuntimeError, match="before calling modify_graph_and_start_emb_cache"):
        get_initializer(True)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(rewritten.initializer)
        with pytest.raises(tf.errors.InvalidArgumentError, match="moved into the input pipeline"):
            sess.run(train_op)


def test_second_call_is_a_no_op():
    init()
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    features, labels = iterator.get_next()
    _build_model(features, labels, modify_graph=True)
    assert len(modify_graph_and_start_emb_cache()) == 1
    assert modify_graph_and_start_emb_cache() == []


# --- errors ---------------------------------------------------------------------------------


def test_ids_from_placeholder_error():
    init()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=10)
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="my_ids")
    sparse_lookup(table, ids, modify_graph=True)
    with pytest.raises(ValueError, match="Placeholder op 'my_ids'.*modify_graph=False"):
        modify_graph_and_start_emb_cache()


def test_ids_from_variable_error():
    init()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=10)
    var = tf.compat.v1.get_variable("ids_var", initializer=tf.constant([1, 2], tf.int64),
                                    use_resource=True)
    sparse_lookup(table, var.read_value() + 1, modify_graph=True)
    with pytest.raises(ValueError, match="cannot compute"):
        modify_graph_and_start_emb_cache()


def test_ids_from_constant_error():
    init()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=10)
    sparse_lookup(table, tf.constant([1, 2], tf.int64), modify_graph=True, name="const_lookup")
    with pytest.raises(ValueError, match="'const_lookup'.*do not come from a tf.data iterator"):
        modify_graph_and_start_emb_cache()


def test_ids_from_two_iterators_error():
    init()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=10)
    first = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.range(4).batch(2)).get_next()
    second = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.range(4).batch(2)).get_next()
    sparse_lookup(table, first + second, modify_graph=True)
    with pytest.raises(ValueError, match="several iterators"):
        modify_graph_and_start_emb_cache()


def test_reinitializable_iterator_error():
    init()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=10)
    dataset = tf.data.Dataset.range(4).batch(2)
    iterator = tf.compat.v1.data.Iterator.from_structure(
        tf.compat.v1.data.get_output_types(dataset), tf.compat.v1.data.get_output_shapes(dataset))
    iterator.make_initializer(dataset)
    iterator.make_initializer(dataset.skip(1))
    sparse_lookup(table, iterator.get_next(), modify_graph=True)
    with pytest.raises(ValueError, match="reinitializable iterator"):
        modify_graph_and_start_emb_cache()


def test_string_handle_iterator_error():
    init()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=10)
    dataset = tf.data.Dataset.range(4).batch(2)
    handle = tf.compat.v1.placeholder(tf.string, [])
    iterator = tf.compat.v1.data.Iterator.from_string_handle(
        handle, tf.compat.v1.data.get_output_types(dataset),
        tf.compat.v1.data.get_output_shapes(dataset))
    sparse_lookup(table, iterator.get_next(), modify_graph=True)
    with pytest.raises(ValueError, match="IteratorFromStringHandle.*not supported"):
        modify_graph_and_start_emb_cache()


def test_mixed_train_and_eval_on_one_iterator_error():
    init()
    table = create_table(tf.int64, DIM, "a", tf.zeros_initializer(), device_vocabulary_size=10)
    ids = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.range(4).batch(2)).get_next()
    sparse_lookup(table, ids, modify_graph=True, is_train=True)
    sparse_lookup(table, ids, modify_graph=True, is_train=False)
    with pytest.raises(ValueError, match="is_train=True and is_train=False"):
        modify_graph_and_start_emb_cache()


def test_get_initializer_before_rewrite_error():
    init()
    with pytest.raises(RuntimeError, match="modify_graph_and_start_emb_cache"):
        get_initializer(True)


def test_get_initializer_without_eval_iterator_error():
    init()
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    features, labels = iterator.get_next()
    _build_model(features, labels, modify_graph=True)
    modify_graph_and_start_emb_cache()
    assert get_initializer(True) is not None
    with pytest.raises(RuntimeError, match="evaluation"):
        get_initializer(False)


def test_hook_without_lookups_is_harmless():
    """A graph with direct lookups only: the hook changes nothing, adds no op, runs no
    initializer, and the user's own iterator works as before."""
    init()
    data = _data()
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(data))
    features, labels = iterator.get_next()
    _, _, probs = _build_model(features, labels, modify_graph=False)
    graph = tf.compat.v1.get_default_graph()
    ops_before = [(op.name, [t.name for t in op.inputs]) for op in graph.get_operations()]
    hook = GraphModifierHook()
    hook.begin()
    assert [(op.name, [t.name for t in op.inputs]) for op in graph.get_operations()] == \
        ops_before
    with pytest.raises(RuntimeError, match="no rewritten iterator"):
        get_initializer(True)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        hook.after_create_session(sess, None)
        with pytest.raises(tf.errors.FailedPreconditionError):
            sess.run(labels)   # the hook did not start the user's iterator
        sess.run(iterator.initializer)
        got, _ = sess.run([labels, probs])
    np.testing.assert_array_equal(got, data[1][:BATCH])


def test_configured_steps_disagreeing_with_the_run_do_not_hang():
    """Planning is in lock-step with consumption: train_steps/eval_steps cannot stall it."""
    init(prefetch_batch_number=2, train_steps=2, eval_steps=1)
    train_it = tf.compat.v1.data.make_initializable_iterator(_dataset(_data()))
    eval_it = tf.compat.v1.data.make_initializable_iterator(_dataset(_data(seed=1)))
    features, labels = train_it.get_next()
    tables, loss, _ = _build_model(features, labels, modify_graph=True)
    train_op = _train_op(loss)
    eval_features, eval_labels = eval_it.get_next()
    with tf.compat.v1.variable_scope("", reuse=True):
        _, eval_loss, _ = _build_model(eval_features, eval_labels, modify_graph=True,
                                       is_train=False, tables=tables)
    modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(get_initializer(True))
        for _ in range(5):
            sess.run(train_op)
        sess.run(get_initializer(False))
        for _ in range(3):
            sess.run(eval_loss)
        for _ in range(NUM_BATCHES - 5):
            sess.run(train_op)
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(train_op)


def test_fetching_an_old_get_next_output(make_session):
    """Labels fetched for a metric outside the graph: rewritten_tensor gives the step's own
    batch; the old tensor itself fails with an error that says so."""
    init(prefetch_batch_number=2)
    data = _data()
    iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(data))
    features, labels = iterator.get_next()
    _, loss, probs = _build_model(features, labels, modify_graph=True)
    train_op = _train_op(loss)
    modify_graph_and_start_emb_cache()
    fetched = rewritten_tensor({"labels": labels, "ids": features["ids"], "probs": probs})
    assert fetched["probs"] is probs   # not an iterator output: itself
    assert rewritten_tensor(labels) is fetched["labels"] is not labels
    sess = make_session()
    sess.run(get_initializer(True))
    for step in range(3):
        _, got = sess.run([train_op, fetched])
        rows = slice(step * BATCH, (step + 1) * BATCH)
        np.testing.assert_array_equal(got["labels"], data[1][rows])
        np.testing.assert_array_equal(got["ids"], data[0]["ids"][rows])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"{labels.op.name}.*{labels.name}.*rewritten_tensor"):
        sess.run(labels)
    with pytest.raises(TypeError, match="rewritten_tensor"):
        rewritten_tensor([labels, 3])

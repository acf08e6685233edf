"""create_table and sparse_lookup in TF1 graph mode."""

import numpy as np
import pytest
import tensorflow as tf
from reference import RefKeyStage, distinct_rows_initializer, initial_rows

from mxrec.core.embedding import create_table, sparse_lookup

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
DIM = 4
VOCAB = 32


def _table(key_dtype=tf.int64, name="t", capacity=VOCAB, **kwargs):
    return create_table(key_dtype, DIM, name, distinct_rows_initializer(),
                        device_vocabulary_size=capacity, **kwargs)


def _expected(table, variable_value, ids):
    """Rows of `ids` through export_rows: the NumPy view of a lookup."""
    exported_ids, rows = table.export_rows()
    row_of = dict(zip(exported_ids.tolist(), rows.tolist()))
    flat = [row_of.get(int(i)) for i in np.ravel(ids)]
    out = np.stack([variable_value[r] if r is not None else np.zeros(DIM, np.float32)
                    for r in flat]) if flat else np.zeros((0, DIM), np.float32)
    return out.reshape(np.shape(ids) + (DIM,))


@pytest.mark.parametrize("shape", [(6,), (3, 4), (2, 3, 2)])
def test_lookup_matches_table_rows(mx, make_session, shape):
    mx()
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, shape=[None] * len(shape))
    emb = sparse_lookup(table, ids)
    assert emb.shape.as_list() == [None] * len(shape) + [DIM]
    assert emb.dtype == tf.float32
    sess = make_session()
    init_values = initial_rows(sess, table)
    rng = np.random.default_rng(0)
    vocab = np.array([I64_MIN, I64_MAX, 0, -1, 17, 10**18], np.int64)
    ref = RefKeyStage(VOCAB)
    for _ in range(3):
        batch = vocab[rng.integers(0, len(vocab), size=shape)]
        got = sess.run(emb, {ids: batch})
        ref.process(batch.ravel())
        np.testing.assert_array_equal(got, _expected(table, init_values, batch))
        # New IDs take rows in order of first occurrence, so row r holds initial value r.
        exported = table.export_rows()
        np.testing.assert_array_equal(exported[0], ref.export()[0])
        np.testing.assert_array_equal(exported[1], ref.export()[1])
        np.testing.assert_array_equal(got.reshape(-1, DIM),
                                      init_values[[ref.rows[int(i)] for i in batch.ravel()]])
    assert table.variable.shape.as_list() == [VOCAB, DIM]


def test_repeated_ids_and_static_shape(mx, make_session):
    mx()
    table = _table()
    batch = np.array([[5, 5, 5], [9, 5, 9]], np.int64)
    emb = sparse_lookup(table, tf.constant(batch))
    assert emb.shape.as_list() == [2, 3, DIM]
    sess = make_session()
    init_values = initial_rows(sess, table)
    got = sess.run(emb)
    np.testing.assert_array_equal(got[0, 0], init_values[0])
    np.testing.assert_array_equal(got[1, 0], init_values[1])
    np.testing.assert_array_equal(got[:, :, :], init_values[[[0, 0, 0], [1, 0, 1]]])
    assert table.stats()["rows_in_use"] == 2
    assert table.stats()["ids_seen"] == 6


def test_int32_table_and_int32_extremes(mx, make_session):
    mx()
    table = _table(tf.int32)
    ids = tf.compat.v1.placeholder(tf.int32, shape=[None])
    emb = sparse_lookup(table, ids)
    batch = np.array([I32_MIN, I32_MAX, 0, -1, I32_MAX, I32_MIN], np.int32)
    sess = make_session()
    init_values = initial_rows(sess, table)
    got = sess.run(emb, {ids: batch})
    np.testing.assert_array_equal(got, init_values[[0, 1, 2, 3, 1, 0]])
    exported_ids, rows = table.export_rows()
    np.testing.assert_array_equal(exported_ids, [I32_MIN, I32_MAX, 0, -1])
    np.testing.assert_array_equal(rows, [0, 1, 2, 3])


def test_int32_ids_on_int64_table(mx, make_session):
    mx()
    table = _table(tf.int64)
    a = sparse_lookup(table, tf.constant([-1, 7], tf.int32))
    b = sparse_lookup(table, tf.constant([7, -1], tf.int64))
    got_a, got_b = make_session().run([a, b])
    # The same ID reaches the same row whatever the width of the ID tensor.
    np.testing.assert_array_equal(got_a, got_b[::-1])
    assert table.stats()["rows_in_use"] == 2


@pytest.mark.parametrize("shape", [(0,), (0, 3)])
def test_empty_batch(mx, make_session, shape):
    mx()
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, shape=[None] * len(shape))
    emb = sparse_lookup(table, ids)
    loss = tf.reduce_sum(emb)
    grad = tf.gradients(loss, table.variable)[0]
    sess = make_session()
    got, got_loss, got_grad = sess.run([emb, loss, grad], {ids: np.zeros(shape, np.int64)})
    assert got.shape == shape + (DIM,)
    assert got_loss == 0.0
    assert got_grad.values.shape == (0, DIM)
    assert table.stats()["rows_in_use"] == 0


def test_eval_lookup_does_not_insert(mx, make_session):
    mx()
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, shape=[None])
    train_emb = sparse_lookup(table, ids, is_train=True)
    eval_emb = sparse_lookup(table, ids, is_train=False, name="eval_lookup")
    sess = make_session()
    init_values = initial_rows(sess, table)
    sess.run(train_emb, {ids: [3, 4]})
    before = table.stats()
    got = sess.run(eval_emb, {ids: [4, 99, 3, -5, 99]})
    np.testing.assert_array_equal(
        got, np.stack([init_values[1], np.zeros(DIM), init_values[0], np.zeros(DIM),
                       np.zeros(DIM)]))
    after = table.stats()
    for name in ("rows_in_use", "ids_tracked", "ids_seen", "admitted", "train_batches"):
        assert after[name] == before[name], name
    assert after["eval_batches"] == before["eval_batches"] + 1
    np.testing.assert_array_equal(table.export_rows()[0], [3, 4])
    # 99 was looked up in evaluation only; in training it takes the next free row.
    np.testing.assert_array_equal(sess.run(train_emb, {ids: [99]}), init_values[[2]])


@pytest.mark.parametrize("batch", [[99, -5], [99], [[99], [7]]])
def test_eval_lookup_of_only_unseen_ids_is_zeros(mx, make_session, batch):
    """Every position takes the default value: the batch has no unique rows at all."""
    mx()
    table = _table()
    batch = np.array(batch, np.int64)
    ids = tf.compat.v1.placeholder(tf.int64, shape=[None] * batch.ndim)
    eval_emb = sparse_lookup(table, ids, is_train=False)
    got = make_session().run(eval_emb, {ids: batch})
    np.testing.assert_array_equal(got, np.zeros(batch.shape + (DIM,), np.float32))
    assert table.stats()["ids_tracked"] == 0


def test_two_lookups_share_one_table_deterministically(mx, make_session):
    mx()
    table = _table()
    a_ids = tf.compat.v1.placeholder(tf.int64, shape=[None])
    b_ids = tf.compat.v1.placeholder(tf.int64, shape=[None, 2])
    a = sparse_lookup(table, a_ids, name="first")
    b = sparse_lookup(table, b_ids, name="second")
    sess = make_session()
    init_values = initial_rows(sess, table)
    ref = RefKeyStage(VOCAB)
    rng = np.random.default_rng(5)
    for _ in range(10):
        a_batch = rng.integers(0, 12, size=3)
        b_batch = rng.integers(0, 12, size=(2, 2))
        got_a, got_b = sess.run([a, b], {a_ids: a_batch, b_ids: b_batch})
        # The first lookup plans before the second, every step.
        ref.process(a_batch)
        ref.process(b_batch.ravel())
        np.testing.assert_array_equal(got_a, init_values[[ref.rows[int(i)] for i in a_batch]])
        np.testing.assert_array_equal(
            got_b, init_values[[[ref.rows[int(i)] for i in r] for r in b_batch]])
    np.testing.assert_array_equal(table.export_rows()[0], ref.export()[0])
    assert table.stats()["train_batches"] == 20


def test_padding_keys_look_up_as_zeros(mx, make_session):
    mx()
    table = _table(padding_keys=[-1])
    emb = sparse_lookup(table, tf.constant([[-1, 8], [8, -1]], tf.int64))
    grad = tf.gradients(tf.reduce_sum(emb * 3.0), table.variable)[0]
    sess = make_session()
    init_values = initial_rows(sess, table)
    got, got_grad = sess.run([emb, grad])
    np.testing.assert_array_equal(got, [[np.zeros(DIM), init_values[0]],
                                        [init_values[0], np.zeros(DIM)]])
    # Only the real ID's row receives a gradient (summed over its two positions).
    np.testing.assert_array_equal(got_grad.indices, [0])
    np.testing.assert_array_equal(got_grad.values, np.full((1, DIM), 6.0))
    assert table.stats()["ids_seen"] == 2


def test_batch_of_only_padding_keys(mx, make_session):
    mx()
    table = _table(padding_keys=[0, -1])
    emb = sparse_lookup(table, tf.constant([[0, -1], [-1, -1]], tf.int64))
    grad = tf.gradients(tf.reduce_sum(emb), table.variable)[0]
    got, got_grad = make_session().run([emb, grad])
    np.testing.assert_array_equal(got, np.zeros((2, 2, DIM), np.float32))
    assert got_grad.values.shape == (0, DIM)
    assert table.stats()["rows_in_use"] == 0


def test_gradient_is_summed_per_unique_row(mx, make_session):
    mx()
    table = _table()
    ids = tf.constant([4, 2, 4, 4], tf.int64)
    emb = sparse_lookup(table, ids)
    weights = tf.constant(np.arange(16, dtype=np.float32).reshape(4, DIM))
    grad = tf.gradients(tf.reduce_sum(emb * weights), [table.variable])[0]
    assert isinstance(grad, tf.IndexedSlices)
    got = make_session().run(grad)
    w = np.arange(16, dtype=np.float32).reshape(4, DIM)
    np.testing.assert_array_equal(got.indices, [0, 1])
    np.testing.assert_array_equal(got.values, [w[0] + w[2] + w[3], w[1]])


def test_full_table_fails_at_run_and_keeps_rows(mx, make_session):
    mx()
    table = _table(name="tiny_table", capacity=3)
    ids = tf.compat.v1.placeholder(tf.int64, shape=[None])
    emb = sparse_lookup(table, ids)
    update = table.variable.assign_add(tf.ones([3, DIM]))
    sess = make_session()
    init_values = initial_rows(sess, table)
    sess.run(emb, {ids: [1, 2]})
    sess.run(update)
    with pytest.raises(tf.errors.ResourceExhaustedError) as err:
        sess.run(emb, {ids: [3, 4, 1]})
    message = err.value.message
    assert "tiny_table" in message and "device_vocabulary_size" in message and "3" in message
    # Trained rows and their IDs survive the failed step.
    np.testing.assert_array_equal(sess.run(emb, {ids: [2, 1]}), init_values[[1, 0]] + 1.0)
    np.testing.assert_array_equal(sess.run(table.variable)[:2], init_values[:2] + 1.0)


def test_table_variable_and_collections(mx):
    mx()
    table = _table(name="vars")
    assert table.variable.shape.as_list() == [VOCAB, DIM]
    assert table.variable.dtype.base_dtype == tf.float32
    assert table.variable not in tf.compat.v1.trainable_variables()
    assert table.name == "vars" and table.dim == DIM and table.key_dtype == tf.int64
    stats = table.stats()
    assert stats["capacity"] == VOCAB and stats["rows_in_use"] == 0


# ----- documented errors -----


def test_create_table_before_init():
    with pytest.raises(RuntimeError, match="init"):
        create_table(tf.int64, DIM, "t", tf.zeros_initializer(), device_vocabulary_size=4)


@pytest.mark.parametrize("key_dtype", [tf.float32, tf.string, tf.int16, tf.uint64])
def test_create_table_bad_key_dtype(mx, key_dtype):
    mx()
    with pytest.raises(TypeError, match="key_dtype"):
        create_table(key_dtype, DIM, "t", tf.zeros_initializer(), device_vocabulary_size=4)


@pytest.mark.parametrize("dim", [0, -3])
def test_create_table_bad_dim(mx, dim):
    mx()
    with pytest.raises(ValueError, match="dim"):
        create_table(tf.int64, dim, "t", tf.zeros_initializer(), device_vocabulary_size=4)


@pytest.mark.parametrize("size", [0, -1, 2**31])
def test_create_table_bad_device_vocabulary_size(mx, size):
    mx()
    with pytest.raises(ValueError, match="device_vocabulary_size"):
        create_table(tf.int64, DIM, "t", tf.zeros_initializer(), device_vocabulary_size=size)


@pytest.mark.parametrize("tier", ["host_vocabulary_size", "ssd_vocabulary_size"])
def test_create_table_bad_tier_size(mx, tier):
    # Valid tier settings are tested in test_tiers.py.
    mx()
    with pytest.raises(ValueError, match=tier):
        create_table(tf.int64, DIM, "t", tf.zeros_initializer(), device_vocabulary_size=4,
                     **{tier: -1})


def test_create_table_same_name_twice(mx):
    mx()
    create_table(tf.int64, DIM, "dup", tf.zeros_initializer(), device_vocabulary_size=4)
    with pytest.raises(ValueError, match="dup"):
        create_table(tf.int64, DIM, "dup", tf.zeros_initializer(), device_vocabulary_size=4)


def test_lookup_bad_ids(mx):
    mx()
    t64 = _table(tf.int64, name="t64")
    t32 = _table(tf.int32, name="t32")
    with pytest.raises(TypeError):
        sparse_lookup(t64, tf.constant([1.0, 2.0]))
    with pytest.raises(TypeError):
        sparse_lookup(t64, tf.constant(["a", "b"]))
    with pytest.raises(TypeError):
        sparse_lookup(t32, tf.constant([1, 2], tf.int64))
    with pytest.raises(ValueError):
        sparse_lookup(t64, tf.constant(3, tf.int64))
    with pytest.raises(ValueError, match="needs a combiner"):  # multi-hot: tests/compat
        sparse_lookup(t64, tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2, 2]))
    with pytest.raises(TypeError):
        sparse_lookup("not a table", tf.constant([1], tf.int64))


def test_explicit_per_row_initializer(mx, make_session):
    """A constant_initializer holding every row: row r starts as values[r]."""
    mx()
    values = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM)
    table = create_table(tf.int64, DIM, "explicit", tf.compat.v1.constant_initializer(values),
                         device_vocabulary_size=VOCAB)
    emb = sparse_lookup(table, tf.constant([[30, -7], [30, 2]], tf.int64))
    got = make_session().run(emb)
    np.testing.assert_array_equal(got, values[[[0, 1], [0, 2]]])


# ----- mx_rec's parameters: each works or is refused, none is dropped -----


def test_lookup_unknown_keyword_is_an_error(mx):
    mx()
    table = _table()
    with pytest.raises(TypeError, match="is_trian"):
        sparse_lookup(table, tf.constant([1], tf.int64), is_trian=False)
    for internal in ("multi_lookup", "lookup_ids", "feature_spec_name_ids_dict"):
        with pytest.raises(NotImplementedError, match=internal):
            sparse_lookup(table, tf.constant([1], tf.int64), **{internal: True})


def test_lookup_dim_must_match_the_table(mx):
    mx()
    table = _table()
    assert sparse_lookup(table, tf.constant([1], tf.int64), dim=DIM).shape.as_list() == [1, DIM]
    sparse_lookup(table, tf.constant([1], tf.int64), dim=tf.TensorShape([DIM]))
    with pytest.raises(ValueError, match="dim=8"):
        sparse_lookup(table, tf.constant([1], tf.int64), dim=8)


@pytest.mark.parametrize("send_count", [0, -3, 2.5, True])
def test_lookup_bad_send_count(mx, send_count):
    mx()
    with pytest.raises(ValueError, match="send_count"):
        sparse_lookup(_table(), tf.constant([1], tf.int64), send_count=send_count)


def test_is_grad_false_counts_but_does_not_train(mx, make_session):
    mx()
    table = _table()
    ids = tf.constant([[3, 4], [3, 5]], tf.int64)
    trained = sparse_lookup(table, ids[:, :1], name="trained")
    frozen = sparse_lookup(table, ids[:, 1:], name="frozen", is_grad=False)
    assert tf.gradients(tf.reduce_sum(frozen), table.variable) == [None]
    grad = tf.gradients(tf.reduce_sum(trained) + tf.reduce_sum(frozen), table.variable)[0]
    sess = make_session()
    values, rows, _ = sess.run([grad.values, grad.indices, frozen])
    # Only ID 3 (one unique row, seen twice) gets a gradient; 4 and 5 got rows all the same.
    assert rows.tolist() == [0]
    np.testing.assert_array_equal(values, np.full((1, DIM), 2.0, np.float32))
    assert table.stats()["rows_in_use"] == 3
    with pytest.raises(TypeError, match="is_grad"):
        sparse_lookup(table, ids, is_grad="no")


def test_serving_default_value_fills_ids_without_rows(mx, make_session):
    mx()
    table = _table(padding_keys=[0])
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    default = np.arange(DIM, dtype=np.float32) + 10
    train = sparse_lookup(table, ids, access_and_evict_config=dict(access_threshold=2),
                          serving_default_value=default)
    evaluate = sparse_lookup(table, ids, is_train=False, serving_default_value=-1.0)
    sess = make_session()
    init_values = initial_rows(sess, table)
    got = sess.run(train, {ids: [7, 7, 8, 0]})   # 7 admitted (count 2), 8 not yet, 0 padding
    np.testing.assert_array_equal(got[:2], init_values[[0, 0]])
    np.testing.assert_array_equal(got[2], default)
    np.testing.assert_array_equal(got[3], np.zeros(DIM))
    got = sess.run(evaluate, {ids: [7, 9, 0]})
    np.testing.assert_array_equal(got, [init_values[0], np.full(DIM, -1.0), np.zeros(DIM)])
    with pytest.raises(ValueError, match="serving_default_value"):
        sparse_lookup(table, ids, serving_default_value=np.zeros(DIM + 1, np.float32))


@pytest.mark.parametrize("option,value", [
    ("enable_merge", True), ("shard_num", 2), ("hashtable_threshold", 100),
])
def test_create_table_refuses_what_it_does_not_do(mx, option, value):
    mx()
    with pytest.raises(NotImplementedError, match=option):
        _table(**{option: value})


@pytest.mark.parametrize("option,value", [
    ("init_param", 11.0), ("init_param", "1"), ("all2all_gradients_op", "mean"),
    ("shard_num", 0), ("hashtable_threshold", -1), ("padding_keys_len", 0),
])
def test_create_table_checks_mx_rec_options(mx, option, value):
    mx()
    with pytest.raises(ValueError, match=option):
        _table(**{option: value})


@pytest.mark.parametrize("option", ["is_dp", "enable_merge", "padding_keys_mask",
                                    "fusion_optimizer_var"])
def test_create_table_bool_options_are_bools(mx, option):
    mx()
    with pytest.raises(TypeError, match=option):
        _table(**{option: "yes"})


def test_create_table_single_process_equivalents(mx, make_session):
    """is_dp, the all2all reduction, fusion_optimizer_var and padding_keys_len do not change a
    one-process table: the same rows come out."""
    mx()
    plain = _table(name="plain")
    other = _table(name="other", is_dp=True, fusion_optimizer_var=False, padding_keys_len=6,
                   all2all_gradients_op="sum_gradients_and_div_by_ranksize")
    ids = tf.constant([5, 6, 5], tf.int64)
    sess = make_session()
    a, b = sess.run([sparse_lookup(plain, ids), sparse_lookup(other, ids)])
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("optimizer", ["adagrad", "lazy_adam"])
def test_single_process_equivalents_train_like_the_plain_table(mx, make_session, optimizer):
    """Training too: is_dp, the all2all reduction and fusion_optimizer_var leave a
    one-process table's rows, slots and IDs bit for bit those of the plain table."""
    from mxrec.optimizers import adagrad, lazy_adam  # pylint: disable=import-outside-toplevel

    mx()
    plain = _table(name="plain")
    other = _table(name="other", is_dp=True, fusion_optimizer_var=False, padding_keys_len=6,
                   all2all_gradients_op="sum_gradients_and_div_by_ranksize")
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    target = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    losses = [tf.reduce_sum(tf.square(sparse_lookup(t, ids) - target)) for t in (plain, other)]
    sparse = [plain.variable, other.variable]
    opt = (adagrad.create_hash_optimizer(0.1) if optimizer == "adagrad"
           else lazy_adam.create_hash_optimizer(0.05))
    grads = [tf.gradients(loss, var)[0] for loss, var in zip(losses, sparse)]
    train_op = opt.apply_gradients(zip(grads, sparse))
    sess = make_session()
    initial = sess.run(plain.variable)
    rng = np.random.default_rng(3)
    for _ in range(4):
        batch = rng.integers(0, 12, size=7).astype(np.int64) * 1009 - 5000
        sess.run(train_op, {ids: batch, target: rng.normal(size=(7, DIM)).astype(np.float32)})
    for got, want in zip(plain.export_rows(), other.export_rows()):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(*sess.run([plain.variable, other.variable]))
    names = opt.get_slot_names()
    assert names
    for name in names:
        np.testing.assert_array_equal(*sess.run([opt.get_slot(plain.variable, name),
                                                 opt.get_slot(other.variable, name)]),
                                      err_msg=name)
    assert not np.array_equal(sess.run(plain.variable), initial)  # it did train


def test_padding_keys_mask_false_makes_them_ordinary_ids(mx, make_session):
    """mx_rec: padding_keys without padding_keys_mask train like any other ID."""
    mx()
    table = _table(padding_keys=[0], padding_keys_mask=False)
    emb = sparse_lookup(table, tf.constant([0, 1], tf.int64))
    sess = make_session()
    init_values = initial_rows(sess, table)
    np.testing.assert_array_equal(sess.run(emb), init_values[[0, 1]])
    assert table.stats()["rows_in_use"] == 2


def test_several_ssd_directories_are_refused(mx, tmp_path):
    mx()
    with pytest.raises(NotImplementedError, match="ssd_data_path"):
        _table(host_vocabulary_size=8, ssd_vocabulary_size=8,
               ssd_data_path=[str(tmp_path), str(tmp_path)])


def test_static_shapes_pad_direct_lookups_to_send_count(mx, make_session):
    """init(use_dynamic=False) pads the direct path too (not only the graph modifier's)."""
    mx(use_dynamic=False)
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, send_count=4)
    gather = [op for op in tf.compat.v1.get_default_graph().get_operations()
              if op.type == "ResourceGather"][0]
    assert gather.inputs[1].shape.as_list() == [4]
    sess = make_session()
    init_values = sess.run(table.variable)
    assert len(init_values) == VOCAB + 1   # the padding row
    np.testing.assert_array_equal(sess.run(emb, {ids: [9, 8, 9]}), init_values[[0, 1, 0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="send_count=4"):
        sess.run(emb, {ids: [1, 2, 3, 4, 5]})
    with pytest.raises(ValueError, match="send_count"):
        sparse_lookup(table, ids)

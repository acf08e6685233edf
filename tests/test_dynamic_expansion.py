"""Dynamic expansion (init(use_dynamic_expansion=True)) and the by-address optimizers.

Equivalence: the same model and batches trained with device-variable tables
and hash optimizers, and with dynamic tables and by-address optimizers, end
with the same row for every ID (constant initial rows, so that both modes
start equal whatever order rows are initialised in).
"""

import numpy as np
import pytest
import tensorflow as tf
from reference import int64_vocab

from mxrec.core import dynamic
from mxrec.core.dynamic import ASCEND_SPARSE_LOOKUP_ID_OFFSET, ASCEND_SPARSE_LOOKUP_LOCAL_EMB
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import (
    adagrad,
    adagrad_by_addr,
    gradient_descent,
    gradient_descent_by_addr,
    lazy_adam,
    lazy_adam_by_addr,
)
from mxrec.util.initialize import init

_v1 = tf.compat.v1
DIM = 4
BATCH = 32
STEPS = 30
VOCAB_A = 1500  # table A: features a [B, 3] and b [B] (two lookups of one table)
VOCAB_C = 700   # table C: feature c [B, 2]
SIZE_HINT = 64  # chunks of 256 rows (the minimum): the stores grow several times
ATOL = 1e-5
INITIAL = {"table_a": 0.05, "table_c": -0.03}
SLOTS = {"sgd": (), "adagrad": ("accumulator",), "lazy_adam": ("m", "v")}

# name -> (hash optimizer, by-address optimizer), same hyper-parameters
OPTIMIZERS = {
    "sgd": (lambda: gradient_descent.create_hash_optimizer(0.3),
            lambda: gradient_descent_by_addr.create_hash_optimizer_by_address(0.3)),
    "adagrad": (lambda: adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0.5),
                lambda: adagrad_by_addr.create_hash_optimizer_by_address(
                    0.1, initial_accumulator_value=0.5)),
    "lazy_adam": (lambda: lazy_adam.create_hash_optimizer(0.02, beta1=0.8, beta2=0.95,
                                                          epsilon=1e-6),
                  lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(
                      0.02, beta1=0.8, beta2=0.95, epsilon=1e-6)),
}


def _stream(seed=0):
    rng = np.random.default_rng(seed)
    vocab_a = int64_vocab(rng, VOCAB_A)
    vocab_c = int64_vocab(rng, VOCAB_C)
    return [dict(a=rng.choice(vocab_a, (BATCH, 3)), b=rng.choice(vocab_a, (BATCH,)),
                 c=rng.choice(vocab_c, (BATCH, 2)),
                 y=rng.integers(0, 2, (BATCH, 1)).astype(np.float32))
            for _ in range(STEPS)]


def _model(dynamic_mode, optimizer):
    """Builds the model; returns (placeholders, train_op, tables)."""
    init(use_dynamic_expansion=dynamic_mode)
    size = SIZE_HINT if dynamic_mode else 2 * VOCAB_A
    table_a = create_table(tf.int64, DIM, "table_a",
                           _v1.constant_initializer(INITIAL["table_a"]),
                           device_vocabulary_size=size)
    table_c = create_table(tf.int64, DIM, "table_c",
                           _v1.constant_initializer(INITIAL["table_c"]),
                           device_vocabulary_size=size)
    ph = dict(a=_v1.placeholder(tf.int64, [None, 3]), b=_v1.placeholder(tf.int64, [None]),
              c=_v1.placeholder(tf.int64, [None, 2]), y=_v1.placeholder(tf.float32, [None, 1]))
    emb_a = sparse_lookup(table_a, ph["a"], name="lookup_a")
    emb_b = sparse_lookup(table_a, ph["b"], name="lookup_b")
    emb_c = sparse_lookup(table_c, ph["c"], name="lookup_c")
    x = tf.concat([tf.reshape(emb_a, [-1, 3 * DIM]), emb_b, tf.reshape(emb_c, [-1, 2 * DIM])],
                  axis=1)
    w = _v1.get_variable("w", initializer=np.linspace(-1, 1, 6 * DIM, dtype=np.float32)
                         .reshape(6 * DIM, 1))
    logits = tf.matmul(tf.tanh(x), w)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=ph["y"], logits=logits))
    if dynamic_mode:
        sparse_in = _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        sparse_vars = _v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    else:
        sparse_in = sparse_vars = [table_a.variable, table_c.variable]
    grads = tf.gradients(loss, sparse_in + [w])
    with tf.control_dependencies([g.values if isinstance(g, tf.IndexedSlices) else g
                                  for g in grads]):
        train = tf.group(
            optimizer.apply_gradients(list(zip(grads[:-1], sparse_vars))),
            _v1.train.GradientDescentOptimizer(0.1).apply_gradients([(grads[-1], w)]))
    return ph, train, (table_a, table_c)


def _final_rows(dynamic_mode, name, batches, make_session):
    hash_opt, addr_opt = OPTIMIZERS[name]
    ph, train, tables = _model(dynamic_mode, addr_opt() if dynamic_mode else hash_opt())
    sess = make_session()
    for batch in batches:
        sess.run(train, {ph[k]: v for k, v in batch.items()})
    result = {}
    for table in tables:
        slots = SLOTS[name]
        if dynamic_mode:
            ids, values = dynamic.export_values(table)
            assert table.store_stats()["chunks"] >= 2
            opt = table.optimizers[0]
            slot_values = [dynamic.export_values(table, opt.store_slot(s))[1] for s in slots]
        else:
            ids, rows = table.export_rows()
            values = sess.run(table.variable)[rows]
            opt = table.optimizers[0]
            slot_values = [sess.run(opt.get_slot(table.variable, s))[rows] for s in slots]
        for label, array in zip(("embedding", *slots), (values, *slot_values)):
            result[f"{table.table_name}/{label}"] = dict(zip(ids.tolist(), array))
    return result


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_by_address_matches_hash_optimizer(name, make_session):
    batches = _stream()
    expected = _final_rows(False, name, batches, make_session)
    tf.compat.v1.reset_default_graph()
    got = _final_rows(True, name, batches, make_session)
    assert sorted(got) == sorted(expected)
    for label, rows in expected.items():
        assert sorted(got[label]) == sorted(rows), label
        ids = sorted(rows)
        want = np.stack([rows[i] for i in ids])
        have = np.stack([got[label][i] for i in ids])
        table_name, part = label.split("/")
        if part == "embedding":
            assert np.abs(want - INITIAL[table_name]).max() > 1e-3, "training moved no row"
        np.testing.assert_allclose(have, want, atol=ATOL, rtol=0, err_msg=label)


def test_seed_five_step_flow(make_session):
    # 1. init with dynamic expansion
    init(train_steps=10, eval_steps=1, use_dynamic_expansion=True)
    # 2. the sparse optimizer
    sparse_optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate=0.05)
    dense_optimizer = _v1.train.AdamOptimizer(learning_rate=0.05)
    table = create_table(tf.int64, DIM, "user_table",
                         _v1.truncated_normal_initializer(stddev=0.1, seed=3),
                         device_vocabulary_size=16)
    ids = _v1.placeholder(tf.int64, [None, 2])
    labels = _v1.placeholder(tf.float32, [None, 1])
    emb = sparse_lookup(table, ids, name="user_lookup")
    logits = tf.keras.layers.Dense(1)(tf.reshape(emb, [-1, 2 * DIM]))
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    # 3. embeddings and addresses from the collections
    train_emb_list = _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    train_address_list = _v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    assert len(train_emb_list) == len(train_address_list) == 1
    assert _v1.get_collection(dynamic.LOCAL_EMB_COLLECTION) == train_emb_list
    assert _v1.get_collection(dynamic.ID_OFFSET_COLLECTION) == train_address_list
    # 4. gradients with respect to the local embeddings
    local_grads = tf.gradients(loss, train_emb_list)
    # 5. the sparse update by address
    grads_and_vars = [(grad, address) for grad, address in zip(local_grads, train_address_list)]
    train_ops = [sparse_optimizer.apply_gradients(grads_and_vars),
                 dense_optimizer.minimize(loss)]

    rng = np.random.default_rng(1)
    vocab = int64_vocab(rng, 300)
    feed_ids = rng.choice(vocab, (64, 2))
    feed = {ids: feed_ids, labels: (feed_ids[:, :1] % 2 == 0).astype(np.float32)}
    sess = make_session()
    first = sess.run(loss, feed)
    for _ in range(30):
        sess.run(train_ops, feed)
    assert sess.run(loss, feed) < first - 0.1
    # The seed's prose form, apply_gradients([grad, addr]), is one pair.
    sess.run(sparse_optimizer.apply_gradients([local_grads[0], train_address_list[0]]), feed)
    stats = table.store_stats()
    assert stats["rows"] == len(np.unique(feed_ids)) == table.stats()["rows_in_use"]
    assert stats["chunks"] >= 1 and stats["capacity"] >= stats["rows"]
    assert sorted(stats["slot_names"]) == ["LazyAdamByAddress/m", "LazyAdamByAddress/v"]
    exported_ids, values = dynamic.export_values(table)
    assert sorted(exported_ids.tolist()) == sorted(np.unique(feed_ids).tolist())
    assert values.shape == (len(exported_ids), DIM)


def test_new_rows_get_initializer_values_and_eval_reads_trained_rows(make_session):
    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, DIM, "t", _v1.random_uniform_initializer(1.0, 2.0, seed=7),
                         device_vocabulary_size=1)
    ids = _v1.placeholder(tf.int64, [None])
    train_emb = sparse_lookup(table, ids, name="train")
    eval_emb = sparse_lookup(table, ids, is_train=False, name="eval")
    assert len(_v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)) == 1  # training lookups only
    sess = make_session()
    batch = np.arange(600, dtype=np.int64) * 7919 - 2**40
    first = sess.run(train_emb, {ids: batch})
    assert first.min() >= 1.0 and first.max() <= 2.0
    assert len(np.unique(first, axis=0)) == len(batch)
    assert table.store_stats()["chunks"] == 3  # 600 rows in chunks of 256
    again = sess.run(train_emb, {ids: batch[::-1]})  # known rows are not initialised again
    np.testing.assert_array_equal(again, first[::-1])
    unseen = np.array([batch[0], 123456789], np.int64)
    got = sess.run(eval_emb, {ids: unseen})
    np.testing.assert_array_equal(got[0], first[0])
    np.testing.assert_array_equal(got[1], np.zeros(DIM, np.float32))
    assert table.store_stats()["rows"] == len(batch)


# ----- errors -----


def test_eviction_is_refused_at_configuration():
    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, DIM, "t", _v1.zeros_initializer())
    ids = _v1.placeholder(tf.int64, [None])
    with pytest.raises(ValueError, match="eviction is not available"):
        sparse_lookup(table, ids, access_and_evict_config=dict(access_threshold=1,
                                                              eviction_threshold=60))
    with pytest.raises(ValueError, match="eviction is not available"):
        table.evict(60)
    with pytest.raises(ValueError, match="eviction is not available"):
        table.shrink(2)
    sparse_lookup(table, ids, access_and_evict_config=dict(access_threshold=1))  # admission ok


def test_tiers_are_refused():
    init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match="host_vocabulary_size and ssd_vocabulary_size"):
        create_table(tf.int64, DIM, "t", _v1.zeros_initializer(), host_vocabulary_size=10)


def _trained_table(make_session):
    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.5))
    ids = _v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    sess = make_session()
    sess.run(emb, {ids: [10, 20, 30]})
    return table, ids, emb, sess


@pytest.mark.parametrize("bad", [-1, 3, 1000])
def test_invalid_address_is_refused_and_nothing_written(bad, make_session):
    table, _, _, sess = _trained_table(make_session)
    before = dynamic.export_values(table)[1]
    addresses = tf.constant([0, 1, bad], tf.int64)
    grads = tf.ones([3, DIM])
    ops = dynamic._ops()
    for op in (ops.mxrec_dynamic_apply_sgd(addresses, grads, 1.0, table_key=table.table_key,
                                           dim=DIM),
               ops.mxrec_dynamic_assign(addresses, grads, table_key=table.table_key, dim=DIM),
               ops.mxrec_dynamic_gather(addresses, table_key=table.table_key, dim=DIM)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"table 't'.*address {bad} at position 2.*Nothing was written"):
            sess.run(op)
    np.testing.assert_array_equal(dynamic.export_values(table)[1], before)


@pytest.mark.parametrize("bad", [3, 10**6])
def test_store_grows_only_to_addresses_the_key_stage_gave(bad, engine, make_session):
    """The store never grows towards an address the table's key stage did not hand out: the
    op and a restore's write refuse it with the table and the limit, and allocate nothing."""
    table, _, _, sess = _trained_table(make_session)  # addresses 0, 1, 2 handed out
    before = table.store_stats()
    ensure = dynamic._ops().mxrec_dynamic_ensure_rows(tf.constant([1, bad], tf.int64),
                                                      table_key=table.table_key)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"table 't'.*address {bad} at position 1.*handed out addresses "
                             rf"\[0, 3\) only .at most 2147483647.*Nothing was allocated"):
        sess.run(ensure)
    with pytest.raises(ValueError, match=rf"table 't'.*address {bad} .*\[0, 3\) only"):
        dynamic.write_rows(table, [bad], np.zeros((1, DIM), np.float32))
    assert table.store_stats() == before


def test_duplicate_addresses_are_summed(make_session):
    table, _, _, sess = _trained_table(make_session)
    ops = dynamic._ops()
    sess.run(ops.mxrec_dynamic_apply_sgd(tf.constant([1, 1, 2], tf.int64), tf.ones([3, DIM]),
                                         0.1, table_key=table.table_key, dim=DIM))
    _, values = dynamic.export_values(table)
    np.testing.assert_allclose(values[:, 0], [0.5, 0.3, 0.4], atol=1e-6)


def test_address_not_from_a_lookup_is_refused(make_session):
    table, ids, emb, _ = _trained_table(make_session)
    address = _v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)[0]
    local = _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)[0]
    grad = tf.gradients(tf.reduce_sum(emb), local)[0]
    opt = gradient_descent_by_addr.create_hash_optimizer_by_address(0.1)
    for fake in (tf.identity(address), tf.constant([0], tf.int64)):
        with pytest.raises(TypeError, match="not an address tensor of a training lookup"):
            opt.apply_gradients([(grad, fake)])
    with pytest.raises(ValueError, match="the table's dim is 4"):
        opt.apply_gradients([(tf.zeros([3, DIM + 1]), address)])
    address.set_shape([3])  # as a lookup with a static unique count would give
    with pytest.raises(ValueError, match="first dimension of each gradient"):
        opt.apply_gradients([(tf.zeros([2, DIM]), address)])
    with pytest.raises(ValueError, match="no gradients provided"):
        opt.apply_gradients([(None, address)])
    with pytest.raises(TypeError, match="takes \\(gradient, address\\) pairs"):
        opt.apply_gradients([(grad, address, 1)])


def test_hash_optimizer_in_dynamic_mode_is_refused(make_session):
    table, _, emb, _ = _trained_table(make_session)
    address = _v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)[0]
    local = _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)[0]
    grad = tf.gradients(tf.reduce_sum(emb), local)[0]
    with pytest.raises(TypeError, match="create_hash_optimizer_by_address"):
        lazy_adam.create_hash_optimizer(0.1).apply_gradients([(grad, address)])
    with pytest.raises(TypeError, match="not in a tf.Variable"):
        tf.gradients(tf.reduce_sum(emb), table.variable)


def test_store_is_dropped_with_its_host_table(engine):
    init(use_dynamic_expansion=True)
    old_key = create_table(tf.int64, DIM, "t", _v1.zeros_initializer()).table_key
    assert engine.dynamic_store_stats(old_key)["rows"] == 0
    init(use_dynamic_expansion=True)  # closes the first init: its host tables are dropped
    tf.compat.v1.reset_default_graph()
    create_table(tf.int64, DIM, "t", _v1.zeros_initializer())
    with pytest.raises(KeyError, match="has no dynamic store"):
        engine.dynamic_store_stats(old_key)


def _dynamic_state(tables, slots):
    state = {}
    for table in tables:
        ids, values = dynamic.export_values(table)
        state[f"{table.table_name}/embedding"] = dict(zip(ids.tolist(), values))
        opt = table.optimizers[0]
        for slot in slots:
            ids, values = dynamic.export_values(table, opt.store_slot(slot))
            state[f"{table.table_name}/{slot}"] = dict(zip(ids.tolist(), values))
    return state


@pytest.mark.parametrize("name", ["adagrad", "lazy_adam"])
def test_checkpoint_restore_continues_like_a_straight_run(name, tmp_path):
    """mxrec.saver.checkpoint saves dynamic stores (rows and slots) in full and delta saves."""
    from mxrec.saver.checkpoint import Saver
    from mxrec.util.initialize import terminate_config_initializer

    batches = _stream()
    _, addr_opt = OPTIMIZERS[name]

    def run(sess, ph, train, part):
        for batch in part:
            sess.run(train, {ph[k]: v for k, v in batch.items()})

    with tf.Graph().as_default():
        ph, train, tables = _model(True, addr_opt())
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            run(sess, ph, train, batches)
            want = _dynamic_state(tables, SLOTS[name])
        terminate_config_initializer()
    with tf.Graph().as_default():
        ph, train, tables = _model(True, addr_opt())
        saver = Saver(str(tmp_path))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            run(sess, ph, train, batches[:10])
            saver.save(sess, 10)
            run(sess, ph, train, batches[10:20])
            saver.save(sess, 20, kind="delta")
        terminate_config_initializer()
    with tf.Graph().as_default():
        ph, train, tables = _model(True, addr_opt())
        saver = Saver(str(tmp_path))
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            assert saver.restore(sess) == 20
            run(sess, ph, train, batches[20:])
            got = _dynamic_state(tables, SLOTS[name])
        terminate_config_initializer()
    assert sorted(got) == sorted(want)
    for label, rows in want.items():
        assert sorted(got[label]) == sorted(rows), label
        for key, row in rows.items():
            np.testing.assert_allclose(got[label][key], row, atol=1e-6, err_msg=label)


def test_is_grad_false_keeps_the_lookup_out_of_training(mx):
    mx(use_dynamic_expansion=True)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.1),
                         device_vocabulary_size=SIZE_HINT)
    sparse_lookup(table, tf.constant([1, 2], tf.int64), name="trained")
    frozen = sparse_lookup(table, tf.constant([3], tf.int64), name="frozen", is_grad=False)
    assert len(_v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)) == 1
    assert len(_v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)) == 1
    assert frozen.op.type == "StopGradient"


def test_static_shapes_pad_to_send_count(mx):
    # Was refused; static shapes now pad local_emb and the addresses to send_count, as
    # RecSDK's examples run them (USE_DYNAMIC=0 with USE_DYNAMIC_EXPANSION=1); values are
    # compared with dynamic shapes in tests/compat/test_mx_rec_zoo_api.py.
    mx(use_dynamic_expansion=True, use_dynamic=False)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.1),
                         device_vocabulary_size=SIZE_HINT)
    assert table.pad_row == -1
    sparse_lookup(table, tf.constant([1, 2, 1], tf.int64), send_count=5)
    assert _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)[0].shape.as_list() == [5, DIM]

"""The mx_rec names RecSDK's DLRM and Wide&Deep examples use, against independent references.

ConfigInitializer's setters and refusals, train_params_config.get_target_batch,
import_host_pipeline_ops(path) with LIBREC_EOS_OPS_SO and Dataset.eos_map, user-written
hash optimizers on CustomizedOptimizer (NumPy updates, slot resets, checkpoints), the
by-address optimizers as tf Optimizers with weight decay, static shapes with dynamic
expansion, eviction with a variance-scaling initializer, and the evaluation lookup of a
graph-modifier model whose training batch carries the timestamp.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import adagrad, gradient_descent

from mxrec.constants.constants import (
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
    ASCEND_TIMESTAMP,
    LIBASC_OPS_SO,
    LIBREC_EOS_OPS_SO,
)
from mxrec.core import dynamic
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.graph.modifier import modify_graph_and_start_emb_cache
from mxrec.optimizers import gradient_descent_by_addr
from mxrec.optimizers.base import CustomizedOptimizer
from mxrec.util.initialize import ConfigInitializer
from mxrec.util.ops import import_host_pipeline_ops

_v1 = tf.compat.v1
DIM = 4


# ------------------------------------------------------------------ ConfigInitializer

def test_if_load_setter_and_unknown_attributes(mx):
    mx()
    runtime = ConfigInitializer.get_instance()
    assert runtime.if_load is False
    runtime.if_load = True
    assert runtime.if_load is True and runtime.config.if_load is True
    with pytest.raises(TypeError, match="bool"):
        runtime.if_load = 1
    for name in ("max_steps", "train_steps", "modify_graph", "no_such_thing"):
        with pytest.raises(AttributeError, match=repr(name)):
            setattr(runtime, name, 3)
    with pytest.raises(AttributeError, match="init\\(max_steps=...\\)"):
        runtime.max_steps = 3
    with pytest.raises(AttributeError, match="read-only"):
        runtime.use_dynamic = False
    assert not hasattr(runtime, "max_steps")


def _dataset(n, seed, batch=4, feat=3, stamp=False):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 40, (n * batch, feat))
    labels = rng.integers(0, 2, (n * batch, 1)).astype(np.float32)
    data = {"ids": ids, "label": labels}
    if stamp:
        data["timestamp"] = np.repeat(np.arange(n) + 100, batch).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(batch, drop_remainder=True)
    if stamp:
        dataset = dataset.map(lambda b: dict(b, timestamp=tf.reduce_max(b["timestamp"])))
    return dataset, ids.reshape(n, batch, feat), labels.reshape(n, batch, 1)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_get_target_batch_and_evaluation_after_a_training_timestamp(mx, make_session,
                                                                     prefetch):
    """The training batch's time in ASCEND_TIMESTAMP (as the examples add it) with admission
    and eviction: the is_train=False lookup of the graph modifier takes no timestamp, and
    get_target_batch(False) gives the rewritten evaluation iterator's labels."""
    mx(prefetch_batch_number=prefetch)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=200)
    train_ds, _, _ = _dataset(3, 1, stamp=True)
    eval_ds, _, eval_labels = _dataset(2, 2, stamp=True)
    train_it = _v1.data.make_initializable_iterator(train_ds)
    eval_it = _v1.data.make_initializable_iterator(eval_ds)
    train_batch, eval_batch = train_it.get_next(), eval_it.get_next()
    _v1.add_to_collection(ASCEND_TIMESTAMP, train_batch["timestamp"])
    config = {"access_threshold": 1, "eviction_threshold": 100}
    losses = []
    for batch, is_train in ((train_batch, True), (eval_batch, False)):
        emb = sparse_lookup(table, batch["ids"], is_train=is_train, modify_graph=True,
                            batch=batch, access_and_evict_config=config,
                            name="user_embedding_lookup")
        losses.append(tf.reduce_mean(emb))
    modify_graph_and_start_emb_cache()
    params = ConfigInitializer.get_instance().train_params_config
    target = params.get_target_batch(False)
    assert set(target) == {"ids", "label", "timestamp"}
    assert target["label"] is not eval_batch["label"]
    sess = make_session()
    sess.run(params.get_initializer(True))
    sess.run(losses[0])
    sess.run(params.get_initializer(False))
    for step in range(2):
        _, label = sess.run([losses[1], target["label"]])
        np.testing.assert_array_equal(label, eval_labels[step])
    with pytest.raises(TypeError, match="bool"):
        params.get_target_batch(0)


def test_get_target_batch_needs_a_rewritten_graph_and_a_batch(mx):
    mx()
    params = ConfigInitializer.get_instance().train_params_config
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=50)
    batch = _v1.data.make_initializable_iterator(_dataset(1, 1)[0]).get_next()
    sparse_lookup(table, batch["ids"], modify_graph=True)  # no batch=
    with pytest.raises(RuntimeError, match="rewritten"):
        params.get_target_batch(True)
    modify_graph_and_start_emb_cache()
    with pytest.raises(RuntimeError, match="batch="):
        params.get_target_batch(True)


# ------------------------------------------------------------------ host ops and eos_map

def test_import_host_pipeline_ops_takes_mx_rec_library_paths(mx):
    mx()
    assert import_host_pipeline_ops().library == LIBASC_OPS_SO
    assert import_host_pipeline_ops(LIBREC_EOS_OPS_SO).library == LIBREC_EOS_OPS_SO
    assert import_host_pipeline_ops("/opt/mxRec/lib/" + LIBASC_OPS_SO).library == LIBASC_OPS_SO
    with pytest.raises(ValueError, match="librec_eos_ops.so"):
        import_host_pipeline_ops("libother.so")
    with pytest.raises(TypeError, match="string"):
        import_host_pipeline_ops(3)


@pytest.mark.parametrize("channel, limits, expect", [
    (0, (-1, -1), 5), (0, (3, 1), 3), (1, (3, 2), 2), (1, (2, -1), 5), (0, (9, 9), 5)])
def test_eos_map_gives_exactly_the_datasets_batches(mx, channel, limits, expect):
    mx()
    librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
    dataset = _v1.data.Dataset.range(5).batch(1)
    mapped = dataset.eos_map(librec, channel, *limits)
    assert hasattr(mapped, "make_initializable_iterator")  # a TF1 dataset stays one
    batch = _v1.data.make_one_shot_iterator(mapped).get_next()
    got = []
    with _v1.Session() as sess:
        while True:
            try:
                got.append(int(sess.run(batch)[0]))
            except tf.errors.OutOfRangeError:
                break
    assert got == list(range(expect))


def test_eos_map_errors(mx):
    mx()
    dataset = tf.data.Dataset.range(3)
    with pytest.raises(TypeError, match="LIBREC_EOS_OPS_SO"):
        dataset.eos_map(import_host_pipeline_ops(), 0)
    librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
    with pytest.raises(ValueError, match="channel_id"):
        dataset.eos_map(librec, 2)
    with pytest.raises(ValueError, match="max_eval_steps"):
        dataset.eos_map(librec, 1, 5, 0)


# ------------------------------------------------------------------ user hash optimizers

class SGDWithWeightDecay(gradient_descent.GradientDescentOptimizer, CustomizedOptimizer):
    """Written as RecSDK's dlrm/model/gradient_descent_w.py is (mx_rec's API)."""

    def __init__(self, learning_rate, weight_decay, use_locking=False, name="GradientDescent"):
        self.optimizer_type = "gradient_descent_with_weight_decay"
        self.weight_decay = weight_decay
        super()._get_name(name=name)
        super().__init__(learning_rate=learning_rate, use_locking=use_locking,
                         name=self.unique_name)

    def initialize_slots(self, var, table_instance):
        return []

    def get_slot_init_values(self):
        return []

    def _apply_sparse_duplicate_indices(self, grad, var):
        nd_indices = tf.expand_dims(grad.indices, 1)
        lr = tf.cast(self._learning_rate_tensor, var.dtype.base_dtype)
        nd_value = (grad.values + self.weight_decay * tf.gather(var, grad.indices)) * lr
        return _v1.scatter_nd_add(var, nd_indices, -nd_value, use_locking=self._use_locking)

    def _apply_dense(self, grad, var):
        raise NotImplementedError("You are using a wrong type of variable.")


class AdagradWithSlots(adagrad.AdagradOptimizer, CustomizedOptimizer):
    """A user optimizer with a slot, updated by TF's own Adagrad (nothing overridden)."""

    def __init__(self, learning_rate, name="UserAdagrad"):
        super()._get_name(name=name)
        super().__init__(learning_rate, initial_accumulator_value=0.25, name=self.unique_name)

    def get_slot_init_values(self):
        return [0.25]


def test_customized_optimizer_names_as_mx_rec():
    first = SGDWithWeightDecay(0.1, 0.01, name="ZooSGD")
    second = SGDWithWeightDecay(0.1, 0.01, name="ZooSGD")
    assert (first.unique_name, second.unique_name) == ("ZooSGD_0", "ZooSGD_1")
    assert first.get_name() == "ZooSGD_0" and first.base_name == "ZooSGD"
    assert isinstance(first, _v1.train.Optimizer)


def _two_lookups(table, ids_a, ids_b, weights_a, weights_b):
    emb_a = sparse_lookup(table, tf.constant(ids_a, tf.int64), name="a")
    emb_b = sparse_lookup(table, tf.constant(ids_b, tf.int64), name="b")
    return (tf.reduce_sum(emb_a * tf.constant(weights_a, tf.float32))
            + tf.reduce_sum(emb_b * tf.constant(weights_b, tf.float32)))


def test_user_sgd_with_weight_decay_matches_numpy(mx, make_session):
    mx()
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=20)
    ids_a, ids_b = [7, 3, 7], [3, 9]
    rng = np.random.default_rng(0)
    w_a, w_b = rng.normal(size=(3, DIM)), rng.normal(size=(2, DIM))
    loss = _two_lookups(table, ids_a, ids_b, w_a, w_b)
    opt = SGDWithWeightDecay(0.1, 0.01)
    grads = tf.gradients(loss, [table.variable])
    train = opt.apply_gradients(list(zip(grads, [table.variable])))
    sess = make_session()
    rows = {7: 0, 3: 1, 9: 2}  # first occurrence order
    values = np.full((3, DIM), 0.5)
    for _ in range(3):
        sess.run(train)
        grad = np.zeros((3, DIM))
        for ids, w in ((ids_a, w_a), (ids_b, w_b)):
            for i, key in enumerate(ids):
                grad[rows[key]] += w[i]
        # The example's update adds lr * (g + wd * row) per entry of the gradient, which
        # holds one entry per lookup and row (a lookup sums its repeated IDs): row 7 decays
        # once, row 3 (in both lookups) twice.
        keys = sorted(set(ids_a)) + sorted(set(ids_b))
        counts = np.bincount([rows[k] for k in keys], minlength=3)[:, None]
        values = values - 0.1 * (grad + 0.01 * counts * values)
    np.testing.assert_allclose(sess.run(table.variable)[:3], values, rtol=1e-5, atol=1e-6)
    assert opt in table.optimizers


def test_user_optimizer_slots_reset_for_evicted_rows_and_checkpoint(mx, make_session,
                                                                   tmp_path):
    mx()
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=2)
    ids = _v1.placeholder(tf.int64, [None])
    stamp = _v1.placeholder(tf.int64, [])
    _v1.add_to_collection(ASCEND_TIMESTAMP, stamp)
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 1,
                                                             "eviction_threshold": 5})
    loss = tf.reduce_sum(emb)
    opt = AdagradWithSlots(0.5)
    train = opt.apply_gradients([(tf.gradients(loss, table.variable)[0], table.variable)])
    slot = opt.get_slot(table.variable, "accumulator")
    assert opt._slot_initial_values() == {"accumulator": 0.25}
    saver = _v1.train.Saver()
    sess = make_session()
    sess.run(train, {ids: [1, 2], stamp: 0})
    sess.run(train, {ids: [1, 2], stamp: 1})
    assert table.evict(0) == 0 or True
    np.testing.assert_allclose(sess.run(slot)[:2], 0.25 + 2.0 * DIM ** 0 * np.ones((2, DIM)))
    path = saver.save(sess, str(tmp_path / "ckpt"))
    # ID 1 unseen for more than 5 seconds of batch time: evicted; ID 3 gets its row with
    # a fresh accumulator (0.25), then one step adds 1.0.
    sess.run(train, {ids: [2], stamp: 10})
    assert table.evict(5) == 1
    sess.run(train, {ids: [3, 2], stamp: 11})
    ids_now, rows_now = table.export_rows()
    row_of = dict(zip(ids_now.tolist(), rows_now.tolist()))
    accumulators = sess.run(slot)
    np.testing.assert_allclose(accumulators[row_of[3]], np.full(DIM, 1.25))
    np.testing.assert_allclose(accumulators[row_of[2]], np.full(DIM, 4.25))
    saver.restore(sess, path)
    np.testing.assert_allclose(sess.run(slot)[:2], np.full((2, DIM), 2.25))


def test_user_optimizer_slot_values_must_match_its_slots(mx, make_session):
    class Broken(adagrad.AdagradOptimizer, CustomizedOptimizer):
        def get_slot_init_values(self):
            return [0.1, 0.2]

    mx()
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=4)
    ids = tf.constant([1], tf.int64)
    loss = tf.reduce_sum(sparse_lookup(table, ids, access_and_evict_config={
        "access_threshold": 1, "eviction_threshold": 5}))
    with pytest.raises(ValueError, match="2 values for its 1 slots"):
        Broken(0.1).apply_gradients([(tf.gradients(loss, table.variable)[0],
                                      table.variable)])


def test_user_optimizer_refuses_dense_variables(mx):
    mx()
    dense = _v1.get_variable("dense", [2, DIM])
    with pytest.raises(TypeError, match="mxrec tables only"):
        SGDWithWeightDecay(0.1, 0.01).apply_gradients(
            [(tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([0])), dense)])


# ------------------------------------------------------------------ by address

def _by_address_run(mx, use_dynamic, optimizer, steps=3):
    tf.compat.v1.reset_default_graph()
    mx(use_dynamic_expansion=True, use_dynamic=use_dynamic)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.5),
                         device_vocabulary_size=300)
    ids_a, ids_b = [7, 3, 7], [3, 9]
    rng = np.random.default_rng(0)
    w_a, w_b = rng.normal(size=(3, DIM)), rng.normal(size=(2, DIM))
    emb_a = sparse_lookup(table, tf.constant(ids_a, tf.int64), name="a", send_count=8)
    emb_b = sparse_lookup(table, tf.constant(ids_b, tf.int64), name="b", send_count=8)
    loss = (tf.reduce_sum(emb_a * tf.constant(w_a, tf.float32))
            + tf.reduce_sum(emb_b * tf.constant(w_b, tf.float32)))
    local = _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = _v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    opt = optimizer()
    assert isinstance(opt, _v1.train.Optimizer)
    grads = opt.compute_gradients(loss, var_list=local)  # TF's, on tensors
    train = opt.apply_gradients([(g, a) for (g, _), a in zip(grads, addresses)])
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        for _ in range(steps):
            sess.run(train)
        shapes = [t.shape.as_list() for t in local]
        ids, values = dynamic.export_values(table)
    return dict(zip(ids.tolist(), values)), shapes, (ids_a, ids_b, w_a, w_b)


def test_sgd_by_address_weight_decay_matches_numpy(mx):
    got, _, (ids_a, ids_b, w_a, w_b) = _by_address_run(
        mx, True, lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(
            0.1, weight_decay=0.01))
    values = {k: np.full(DIM, 0.5) for k in (7, 3, 9)}
    for _ in range(3):
        grad = {k: np.zeros(DIM) for k in values}
        for ids, w in ((ids_a, w_a), (ids_b, w_b)):
            for i, key in enumerate(ids):
                grad[key] += w[i]
        values = {k: v - 0.1 * (grad[k] + 0.01 * v) for k, v in values.items()}  # once per ID
    for key, value in values.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="0.0, 1.0"):
        gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1, weight_decay=2.0)


@pytest.mark.parametrize("factory", ["sgd", "lazy_adam"])
def test_static_shapes_with_dynamic_expansion_train_as_dynamic_shapes(mx, factory):
    from mxrec.optimizers import lazy_adam_by_addr

    make = {"sgd": lambda: gradient_descent_by_addr.create_hash_optimizer_by_address(
                0.1, weight_decay=0.001),
            "lazy_adam": lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(0.05)}
    dynamic_rows, dynamic_shapes, _ = _by_address_run(mx, True, make[factory])
    static_rows, static_shapes, _ = _by_address_run(mx, False, make[factory])
    assert static_shapes == [[8, DIM], [8, DIM]] and dynamic_shapes[0][0] is None
    assert sorted(static_rows) == sorted(dynamic_rows) == [3, 7, 9]
    for key in dynamic_rows:
        np.testing.assert_array_equal(static_rows[key], dynamic_rows[key])


# ------------------------------------------------------------------ eviction, VarianceScaling

@pytest.mark.parametrize("initializer", [
    lambda: _v1.variance_scaling_initializer(mode="fan_avg", distribution="normal", seed=3),
    lambda: _v1.glorot_uniform_initializer(seed=3),
    lambda: tf.keras.initializers.VarianceScaling(2.0, "fan_in", "untruncated_normal", 3)])
def test_evicted_rows_refill_with_the_whole_tables_statistics(mx, make_session, initializer):
    mx()
    rows, dim = 3000, 8
    table = create_table(tf.int64, dim, "t", initializer(), device_vocabulary_size=rows)
    ids = _v1.placeholder(tf.int64, [None])
    stamp = _v1.placeholder(tf.int64, [])
    _v1.add_to_collection(ASCEND_TIMESTAMP, stamp)
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 1,
                                                             "eviction_threshold": 5})
    sess = make_session()
    old = 2000
    first = sess.run(emb, {ids: np.arange(old), stamp: 0})
    sess.run(emb, {ids: [50_000], stamp: 100})
    assert table.evict(5) == old
    fresh = sess.run(emb, {ids: np.arange(10_000, 10_000 + old), stamp: 101})
    assert table.stats()["rows_in_use"] == old + 1
    # The same distribution as the variable's initial values (drawn for [rows, dim]):
    # 16,000 values each, so the std's sampling error is below 1%.
    assert abs(fresh.std() / first.std() - 1) < 0.04
    assert abs(fresh.mean()) < 0.05 * first.std()
    assert not np.array_equal(fresh, first)

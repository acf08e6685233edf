"""Equivalence of training with mxrec tables and a plain dense-variable reference.

The reference keeps every ID of the stream in one dense tf.Variable per table,
indexed by an ID -> row map built here (first occurrence), starts from the
same rows and trains with tf.compat.v1.train optimizers on tf.gather's
IndexedSlices. LazyAdam has no TF1 optimizer (TensorFlow Addons is not
available); the reference follows its definition instead, "Adam applied to the
rows a batch touched only": TF's own Adam kernel (`ResourceApplyAdam`, the one
tf.compat.v1.train.AdamOptimizer runs on dense variables) on those rows and
their moments, gathered into scratch variables and scattered back.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf
from reference import (
    RefKeyStage,
    distinct_rows_initializer,
    initial_rows,
    int64_vocab,
    power_law_ids,
)

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.optimizers import adagrad, ftrl, gradient_descent, lazy_adam, momentum
from mxrec.util.initialize import init
from mxrec.util.variable import get_dense_and_sparse_variable

DIM = 4
BATCH = 16
STEPS = 50
CAP_A = 400  # shared table: features a [B, 3] and b [B]; vocabulary of CAP_A IDs
CAP_C = 200  # second table: feature c [B, 2]
HIDDEN = 5
ATOL = 1e-5

_v1 = tf.compat.v1

# name -> (mxrec hash optimizer factory, reference TF optimizer factory or None for LazyAdam)
OPTIMIZERS = {
    "sgd": (lambda: gradient_descent.create_hash_optimizer(0.2),
            lambda: _v1.train.GradientDescentOptimizer(0.2)),
    "adagrad": (lambda: adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0.5),
                lambda: _v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.5)),
    "lazy_adam": (lambda: lazy_adam.create_hash_optimizer(0.02, beta1=0.8, beta2=0.95,
                                                          epsilon=1e-6),
                  None),
    "ftrl": (lambda: ftrl.create_hash_optimizer(0.2, learning_rate_power=-0.5,
                                                initial_accumulator_value=0.1,
                                                l1_regularization_strength=0.001,
                                                l2_regularization_strength=0.01),
             lambda: _v1.train.FtrlOptimizer(0.2, learning_rate_power=-0.5,
                                             initial_accumulator_value=0.1,
                                             l1_regularization_strength=0.001,
                                             l2_regularization_strength=0.01)),
    "momentum": (lambda: momentum.create_hash_optimizer(0.05, momentum=0.9),
                 lambda: _v1.train.MomentumOptimizer(0.05, momentum=0.9)),
}
LAZY_ADAM = dict(lr=0.02, beta1=0.8, beta2=0.95, epsilon=1e-6)


def _dense_optimizer(name):
    if name == "lazy_adam":
        return _v1.train.AdamOptimizer(0.02, beta1=0.8, beta2=0.95, epsilon=1e-6)
    return OPTIMIZERS[name][1]()


# ----- data and model -----


def _stream(seed=0, steps=STEPS):
    rng = np.random.default_rng(seed)
    vocab_a = int64_vocab(rng, CAP_A)
    vocab_c = int64_vocab(rng, CAP_C)[::-1].copy()
    batches = []
    for _ in range(steps):
        batches.append(dict(
            a=power_law_ids(rng, vocab_a, (BATCH, 3)),
            b=power_law_ids(rng, vocab_a[::-1], (BATCH,)),
            c=power_law_ids(rng, vocab_c, (BATCH, 2)),
            y=rng.integers(0, 2, size=(BATCH, 1)).astype(np.float32)))
    return batches, vocab_a, vocab_c


def _id_maps(batches):
    """First-occurrence ID -> row maps: per step, lookup a then b (one table), c apart."""
    ref_a, ref_c = RefKeyStage(CAP_A), RefKeyStage(CAP_C)
    for batch in batches:
        ref_a.process(batch["a"].ravel())
        ref_a.process(batch["b"].ravel())
        ref_c.process(batch["c"].ravel())
    return ref_a.rows, ref_c.rows


def _dense_init(seed=1):
    rng = np.random.default_rng(seed)
    return dict(w1=rng.normal(0, 0.3, (6 * DIM, HIDDEN)).astype(np.float32),
                b1=rng.normal(0, 0.1, (HIDDEN,)).astype(np.float32),
                w2=rng.normal(0, 0.3, (HIDDEN, 1)).astype(np.float32),
                b2=np.zeros((1,), np.float32))


def _model(emb_a, emb_b, emb_c, labels, dense_init):
    x = tf.concat([tf.reshape(emb_a, [-1, 3 * DIM]), tf.reshape(emb_b, [-1, DIM]),
                   tf.reshape(emb_c, [-1, 2 * DIM])], axis=1)
    with _v1.variable_scope("dense"):
        w = {k: _v1.get_variable(k, initializer=v, use_resource=True)
             for k, v in dense_init.items()}
    hidden = tf.tanh(tf.matmul(x, w["w1"]) + w["b1"])
    logits = tf.matmul(hidden, w["w2"]) + w["b2"]
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return loss, w


def _grad_tensors(grads):
    out = []
    for g in grads:
        out.extend([g.values, g.indices] if isinstance(g, tf.IndexedSlices) else [g])
    return out


def _session(graph):
    sess = _v1.Session(graph=graph, config=_v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2))
    with graph.as_default():
        sess.run(_v1.global_variables_initializer())
    return sess


class MxrecRun:
    """The model on mxrec tables, trained with a hash optimizer."""

    def __init__(self, opt_name, threads=None, batch_shape=(BATCH,)):
        kwargs = {} if threads is None else dict(key_process_thread_num=threads)
        self.graph = tf.Graph()
        with self.graph.as_default():
            init(**kwargs)
            self.ta = create_table(tf.int64, DIM, "table_a", distinct_rows_initializer(seed=2),
                                   device_vocabulary_size=CAP_A)
            self.tc = create_table(tf.int64, DIM, "table_c", distinct_rows_initializer(seed=3),
                                   device_vocabulary_size=CAP_C)
            self.ph = dict(a=_v1.placeholder(tf.int64, [None, 3]),
                           b=_v1.placeholder(tf.int64, [None]),
                           c=_v1.placeholder(tf.int64, [None, 2]),
                           y=_v1.placeholder(tf.float32, [None, 1]))
            emb_a = sparse_lookup(self.ta, self.ph["a"], name="lookup_a")
            emb_b = sparse_lookup(self.ta, self.ph["b"], name="lookup_b")
            emb_c = sparse_lookup(self.tc, self.ph["c"], name="lookup_c")
            self.loss, self.dense = _model(emb_a, emb_b, emb_c, self.ph["y"], _dense_init())
            dense, sparse = get_dense_and_sparse_variable()
            assert sorted(v.name for v in dense) == sorted(v.name for v in self.dense.values())
            assert [v.name for v in sparse] == [self.ta.variable.name, self.tc.variable.name]
            grads = tf.gradients(self.loss, dense + sparse)
            assert all(isinstance(g, tf.IndexedSlices) for g in grads[len(dense):])
            self.hash_opt = OPTIMIZERS[opt_name][0]()
            with tf.control_dependencies(_grad_tensors(grads)):
                self.train_op = tf.group(
                    _dense_optimizer(opt_name).apply_gradients(zip(grads[:len(dense)], dense)),
                    self.hash_opt.apply_gradients(zip(grads[len(dense):], sparse)))
            self.slots = {
                (t, s): self.hash_opt.get_slot(t.variable, s)
                for t in (self.ta, self.tc) for s in self.hash_opt.get_slot_names()}
            self.eval_ids = _v1.placeholder(tf.int64, [None])
            self.eval_emb = sparse_lookup(self.ta, self.eval_ids, is_train=False)
        self.sess = _session(self.graph)
        self.init_a = initial_rows(self.sess, self.ta)
        self.init_c = initial_rows(self.sess, self.tc)

    def step(self, batch):
        feed = {self.ph[k]: batch[k] for k in "abcy"}
        return self.sess.run([self.loss, self.train_op], feed)[0]

    def table(self, t):
        return self.sess.run(t.variable)

    def rows_by_id(self, t):
        """{id: row value} of every ID the table admitted."""
        ids, rows = t.export_rows()
        values = self.table(t)
        return {int(i): values[r] for i, r in zip(ids, rows)}


class ReferenceRun:
    """The same model on dense variables holding every ID of the stream."""

    def __init__(self, opt_name, map_a, map_c, init_a, init_c):
        self.map_a, self.map_c = map_a, map_c
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.var_a = _v1.get_variable("ref_a", initializer=init_a[:len(map_a)],
                                          use_resource=True)
            self.var_c = _v1.get_variable("ref_c", initializer=init_c[:len(map_c)],
                                          use_resource=True)
            self.ph = dict(a=_v1.placeholder(tf.int32, [None, 3]),
                           b=_v1.placeholder(tf.int32, [None]),
                           c=_v1.placeholder(tf.int32, [None, 2]),
                           y=_v1.placeholder(tf.float32, [None, 1]))
            emb_a = tf.gather(self.var_a, self.ph["a"])
            emb_b = tf.gather(self.var_a, self.ph["b"])
            emb_c = tf.gather(self.var_c, self.ph["c"])
            self.loss, self.dense = _model(emb_a, emb_b, emb_c, self.ph["y"], _dense_init())
            dense = list(self.dense.values())
            sparse = [self.var_a, self.var_c]
            grads = tf.gradients(self.loss, dense + sparse)
            with tf.control_dependencies(_grad_tensors(grads)):
                dense_op = _dense_optimizer(opt_name).apply_gradients(
                    zip(grads[:len(dense)], dense))
                if opt_name == "lazy_adam":
                    sparse_op = self._lazy_adam(grads[len(dense):], sparse)
                else:
                    sparse_op = OPTIMIZERS[opt_name][1]().apply_gradients(
                        zip(grads[len(dense):], sparse))
            self.train_op = tf.group(dense_op, sparse_op)
        self.sess = _session(self.graph)

    def _lazy_adam(self, grads, variables):
        """LazyAdam by definition: TF's Adam kernel on the touched rows, nothing else moves."""
        lr, b1, b2, eps = (LAZY_ADAM[k] for k in ("lr", "beta1", "beta2", "epsilon"))
        # Adam's step t, from 1; fed by step(), so the bias corrections are b^t exactly.
        self.adam_step = _v1.placeholder(tf.float32, [])
        self.steps_run = 0
        self.moments = {}
        updates = []
        for grad, var in zip(grads, variables):
            name = var.op.name
            m = _v1.get_variable(name + "_m", initializer=tf.zeros_initializer(),
                                 shape=var.shape, trainable=False, use_resource=True)
            v = _v1.get_variable(name + "_v", initializer=tf.zeros_initializer(),
                                 shape=var.shape, trainable=False, use_resource=True)
            self.moments[name] = (m, v)
            rows, position = tf.unique(grad.indices)
            g = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(rows)[0])
            with tf.control_dependencies(None):  # initialised without feeding the batch
                scratch = [_v1.Variable(tf.zeros([0, DIM]), shape=tf.TensorShape([None, DIM]),
                                        validate_shape=False, trainable=False,
                                        use_resource=True, name=f"{name}_scratch_{part}")
                           for part in "xmv"]
            load = [dst.assign(tf.gather(src, rows)) for dst, src in zip(scratch, (var, m, v))]
            with tf.control_dependencies(load):
                apply = tf.raw_ops.ResourceApplyAdam(
                    var=scratch[0].handle, m=scratch[1].handle, v=scratch[2].handle,
                    beta1_power=tf.pow(np.float32(b1), self.adam_step),
                    beta2_power=tf.pow(np.float32(b2), self.adam_step),
                    lr=np.float32(lr), beta1=np.float32(b1), beta2=np.float32(b2),
                    epsilon=np.float32(eps), grad=g)
            with tf.control_dependencies([apply]):
                updates += [dst.scatter_update(tf.IndexedSlices(src.read_value(), rows))
                            for dst, src in zip((var, m, v), scratch)]
        return tf.group(*updates)

    def step(self, batch):
        feed = {self.ph["a"]: np.vectorize(self.map_a.get)(batch["a"]),
                self.ph["b"]: np.vectorize(self.map_a.get)(batch["b"]),
                self.ph["c"]: np.vectorize(self.map_c.get)(batch["c"]),
                self.ph["y"]: batch["y"]}
        if hasattr(self, "adam_step"):
            self.steps_run += 1
            feed[self.adam_step] = self.steps_run
        return self.sess.run([self.loss, self.train_op], feed)[0]


def _check_table_against_reference(mx_run, table, ref_values, id_map, init_values):
    values = mx_run.table(table)
    ids, rows = table.export_rows()
    # The rows were given in first-occurrence order, as the reference assumed.
    assert {int(i): int(r) for i, r in zip(ids, rows)} == id_map
    for i, r in zip(ids.tolist(), rows.tolist()):
        np.testing.assert_allclose(values[r], ref_values[id_map[i]], atol=ATOL, rtol=0,
                                   err_msg=f"ID {i} (row {r})")
    # Rows no ID ever took keep their initial values exactly.
    np.testing.assert_array_equal(values[len(id_map):], init_values[len(id_map):])


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_training_matches_dense_reference(opt_name):
    batches, vocab_a, _ = _stream(seed=7)
    map_a, map_c = _id_maps(batches)
    # The stream has a long tail: many IDs, yet some are never seen.
    assert 100 < len(map_a) < CAP_A - 10 and 50 < len(map_c) < CAP_C - 10
    mx_run = MxrecRun(opt_name)
    ref = ReferenceRun(opt_name, map_a, map_c, mx_run.init_a, mx_run.init_c)
    ref_a0 = ref.sess.run(ref.var_a)

    for batch in batches[:-1]:
        np.testing.assert_allclose(mx_run.step(batch), ref.step(batch), atol=ATOL, rtol=0)

    # The last step: rows (and slots) of IDs outside the batch must not move at all.
    last = batches[-1]
    touched_a = {map_a[int(i)] for i in np.concatenate([last["a"].ravel(), last["b"]])}
    touched_c = {map_c[int(i)] for i in last["c"].ravel()}
    before = {k: mx_run.sess.run(v) for k, v in mx_run.slots.items()}
    before_a, before_c = mx_run.table(mx_run.ta), mx_run.table(mx_run.tc)
    np.testing.assert_allclose(mx_run.step(last), ref.step(last), atol=ATOL, rtol=0)
    for table, old, touched in ((mx_run.ta, before_a, touched_a),
                                (mx_run.tc, before_c, touched_c)):
        untouched = sorted(set(range(len(old))) - touched)
        new = mx_run.table(table)
        np.testing.assert_array_equal(new[untouched], old[untouched])
        assert not np.array_equal(new[sorted(touched)], old[sorted(touched)])
        for (t, slot), value in before.items():
            if t is table:
                np.testing.assert_array_equal(mx_run.sess.run(mx_run.slots[(t, slot)])[untouched],
                                              value[untouched], err_msg=slot)

    ref_a, ref_c = ref.sess.run([ref.var_a, ref.var_c])
    _check_table_against_reference(mx_run, mx_run.ta, ref_a, map_a, mx_run.init_a)
    _check_table_against_reference(mx_run, mx_run.tc, ref_c, map_c, mx_run.init_c)
    assert np.abs(ref_a - ref_a0).max() > 1e-3  # training moved the rows
    for name, var in mx_run.dense.items():
        np.testing.assert_allclose(mx_run.sess.run(var), ref.sess.run(ref.dense[name]),
                                   atol=ATOL, rtol=0, err_msg=name)
    if opt_name == "lazy_adam":
        for table, ref_var in ((mx_run.ta, ref.var_a), (mx_run.tc, ref.var_c)):
            m, v = (ref.sess.run(x) for x in ref.moments[ref_var.op.name])
            ids, rows = table.export_rows()
            id_map = map_a if table is mx_run.ta else map_c
            ref_rows = [id_map[int(i)] for i in ids]
            for slot, want in (("m", m), ("v", v)):
                got = mx_run.sess.run(mx_run.slots[(table, slot)])
                np.testing.assert_allclose(got[rows], want[ref_rows], atol=ATOL, rtol=0)
                # Moments of rows no ID took stay zero.
                assert not got[len(ids):].any()

    # IDs never seen in training are not in the table and look up as zeros in evaluation.
    unseen = [i for i in vocab_a.tolist() if i not in map_a][:5] + [12345]
    assert len(unseen) > 1
    assert not set(unseen) & set(mx_run.ta.export_rows()[0].tolist())
    seen = int(last["a"][0, 0])
    got = mx_run.sess.run(mx_run.eval_emb,
                          {mx_run.eval_ids: np.array(unseen + [seen], np.int64)})
    np.testing.assert_array_equal(got[:-1], np.zeros((len(unseen), DIM), np.float32))
    np.testing.assert_array_equal(got[-1], mx_run.rows_by_id(mx_run.ta)[seen])
    assert mx_run.ta.stats()["rows_in_use"] == len(map_a)
    mx_run.sess.close()
    ref.sess.close()


# ----- thread count does not change training -----

_big_serial = itertools.count()


def _train_big(threads, steps, vocab, rng_seed, opt_name="adagrad"):
    """A model whose lookups hold >= 32768 IDs, so the key stage runs multi-threaded."""
    rng = np.random.default_rng(rng_seed)
    graph = tf.Graph()
    with graph.as_default():
        init(key_process_thread_num=threads)
        table = create_table(tf.int64, DIM, "big", distinct_rows_initializer(seed=4),
                             device_vocabulary_size=len(vocab))
        ids = _v1.placeholder(tf.int64, [None, 4])
        other = _v1.placeholder(tf.int64, [None])
        y = _v1.placeholder(tf.float32, [None])
        emb = tf.reduce_sum(sparse_lookup(table, ids), axis=1) + sparse_lookup(table, other)
        w = _v1.get_variable("w", initializer=np.full((DIM, 1), 0.1, np.float32))
        logits = tf.squeeze(tf.matmul(emb, w), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
        dense, sparse = get_dense_and_sparse_variable()
        grads = tf.gradients(loss, dense + sparse)
        train_op = tf.group(
            _v1.train.AdagradOptimizer(0.1).apply_gradients(zip(grads[:1], dense)),
            OPTIMIZERS[opt_name][0]().apply_gradients(zip(grads[1:], sparse)))
    sess = _session(graph)
    losses = []
    for _ in range(steps):
        feed = {ids: power_law_ids(rng, vocab, (8192, 4), alpha=1.0),
                other: power_law_ids(rng, vocab[::-1], (40000,), alpha=1.0),
                y: rng.integers(0, 2, size=8192).astype(np.float32)}
        feed[other] = feed[other][:8192 * 5].reshape(-1)[:8192]
        losses.append(sess.run([loss, train_op], feed)[0])
    result = dict(table=sess.run(table.variable), export=table.export_rows(),
                  w=sess.run(w), losses=losses, stats=table.stats())
    sess.close()
    return result


def test_thread_count_does_not_change_training():
    rng = np.random.default_rng(9)
    vocab = int64_vocab(rng, 12_000)
    results = [_train_big(threads, steps=3, vocab=vocab, rng_seed=10) for threads in (1, 4)]
    one, four = results
    assert one["stats"]["rows_in_use"] > 1000
    for key in ("table", "w", "losses"):
        np.testing.assert_array_equal(one[key], four[key], err_msg=key)
    for got, want in zip(one["export"], four["export"]):
        np.testing.assert_array_equal(got, want)
    assert one["stats"] == four["stats"]


# ----- error paths -----


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_hash_optimizer_rejects_dense_variables_and_gradients(mx, opt_name):
    mx()
    table = create_table(tf.int64, DIM, "t", tf.zeros_initializer(), device_vocabulary_size=8)
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    dense_var = _v1.get_variable("dense", shape=[DIM], use_resource=True)
    loss = tf.reduce_sum(emb * dense_var)
    table_grad, dense_grad = tf.gradients(loss, [table.variable, dense_var])
    opt = OPTIMIZERS[opt_name][0]()
    with pytest.raises(TypeError, match="dense"):
        opt.apply_gradients([(dense_grad, dense_var)])
    with pytest.raises(TypeError, match="IndexedSlices"):
        opt.apply_gradients([(tf.convert_to_tensor(table_grad), table.variable)])
    with pytest.raises(TypeError):
        opt.apply_gradients([(table_grad, table.variable), (dense_grad, dense_var)])
    opt.apply_gradients([(table_grad, table.variable)])  # the proper call builds


def test_optimizer_factory_arguments():
    with pytest.raises(ValueError, match="learning_rate"):
        gradient_descent.create_hash_optimizer(0.0)
    with pytest.raises(TypeError, match="learning_rate"):
        gradient_descent.create_hash_optimizer("0.1")
    with pytest.raises(ValueError, match="learning_rate"):
        momentum.create_hash_optimizer(-1.0)
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0.0)
    with pytest.raises(ValueError, match="beta1"):
        lazy_adam.create_hash_optimizer(0.1, beta1=1.0)
    with pytest.raises(ValueError, match="beta2"):
        lazy_adam.create_hash_optimizer(0.1, beta2=-0.1)
    with pytest.raises(ValueError, match="epsilon"):
        lazy_adam.create_hash_optimizer(0.1, epsilon=0.0)
    with pytest.raises(ValueError, match="learning_rate"):
        ftrl.create_hash_optimizer(0.0)

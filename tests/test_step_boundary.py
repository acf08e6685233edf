"""Batches planned ahead of their step (graph modifier, prefetch) never leak into saves,
evaluation or eviction: each is compared with a run where nothing is planned ahead.

- Save at step 20 while batches are planned, restore in a fresh graph and host state (as a
  new process would), train 20 more: equals 40 straight steps of the direct path (TF Saver,
  mxrec's Saver, Estimator checkpoints; count admission, a host tier).
- Evaluation every 5 steps while training batches are planned: equals the direct path's.
- Eviction or shrink after every step, two lookups of the table per step, evaluation
  batches in between: equals the same run without evaluation.
"""


import numpy as np
import pytest
import tensorflow as tf
from support import needs_estimator, wait_for_planned_batches

from mxrec._lib import loader
from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup
from mxrec.graph.modifier import GraphModifierHook, modify_graph_and_start_emb_cache
from mxrec.optimizers import adagrad
from mxrec.saver.checkpoint import Saver
from mxrec.util.initialize import get_initializer, init, terminate_config_initializer
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
DIM, BATCH, FEATURES, POOL, STEPS = 4, 16, 4, 80, 40


def _data(seed=0):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, POOL + 1) ** 1.1
    ids = rng.choice(POOL, size=(STEPS * BATCH, FEATURES), p=p / p.sum()) * 7919 - 2**40
    labels = (rng.random(STEPS * BATCH) < 0.3).astype(np.float32)
    times = np.repeat(np.arange(STEPS, dtype=np.int64) * 10, BATCH)
    return ids.astype(np.int64), labels, times


DATA = _data()
# Every ID of the data and two never seen: the probe all runs are compared on.
PROBE = np.concatenate([np.unique(DATA[0]), [5, 6]]).reshape(-1, 1)
# Evaluation IDs: the next batches' IDs (planned, not trained, with prefetch) and others.
EVAL = np.unique(DATA[0][: 8 * BATCH]).reshape(-1, 1)


class Model:
    """Logistic regression over the sum of FEATURES embeddings of one table (count
    admission 2), fed by a tf.data iterator; an evaluation lookup on a placeholder."""

    def __init__(self, *, modify=False, prefetch=0, skip=0, host=0, lookups=1, eviction=None,
                 threshold=2):
        init(prefetch_batch_number=prefetch)
        ids, labels, times = DATA
        dataset = tf.data.Dataset.from_tensor_slices((ids, labels, times)).batch(BATCH)
        iterator = _v1.data.make_initializable_iterator(dataset.skip(skip))
        features, label, stamp = iterator.get_next()
        if host:  # a device cache of 40 rows over the host tier; a row-independent init
            initializer = _v1.constant_initializer(0.05)
            sizes = dict(device_vocabulary_size=40, host_vocabulary_size=host)
        else:
            initializer = _v1.truncated_normal_initializer(stddev=0.1, seed=7)
            sizes = dict(device_vocabulary_size=POOL + 8)
        self.table = create_table(tf.int64, DIM, "t", initializer, **sizes)
        config = dict(access_threshold=threshold)
        if eviction is not None:
            config["eviction_threshold"] = eviction
        self.weights = _v1.get_variable("w", [DIM, 1], initializer=_v1.ones_initializer())
        # Evaluation first: it takes no batch time (that would read the iterator).
        self.eval_ids = _v1.placeholder(tf.int64, [None, 1])
        eval_emb = sparse_lookup(self.table, self.eval_ids, is_train=False,
                                 access_and_evict_config=config)
        self.predict = tf.sigmoid(tf.matmul(tf.reduce_sum(eval_emb, 1), self.weights))
        add_timestamp(stamp)
        width = FEATURES // lookups
        embs = [sparse_lookup(self.table, features[:, i * width:(i + 1) * width],
                              access_and_evict_config=config, modify_graph=modify,
                              name=f"lookup{i}") for i in range(lookups)]
        logits = tf.matmul(tf.reduce_sum(tf.concat(embs, 1), 1), self.weights)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=label[:, None], logits=logits))
        dense, sparse = get_dense_and_sparse_variable()
        self.train_op = tf.group(
            _v1.train.GradientDescentOptimizer(0.2).minimize(loss, var_list=dense),
            adagrad.create_hash_optimizer(0.2).apply_gradients(
                zip(tf.gradients(loss, sparse), sparse)))
        if modify:
            modify_graph_and_start_emb_cache()
        self.start = get_initializer(True) if modify else iterator.initializer

    def probe(self, sess):
        return sess.run(self.predict, {self.eval_ids: PROBE})[:, 0]

    def evaluate(self, sess):
        return sess.run(self.predict, {self.eval_ids: EVAL})[:, 0]


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def _run(steps, *, save=None, restore=None, eval_every=None, after_step=None, **options):
    """Trains `steps` steps in a fresh graph and host state; returns (probe, evaluations)."""
    terminate_config_initializer()
    evaluations = []
    with tf.Graph().as_default():
        model = Model(**options)
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            if restore is not None:
                restore(sess)  # before the pipeline starts planning
            sess.run(model.start)
            for step in range(1, steps + 1):
                sess.run(model.train_op)
                if after_step is not None:
                    after_step(model, step, sess)
                if eval_every and step % eval_every == 0:
                    evaluations.append(model.evaluate(sess))
            if save is not None:
                save(sess)
            return model.probe(sess), evaluations


def _tf_saver(path):
    def save(sess):
        _v1.train.Saver().save(sess, path)

    def restore(sess):
        _v1.train.Saver().restore(sess, path)

    return save, restore


def _mxrec_saver(path):
    def save(sess):
        Saver(path).save(sess, 20)

    def restore(sess):
        Saver(path).restore(sess)

    return save, restore


@pytest.fixture(scope="module")
def straight():
    """40 steps of the direct path, device-only and with a host tier."""
    return {host: _run(STEPS, host=host)[0] for host in (0, 1000)}


@pytest.mark.parametrize("host", [0, 1000], ids=["device", "host_tier"])
@pytest.mark.parametrize("prefetch", [0, 1, 2, 4])
@pytest.mark.parametrize("saver", ["tf", "mxrec"])
def test_save_with_planned_batches_restores_to_the_straight_run(straight, tmp_path, saver,
                                                                 prefetch, host):
    save, restore = (_tf_saver if saver == "tf" else _mxrec_saver)(str(tmp_path / "ckpt"))
    _run(20, save=save, modify=True, prefetch=prefetch, host=host)
    got, _ = _run(20, restore=restore, modify=True, prefetch=prefetch, skip=20, host=host)
    _close(got, straight[host])


def test_a_save_holds_no_planned_batch(tmp_path):
    """The host state saved with batches planned is the state after the step."""
    terminate_config_initializer()
    with tf.Graph().as_default():
        model = Model(modify=True, prefetch=4)
        with _v1.Session() as sess:
            sess.run(_v1.global_variables_initializer())
            sess.run(model.start)
            for _ in range(3):
                sess.run(model.train_op)
            engine = loader.engine()
            wait_for_planned_batches(model.table, 4)  # prefetch 4: four batches planned
            saved = engine.export_state(model.table.table_key)
    seen = DATA[0][: 3 * BATCH].ravel()
    keys, counts = np.unique(seen, return_counts=True)
    assert sorted(saved["keys"].tolist()) == keys.tolist()
    got = dict(zip(saved["keys"].tolist(), saved["counts"].tolist()))
    assert [got[k] for k in keys.tolist()] == counts.tolist()
    admitted = {k for k, c in zip(keys.tolist(), counts.tolist()) if c >= 2}
    assert {k for k, r in zip(saved["keys"].tolist(), saved["rows"].tolist()) if r >= 0} \
        == admitted
    assert saved["next_row"] == len(admitted)
    assert saved["newest_timestamp"] == 20


@pytest.mark.parametrize("host", [0, 1000], ids=["device", "host_tier"])
@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_evaluation_between_steps_equals_the_direct_path(prefetch, host):
    want_probe, want = _run(STEPS, eval_every=5, host=host)
    got_probe, got = _run(STEPS, eval_every=5, modify=True, prefetch=prefetch, host=host)
    assert len(got) == len(want) == STEPS // 5
    for step, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"evaluation {step}")
    _close(got_probe, want_probe)


class EvictionModel:
    """What eviction and shrink must keep, in NumPy terms, independent of the engine.

    Per ID: admission count and last-seen time from trained batches, shrink age and whether a
    batch planned since the last shrink touched it, and the batch that created its record.
    Batches are planned in order, `prefetch` ahead of the step. A planned batch's IDs are never
    removed; otherwise evict removes IDs last seen before newest trained time - max_age, and
    shrink those unseen for `threshold` shrinks. A save shows the step boundary: records a
    planned batch created are left out, counts are those of trained batches.
    """

    def __init__(self):
        self.records = {}
        self.planned = 0
        self.removed = 0
        self.protected = 0  # removals a planned batch prevented

    @staticmethod
    def batch(b):
        return DATA[0][b * BATCH:(b + 1) * BATCH].ravel().tolist()

    def plan(self, upto):
        for b in range(self.planned, upto):
            for key in self.batch(b):
                record = self.records.setdefault(
                    key, {"count": 0, "last": None, "age": 0, "seen": False, "created": b})
                record["seen"] = True
        self.planned = upto

    def train(self, b):
        for key in self.batch(b):
            self.records[key]["count"] += 1
            self.records[key]["last"] = int(DATA[2][b * BATCH])

    def remove(self, kind, trained, limit):
        pending = {k for b in range(trained, self.planned) for k in self.batch(b)}
        if kind == "evict":
            oldest_kept = int(DATA[2][(trained - 1) * BATCH]) - limit
            due = [k for k, r in self.records.items()
                   if r["last"] is not None and r["last"] < oldest_kept]
        else:
            for r in self.records.values():
                r["age"] = 0 if r["seen"] else r["age"] + 1
                r["seen"] = False
            due = [k for k, r in self.records.items() if r["age"] >= limit]
        gone = [k for k in due if k not in pending]
        self.protected += len(due) - len(gone)
        self.removed += len(gone)
        for k in gone:
            del self.records[k]
        return len(gone)

    def boundary(self, trained):
        """{ID: count} of the records a save at this step holds."""
        return {k: r["count"] for k, r in self.records.items() if r["created"] < trained}


def _evict_every_step(kind, with_eval, prefetch, lookups, model_check=None):
    def after_step(model, step, sess):
        if with_eval:  # three evaluation batches between steps
            for _ in range(3):
                model.evaluate(sess)
        wait_for_planned_batches(model.table, lookups * min(prefetch, STEPS - step))
        removed = model.table.evict(20) if kind == "evict" else model.table.shrink(2)
        if model_check is not None:
            model_check.plan(min(step + prefetch, STEPS))
            model_check.train(step - 1)
            assert removed == model_check.remove(kind, step, 20 if kind == "evict" else 2), step
            saved = loader.engine().export_state(model.table.table_key, 0, False)
            want = model_check.boundary(step)
            got = dict(zip(saved["keys"].tolist(), saved["counts"].tolist()))
            assert got == want, f"step {step}"
            admitted = {k for k, r in zip(saved["keys"].tolist(), saved["rows"].tolist())
                        if r >= 0}
            assert admitted == {k for k, c in want.items() if c >= 2}, f"step {step}"

    return after_step


@pytest.mark.parametrize("kind", ["evict", "shrink"])
@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_eviction_protects_exactly_the_planned_batches(prefetch, kind):
    """Both arms run the same prefetched eviction (with and without evaluation batches between
    steps); the arm with evaluation also checks, after every step, the removed count and the
    saved IDs, counts and admissions against `EvictionModel`, which knows nothing of the engine."""
    options = dict(modify=True, prefetch=prefetch, lookups=2, eviction=20)
    want, _ = _run(STEPS, after_step=_evict_every_step(kind, False, prefetch, 2), **options)
    reference = EvictionModel()
    got, _ = _run(STEPS, after_step=_evict_every_step(kind, True, prefetch, 2, reference),
                  **options)
    _close(got, want)
    assert reference.planned == STEPS
    # Not a run where nothing happens: IDs went, and planned batches kept some that were due.
    assert reference.removed > 0
    # Planning a batch marks its IDs seen for shrink, so an ID of a planned batch is due for
    # shrink(2) only after waiting two shrinks planned: with prefetch > 2.
    if kind == "evict" or prefetch > 2:
        assert reference.protected > 0, (kind, prefetch)


def test_eviction_never_removes_an_id_of_a_planned_batch():
    """Engine level: a pending batch's IDs survive any eviction until the batch commits."""
    init()
    key = create_table(tf.int64, 2, "t", _v1.zeros_initializer(),
                       device_vocabulary_size=8).table_key
    engine = loader.engine()
    engine.process([key], [np.array([1, 2], np.int64)], True, 0)            # trained
    (_, _, _, pending), = engine.process([key], [np.array([2, 3], np.int64)], True, 100,
                                         deferred=True)
    for _ in range(3):  # evaluation batches change nothing
        engine.process([key], [np.array([1, 2, 3], np.int64)], False, -1)
    # Newest trained time is 0: nothing is older. Planned: 2, 3 at t=100.
    assert engine.evict(key, 0) == 0
    assert engine.newest_timestamp(key) == 0
    # Evaluation reads 3 (admitted by the pending batch) as unseen.
    (rows, restore, _), = engine.process([key], [np.array([3, 1], np.int64)], False, -1)
    assert rows.tolist() == [0] and restore.tolist() == [1, 0]
    engine.commit(key, pending)
    assert engine.pending_batches(key) == 0
    assert engine.evict(key, 50) == 1     # 1 (t=0) goes; 2 and 3 were trained at t=100
    assert sorted(dict(zip(*engine.export_rows(key)))) == [2, 3]


def test_an_empty_training_batch_moves_the_batch_time():
    """A rank whose shard of a batch holds no ID of a table still sees the batch's time, as
    one process that trained the batch does, so both evict the same IDs; the deferred empty
    batch's time counts once it commits, as any planned batch's."""
    init()
    key = create_table(tf.int64, 2, "t", _v1.zeros_initializer(),
                       device_vocabulary_size=8).table_key
    engine = loader.engine()
    engine.process([key], [np.array([1, 2], np.int64)], True, 10)
    engine.process([key], [np.zeros(0, np.int64)], False, 50)      # evaluation: no change
    assert engine.newest_timestamp(key) == 10
    engine.process([key], [np.zeros(0, np.int64)], True, 40)
    assert engine.newest_timestamp(key) == 40
    assert engine.evict(key, 20) == 2                                # 1 and 2 (t=10) go
    (_, _, _, pending), = engine.process([key], [np.zeros(0, np.int64)], True, 90,
                                         deferred=True)
    assert pending > 0 and engine.newest_timestamp(key) == 40        # planned, not trained
    engine.commit(key, pending)
    assert engine.pending_batches(key) == 0 and engine.newest_timestamp(key) == 90


@needs_estimator
def test_estimator_checkpoint_with_planned_batches(tmp_path):
    """Estimator.train 20 steps, then 20 more (a new graph restoring the checkpoint),
    with the graph modifier at prefetch 2, equals 40 straight steps of the direct path."""

    def input_fn(skip):
        def make():
            ids, labels, times = DATA
            dataset = tf.data.Dataset.from_tensor_slices(({"ids": ids, "t": times}, labels))
            return dataset.batch(BATCH).skip(skip)
        return make

    def model_fn(features, labels, mode, params):
        table = create_table(tf.int64, DIM, "t",
                             _v1.truncated_normal_initializer(stddev=0.1, seed=7),
                             device_vocabulary_size=POOL + 8)
        add_timestamp(features["t"])
        emb = sparse_lookup(table, features["ids"], access_and_evict_config=dict(
            access_threshold=2), modify_graph=params["modify"], is_train=mode == "train")
        weights = _v1.get_variable("w", [DIM, 1], initializer=_v1.ones_initializer())
        logits = tf.matmul(tf.reduce_sum(emb, 1), weights)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=labels[:, None], logits=logits))
        dense, sparse = get_dense_and_sparse_variable()
        train_op = tf.group(
            _v1.train.GradientDescentOptimizer(0.2).minimize(
                loss, var_list=dense, global_step=_v1.train.get_or_create_global_step()),
            adagrad.create_hash_optimizer(0.2).apply_gradients(
                zip(tf.gradients(loss, sparse), sparse)))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def train(model_dir, modify, chunks):
        terminate_config_initializer()
        init(prefetch_batch_number=2 if modify else 0)
        estimator = tf.estimator.Estimator(model_fn, model_dir=str(model_dir),
                                           params={"modify": modify})
        hooks = [GraphModifierHook()] if modify else []
        done = 0
        for steps in chunks:
            estimator.train(input_fn(done), steps=steps, hooks=hooks)
            done += steps
        reader = tf.train.load_checkpoint(str(model_dir))
        return reader.get_tensor("w"), reader.get_tensor("t")

    want_w, want_table = train(tmp_path / "straight", False, [STEPS])
    got_w, got_table = train(tmp_path / "split", True, [20, 20])
    _close(got_w, want_w)
    _close(got_table, want_table)


def test_removal_log_holds_only_what_a_delta_needs():
    """Removals are logged only for IDs a save of a full/delta chain holds, only once a chain
    exists, and every save of the chain prunes them; the delta lists exactly those."""
    init()
    key = create_table(tf.int64, 2, "t", _v1.zeros_initializer(),
                       device_vocabulary_size=64).table_key
    engine = loader.engine()
    engine.process([key], [np.array([1, 2, 3], np.int64)], True, 0)
    assert engine.evict(key, 0) == 0
    engine.process([key], [np.array([4], np.int64)], True, 10)
    assert engine.evict(key, 5) == 3          # 1, 2, 3: no chain, nothing logged
    assert engine.removed_log_size(key) == 0
    engine.process([key], [np.array([5, 6], np.int64)], True, 20)
    full = engine.export_state(key, 0, delta_chain=True)     # holds 4, 5, 6
    engine.prune_removed_log(key, int(full["epoch"]))
    engine.process([key], [np.array([7, 8], np.int64)], True, 40)
    engine.process([key], [np.array([8], np.int64)], True, 60)
    assert engine.evict(key, 15) == 4         # 4, 5, 6 (saved) and 7 (never saved)
    assert engine.removed_log_size(key) == 3
    delta = engine.export_state(key, int(full["epoch"]), delta_chain=True)
    assert sorted(delta["removed"].tolist()) == [4, 5, 6]
    assert sorted(delta["keys"].tolist()) == [8]
    engine.prune_removed_log(key, int(delta["epoch"]))
    assert engine.removed_log_size(key) == 0

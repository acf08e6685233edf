"""Feature admission and eviction (issue 4): exact semantics on scripted streams.

Most tests run the direct path with init(prefetch_batch_number=2): the key stage runs in the
step, and eviction keeps the IDs of the last prefetch_batch_number + 2 = 4 key-stage batches of
a table (train and eval batches alike). Tables use a constant initializer and the loss is
reduce_sum(emb), so every occurrence of an admitted ID contributes a gradient of 1 per column
and the expected values follow by hand (SGD: row -= lr * occurrences in the batch).
"""

import importlib
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from support import read_scalars

from mxrec._lib import loader
from mxrec.core import entry as paddle_entry
from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup
from mxrec.hooks import EvictHook, TableStatsHook
from mxrec.optimizers import adagrad, ftrl, gradient_descent, lazy_adam, momentum
from mxrec.util.ops import import_host_pipeline_ops
from mxrec.util.variable import get_dense_and_sparse_variable

_v1 = tf.compat.v1
DIM = 2
LR = 0.1
PREFETCH = 2


def _session_config():
    return _v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)


class Net:
    """One table, a train lookup fed by placeholders (ids [None], batch times [None]) and,
    optionally, an eval lookup; loss = reduce_sum(emb), trained by a hash optimizer."""

    def __init__(self, config=None, capacity=16, init_value=1.0, optimizer=None,
                 timestamp=True, eval_lookup=False, padding_keys=None, name="t",
                 global_step=None):
        self.table = create_table(tf.int64, DIM, name, _v1.constant_initializer(init_value),
                                  device_vocabulary_size=capacity, padding_keys=padding_keys)
        if eval_lookup:
            # Built before add_timestamp: evaluation needs no batch time.
            self.eval_ids = _v1.placeholder(tf.int64, [None], name="eval_ids")
            self.eval_emb = sparse_lookup(self.table, self.eval_ids, is_train=False,
                                          access_and_evict_config=config)
        self.ts = None
        if timestamp:
            self.ts = _v1.placeholder(tf.int64, [None], name="ts")
            add_timestamp(self.ts)
        self.ids = _v1.placeholder(tf.int64, [None], name="ids")
        self.emb = sparse_lookup(self.table, self.ids, access_and_evict_config=config)
        loss = tf.reduce_sum(self.emb)
        self.optimizer = optimizer or gradient_descent.create_hash_optimizer(LR)
        _, sparse = get_dense_and_sparse_variable()
        self.train_op = self.optimizer.apply_gradients(
            zip(tf.gradients(loss, sparse), sparse), global_step=global_step)

    def feed(self, ids, t=None):
        feed = {self.ids: np.asarray(ids, np.int64)}
        if self.ts is not None:
            feed[self.ts] = np.atleast_1d(np.asarray(t, np.int64))
        return feed

    def step(self, sess, ids, t=None):
        """One training step; returns the lookup's first column (columns are all equal)."""
        emb, _ = sess.run([self.emb, self.train_op], self.feed(ids, t))
        np.testing.assert_array_equal(emb[:, 0], emb[:, 1])
        return emb[:, 0]

    def evaluate(self, sess, ids):
        emb = sess.run(self.eval_emb, {self.eval_ids: np.asarray(ids, np.int64)})
        return emb[:, 0]

    def rows(self):
        ids, rows = self.table.export_rows()
        return dict(zip(ids.tolist(), rows.tolist()))

    def stats(self):
        return self.table.stats()


@pytest.fixture
def session():
    sessions = []

    def _make():
        sess = _v1.Session(config=_session_config())
        sess.run(_v1.global_variables_initializer())
        sessions.append(sess)
        return sess

    yield _make
    for sess in sessions:
        sess.close()


def _close(actual, expected):
    np.testing.assert_allclose(actual, np.asarray(expected, np.float32), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# The scripted stream: counts, timestamps, admission, eviction with in-flight protection,
# row reuse, lookups and statistics after every step.
# --------------------------------------------------------------------------------------------


def test_scripted_stream_admission_eviction_and_reuse(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=2, eviction_threshold=10, faae_coefficient=1),
              capacity=4, eval_lookup=True)
    hook = EvictHook(evict_enable=True, evict_time_interval=None, evict_step_interval=None)
    sess = session()

    def check(**expected):
        got = net.stats()
        assert {k: got[k] for k in expected} == expected, got

    # stamp 1, t=100: counts 1:1 2:2 3:1 -> 2 admitted in this batch (row 0), looks up the
    # initializer and is trained with both occurrences; 1 and 3 look up as zeros.
    _close(net.step(sess, [1, 2, 2, 3], [100, 97]), [0, 1, 1, 0])
    assert net.rows() == {2: 0}
    check(rows_in_use=1, ids_tracked=3, ids_seen=4, admitted=1, rejected=2, evicted=0,
          train_batches=1, eval_batches=0, capacity=4)
    # stamp 2, t=101: 1 reaches 2 -> row 1. 2 is 1 - 0.2.
    _close(net.step(sess, [1, 2, 4], [101]), [1.0, 0.8, 0])
    assert net.rows() == {2: 0, 1: 1}
    check(rows_in_use=2, ids_tracked=4, ids_seen=7, admitted=2, rejected=3)
    # stamp 3, t=102: 3 reaches 2 -> row 2; 5 counts 1.
    _close(net.step(sess, [3, 5], [102]), [1.0, 0])
    assert net.rows() == {2: 0, 1: 1, 3: 2}
    check(rows_in_use=3, ids_tracked=5, ids_seen=9, admitted=3, rejected=4)
    # stamp 4, evaluation: reads rows, never counts or inserts (99 unseen, 4 not admitted).
    _close(net.evaluate(sess, [4, 1, 99, 2]), [0, 0.9, 0, 0.7])
    check(rows_in_use=3, ids_tracked=5, ids_seen=9, admitted=3, rejected=4,
          train_batches=3, eval_batches=1)
    # stamp 5, t=103: 6 counts 1. Nothing is older than 103 - 10.
    _close(net.step(sess, [6], [103]), [0])
    assert hook.evict_now() == 0
    # t=111: nothing is older than 101 (1 and 4 were last trained at 101; the evaluation
    # read 1 and 4 later, which neither refreshes nor protects them).
    _close(net.step(sess, [2], [111]), [0.7])
    assert hook.evict_now() == 0
    check(rows_in_use=3, ids_tracked=6, evicted=0)
    # t=112: 1 (row 1 freed) and 4 (never admitted), last seen at 101, go. Every batch of
    # the direct path has run its step: nothing else is protected.
    _close(net.step(sess, [7], [112]), [0])
    assert hook.evict_now() == 2
    assert net.rows() == {2: 0, 3: 2}
    check(rows_in_use=2, ids_tracked=5, evicted=2, admitted=3)
    # t=113: 3 (row 2 freed) and 5, last seen at 102, go.
    _close(net.step(sess, [8], [113]), [0])
    assert hook.evict_now() == 2
    assert net.rows() == {2: 0}
    check(rows_in_use=1, ids_tracked=4, evicted=4)
    assert hook.evicted_total == 4
    # t=123 (7 rejected occurrences so far): 3 and 1 return; their counts restarted, two
    # occurrences admit them again. Freed rows are reused last-freed first: 3 gets row 2
    # (which held 3 = 0.9), 1 gets row 1 (which held 1 = 0.9); both look up as the
    # initializer again.
    _close(net.step(sess, [3, 3, 1, 1, 9], [123]), [1, 1, 1, 1, 0])
    assert net.rows() == {2: 0, 3: 2, 1: 1}
    check(rows_in_use=3, admitted=5, evicted=4, ids_tracked=7, rejected=7 + 1)
    # stamp 10, t=124: 5 returns once: its count restarted at 1, so it is not admitted.
    _close(net.step(sess, [3, 5, 1], [124]), [0.8, 0, 0.8])
    assert net.rows() == {2: 0, 3: 2, 1: 1}
    # Device rows: row 0 = ID 2, rows 1, 2 trained from the initializer, row 3 never used.
    table = sess.run(net.table.variable)
    _close(table[:, 0], [0.6, 0.7, 0.7, 1.0])
    _close(table[:, 1], table[:, 0])
    assert loader.engine().newest_timestamp(net.table.table_key) == 124


def test_batch_time_is_max_of_timestamp_tensor_and_wall_clock_without_one(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    with_ts = Net(dict(access_threshold=1, eviction_threshold=5), name="a")
    ids_b = _v1.placeholder(tf.int64, [None])
    _v1.get_default_graph().clear_collection("ASCEND_TIMESTAMP")
    table_b = create_table(tf.int64, DIM, "b", _v1.constant_initializer(0.0),
                           device_vocabulary_size=8)
    emb_b = sparse_lookup(table_b, ids_b, access_and_evict_config=dict(access_threshold=1))
    sess = session()
    with_ts.step(sess, [1], [7, 30, 12])
    assert loader.engine().newest_timestamp(with_ts.table.table_key) == 30
    # An older batch does not move the newest time back.
    with_ts.step(sess, [2], [3])
    assert loader.engine().newest_timestamp(with_ts.table.table_key) == 30
    before = int(time.time())
    sess.run(emb_b, {ids_b: [1]})
    after = int(time.time())
    assert before <= loader.engine().newest_timestamp(table_b.table_key) <= after + 1


def test_scripted_random_stream_matches_python_model(mx, session):
    """A longer random stream with repeats, timestamps and periodic eviction, compared step by
    step with a plain-Python model of count admission, last-seen eviction and LIFO row reuse."""
    mx(prefetch_batch_number=PREFETCH)
    access, max_age, coef = 3, 6, 1
    net = Net(dict(access_threshold=access, eviction_threshold=max_age,
                   faae_coefficient=coef), capacity=64)
    hook = EvictHook(evict_enable=True, evict_time_interval=None, evict_step_interval=None)
    sess = session()
    rng = np.random.default_rng(3)

    counts, last_seen, stamp_of, row_of, value = {}, {}, {}, {}, {}
    free, next_row, stamp, newest = [], 0, 0, -1
    for step in range(40):
        t = step
        batch = rng.integers(0, 30, size=rng.integers(1, 12)) ** 2 % 37
        stamp += 1
        newest = max(newest, t)
        for key in batch.tolist():
            counts[key] = counts.get(key, 0) + coef
            last_seen[key] = t
            stamp_of[key] = stamp
        new = [key for key in dict.fromkeys(batch.tolist())
               if key not in row_of and counts[key] >= access]
        for key in new:
            value[key] = 1.0
        expected = [value[k] if k in row_of or k in new else 0.0 for k in batch.tolist()]
        got = net.step(sess, batch, [t])
        _close(got, expected)
        # New IDs take freed rows first (which freed row: the engine's order within one
        # eviction), then never-used rows in order of first occurrence.
        engine_rows = net.rows()
        for key in new:
            if free:
                assert engine_rows[key] in free
                free.remove(engine_rows[key])
            else:
                assert engine_rows[key] == next_row
                next_row += 1
            row_of[key] = engine_rows[key]
        for key in batch.tolist():
            if key in row_of:
                value[key] -= LR
        assert net.rows() == row_of
        if step % 5 == 4:
            gone = [k for k in counts if last_seen[k] < newest - max_age
]
            assert hook.evict_now() == len(gone)
            for key in gone:
                del counts[key], last_seen[key], stamp_of[key]
                if key in row_of:
                    free.append(row_of.pop(key))
                    del value[key]
            assert net.rows() == row_of
            stats = net.stats()
            assert stats["rows_in_use"] == len(row_of)
            assert stats["ids_tracked"] == len(counts)
    assert net.stats()["evicted"] > 0
    table = sess.run(net.table.variable)
    for key, row in row_of.items():
        _close(table[row], [value[key]] * DIM)


# --------------------------------------------------------------------------------------------
# Non-admitted IDs get no update.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opt_name", ["adagrad", "lazy_adam"])
def test_non_admitted_ids_get_no_update_and_slots_untouched(mx, session, opt_name):
    mx(prefetch_batch_number=PREFETCH)
    opt = (adagrad.create_hash_optimizer(learning_rate=0.1, initial_accumulator_value=0.9)
           if opt_name == "adagrad" else lazy_adam.create_hash_optimizer(learning_rate=0.1))
    net = Net(dict(access_threshold=3), capacity=8, init_value=0.5, optimizer=opt)
    slot_names = ["accumulator"] if opt_name == "adagrad" else ["m", "v"]
    slots = [opt.get_slot(net.table.variable, name) for name in slot_names]
    sess = session()
    initial_slots = sess.run(slots)
    # 5, 6, 7 and 8 never reach 3; 1 reaches 3 at the second batch (row 0).
    _close(net.step(sess, [1, 1, 5, 6], [1]), [0, 0, 0, 0])
    _close(net.step(sess, [5, 1, 7, 6], [2]), [0, 0.5, 0, 0])
    got = net.step(sess, [7, 8, 1], [3])
    _close(got[:2], [0, 0])
    assert net.rows() == {1: 0}
    table, *slot_values = sess.run([net.table.variable] + slots)
    # Every row but 0 keeps its initial value, every slot row but 0 its initial value.
    _close(table[1:], np.full((7, DIM), 0.5))
    for value, initial in zip(slot_values, initial_slots):
        np.testing.assert_array_equal(value[1:], initial[1:])
    if opt_name == "adagrad":
        # Row 0 trained twice with gradient 1: accumulator 0.9 + 1 + 1.
        _close(slot_values[0][0], [2.9, 2.9])
        expected = 0.5 - 0.1 / np.sqrt(1.9) - 0.1 / np.sqrt(2.9)
        np.testing.assert_allclose(table[0], [expected] * DIM, rtol=1e-6)
    stats = net.stats()
    assert stats["rows_in_use"] == 1 and stats["admitted"] == 1
    assert stats["rejected"] == 4 + 3 + 2


# --------------------------------------------------------------------------------------------
# EvictHook inside MonitoredSession / MonitoredTrainingSession.
# --------------------------------------------------------------------------------------------


def test_evict_hook_by_steps_in_monitored_training_session(mx):
    """Batches and their times come from a tf.data iterator."""
    mx(prefetch_batch_number=PREFETCH)
    batches = np.array([[1, 1, 2], [3, 3, 3], [4, 4, 4], [5, 5, 5], [6, 6, 6], [7, 7, 7],
                        [8, 8, 8], [9, 9, 9]], np.int64)
    times = np.array([0, 1, 2, 100, 101, 102, 103, 104], np.int64)
    data = tf.data.Dataset.from_tensor_slices((batches, times))
    ids, t = _v1.data.make_one_shot_iterator(data).get_next()
    add_timestamp(t)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(1.0),
                         device_vocabulary_size=16)
    emb = sparse_lookup(table, ids,
                        access_and_evict_config=dict(access_threshold=1, eviction_threshold=50))
    gs = _v1.train.get_or_create_global_step()
    _, sparse = get_dense_and_sparse_variable()
    train_op = gradient_descent.create_hash_optimizer(LR).apply_gradients(
        zip(tf.gradients(tf.reduce_sum(emb), sparse), sparse), global_step=gs)
    hook = EvictHook(evict_enable=True, evict_time_interval=None, evict_step_interval=3)
    evicted_after = []
    rows_after = []
    with _v1.train.MonitoredTrainingSession(hooks=[hook], config=_session_config(),
                                            log_step_count_steps=None,
                                            save_summaries_steps=None) as sess:
        while not sess.should_stop():
            sess.run(train_op)
            evicted_after.append(table.stats()["evicted"])
            rows_after.append(sorted(dict(zip(*table.export_rows()))))
    # Step 3 (t=2): nothing is old. Step 6 (t=102, cutoff 52): 1, 2, 3, 4 are old and go
    # (the direct path has no batch waiting for its step). Step 8 is not a multiple of 3.
    assert evicted_after == [0, 0, 0, 0, 0, 4, 4, 4]
    assert rows_after[4] == [1, 2, 3, 4, 5, 6]
    assert rows_after[5] == [5, 6, 7]
    assert rows_after[-1] == [5, 6, 7, 8, 9]
    assert hook.evicted_total == 4


class _FakeClock:
    """The hook's `time` module: monotonic() returns what the test set, so whether an
    eviction is due by wall-clock time does not depend on the machine's speed."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def test_evict_hook_by_time_in_monitored_session(mx, monkeypatch):
    clock = _FakeClock()
    # EvictHook's own module reads the clock (mx_rec's feature_process path re-exports it).
    monkeypatch.setattr(importlib.import_module(EvictHook.__module__), "time", clock)
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=1, eviction_threshold=5))
    hook = EvictHook(evict_enable=True, evict_time_interval=1.0, evict_step_interval=None)
    creator = _v1.train.ChiefSessionCreator(config=_session_config())
    with _v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
        for i, key in enumerate([1, 2, 3, 4]):
            clock.now += 0.125  # 0.5 s in all: never due (all steps of the clock are exact floats)
            sess.run(net.train_op, net.feed([key], i))
        # No eviction ran (and any would have found nothing older than newest - 5).
        assert net.stats()["evicted"] == 0
        assert hook.evicted_total == 0
        clock.now += 0.5  # 1 s since the session began: due
        sess.run(net.train_op, net.feed([5], 100))
        # Due by time: 1, 2, 3, 4 (t <= 3 < 100 - 5) go.
        assert net.stats()["evicted"] == 4
        assert sorted(net.rows()) == [5]
        clock.now += 0.75  # 0.75 s since that eviction: not due
        sess.run(net.train_op, net.feed([6], 200))
        assert net.stats()["evicted"] == 4
        assert sorted(net.rows()) == [5, 6]
        clock.now += 0.25  # 1 s: due; 5 (t=100 < 203 - 5) goes, 6 (t=200) stays
        sess.run(net.train_op, net.feed([7], 203))
        assert net.stats()["evicted"] == 5
        assert sorted(net.rows()) == [6, 7]
    assert hook.evicted_total == 5


def test_evict_hook_disabled_and_tables_without_eviction_threshold(mx):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=1), name="no_eviction")
    hooks = [EvictHook(evict_enable=False, evict_step_interval=1),
             EvictHook(evict_enable=True, evict_step_interval=1)]
    creator = _v1.train.ChiefSessionCreator(config=_session_config())
    with _v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
        for i in range(8):
            sess.run(net.train_op, net.feed([i], i * 1000))
    assert net.stats()["evicted"] == 0
    assert hooks[1].evict_now() == 0
    # A direct call does evict (the hook only skips tables without an eviction_threshold):
    # IDs 0..6 are older than the newest time.
    assert net.table.evict(0) == 7


def test_direct_path_and_evaluation_protect_nothing(mx, session):
    mx(prefetch_batch_number=0)
    net = Net(dict(access_threshold=1, eviction_threshold=0), eval_lookup=True)
    hook = EvictHook(evict_enable=True, evict_step_interval=1)
    sess = session()
    net.step(sess, [1], [0])
    net.step(sess, [2], [1])
    net.evaluate(sess, [1])   # an evaluation batch protects nothing
    net.step(sess, [3], [2])
    assert hook.evict_now() == 2  # 1 and 2 are older than the newest time, 2
    assert sorted(net.rows()) == [3]
    net.step(sess, [3], [3])
    assert hook.evict_now() == 0
    assert sorted(net.rows()) == [3]


# --------------------------------------------------------------------------------------------
# set_threshold
# --------------------------------------------------------------------------------------------


def test_set_threshold_to_new_values(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=5))
    value = _v1.placeholder(tf.int64, [])
    set_op = import_host_pipeline_ops().set_threshold(value, emb_name="t", ids_name="t_lookup")
    sess = session()
    _close(net.step(sess, [1, 1, 2], [0]), [0, 0, 0])   # 1:2 2:1
    sess.run(set_op, {value: 2})
    # 1 reaches 3 >= 2 and 2 reaches 2 >= 2: both admitted in this batch.
    _close(net.step(sess, [1, 2, 3], [1]), [1, 1, 0])   # 3:1
    assert sorted(net.rows()) == [1, 2]
    sess.run(set_op, {value: 4})
    _close(net.step(sess, [3, 3], [2]), [0, 0])         # 3:3 < 4
    _close(net.step(sess, [3], [3]), [1])               # 3:4
    assert sorted(net.rows()) == [1, 2, 3]
    # float and int32 thresholds are accepted too.
    for threshold in (tf.constant(6.0), tf.constant(6, tf.int32)):
        sess.run(import_host_pipeline_ops().set_threshold(threshold, emb_name="t"))
    _close(net.step(sess, [4, 4, 4, 4, 4], [4]), [0] * 5)
    _close(net.step(sess, [4], [5]), [1])


def test_set_threshold_checks_ids_name(mx):
    """ids_name must name one of the table's lookups: a typo is an error, not ignored."""
    mx()
    Net(dict(access_threshold=5))
    ops = import_host_pipeline_ops()
    with pytest.raises(ValueError, match="no lookup named 'ids'.*'t_lookup'"):
        ops.set_threshold(tf.constant(2), emb_name="t", ids_name="ids")
    with pytest.raises(ValueError, match="no table named 'nope'"):
        ops.set_threshold(tf.constant(2), emb_name="nope")
    assert ops.set_threshold(tf.constant(2), emb_name="t", ids_name="t_lookup") is not None


def test_set_threshold_zero_freezes_counts(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=4))
    ops = import_host_pipeline_ops()
    sess = session()
    _close(net.step(sess, [1, 1, 1, 2], [0]), [0, 0, 0, 0])      # 1:3 2:1
    sess.run(ops.set_threshold(tf.constant(3), emb_name="t"))
    sess.run(ops.set_threshold(tf.constant(0), emb_name="t"))
    # Frozen at threshold 3: 1 is admitted on its count so far; 2 and the new 7 do not count.
    got = net.step(sess, [1, 2, 2, 2, 2, 7, 7, 7, 7, 7], [1])
    _close(got, [1] + [0] * 9)
    assert sorted(net.rows()) == [1]
    got = net.step(sess, [2, 2, 2, 7, 7, 7], [2])
    _close(got, [0] * 6)
    stats = net.stats()
    assert stats["ids_tracked"] == 3 and stats["rows_in_use"] == 1
    assert stats["ids_seen"] == 4 + 10 + 6
    # A non-zero threshold resumes counting: 2 reaches 1 + 1 = 2 (admitted), 7 and 8 reach 1;
    # 7 reaches 2 at its next sight.
    sess.run(ops.set_threshold(tf.constant(2), emb_name="t"))
    _close(net.step(sess, [2, 7, 8], [3]), [1, 0, 0])
    _close(net.step(sess, [7], [4]), [1])
    assert sorted(net.rows()) == [1, 2, 7]


def test_set_threshold_errors(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    Net(dict(access_threshold=2))
    ops = import_host_pipeline_ops()
    with pytest.raises(ValueError, match="nope"):
        ops.set_threshold(tf.constant(1), emb_name="nope")
    negative = ops.set_threshold(tf.constant(-1), emb_name="t")
    sess = session()
    with pytest.raises(tf.errors.InvalidArgumentError, match="threshold"):
        sess.run(negative)


# --------------------------------------------------------------------------------------------
# faae_coefficient, padding keys, evaluation
# --------------------------------------------------------------------------------------------


def test_faae_coefficient_weights_each_occurrence(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    weighted = Net(dict(access_threshold=4, faae_coefficient=2), name="weighted")
    ids_u = _v1.placeholder(tf.int64, [None])
    table_u = create_table(tf.int64, DIM, "unweighted", _v1.constant_initializer(1.0),
                           device_vocabulary_size=16)
    emb_u = sparse_lookup(table_u, ids_u,
                          access_and_evict_config=dict(access_threshold=4, faae_coefficient=1))
    sess = session()
    for ids, expect_w, expect_u in (([1, 1, 2], [1, 1, 0], [0, 0, 0]),   # w 1:4 2:2
                                    ([2, 3], [1, 0], [0, 0]),            # w 2:4 3:2
                                    ([1, 1, 3], [0.8, 0.8, 1], [1, 1, 0])):  # u 1:4
        _close(weighted.step(sess, ids, [0]), expect_w)
        got_u = sess.run(emb_u, {ids_u: ids, weighted.ts: [0]})[:, 0]
        _close(got_u, expect_u)
    assert sorted(weighted.rows()) == [1, 2, 3]
    assert sorted(dict(zip(*table_u.export_rows()))) == [1]


def test_padding_keys_never_counted_admitted_or_updated(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=1, eviction_threshold=0), capacity=4,
              padding_keys=[0, -1], eval_lookup=True)
    sess = session()
    for i in range(3):
        _close(net.step(sess, [0, 5, -1, 0], [i]), [0, 1 - LR * i, 0, 0])
    assert net.rows() == {5: 0}
    stats = net.stats()
    assert stats["ids_seen"] == 3 and stats["rejected"] == 0
    assert stats["ids_tracked"] == 1 and stats["rows_in_use"] == 1
    _close(net.evaluate(sess, [0, -1, 5]), [0, 0, 1 - 3 * LR])
    _close(sess.run(net.table.variable)[1:], np.ones((3, DIM)))
    # A batch of padding only.
    _close(net.step(sess, [0, 0, -1], [9]), [0, 0, 0])
    assert net.rows() == {5: 0} and net.stats()["ids_seen"] == 3


def test_evaluation_never_counts_inserts_or_refreshes_last_seen(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=3, eviction_threshold=10), eval_lookup=True)
    sess = session()
    _close(net.step(sess, [7], [0]), [0])                 # 7:1
    _close(net.evaluate(sess, [7, 7, 7, 8, 8, 8]), [0] * 6)
    assert net.stats()["ids_tracked"] == 1 and net.stats()["eval_batches"] == 1
    # Had evaluation counted, 7 would reach 3 with one more occurrence; it needs two.
    _close(net.step(sess, [7], [1]), [0])
    assert net.rows() == {}
    _close(net.step(sess, [7], [2]), [1])
    assert net.rows() == {7: 0}
    # Evaluation neither refreshes last_seen nor protects: 7 (t=2) goes though an evaluation
    # read it after the training batches at t=100 and 101.
    for t in (100, 101):
        net.step(sess, [9], [t])
    net.evaluate(sess, [7])
    assert net.table.evict(10) == 1
    for t in (102, 103, 104, 105):
        net.step(sess, [9], [t])
    assert net.table.evict(10) == 0
    assert sorted(net.rows()) == [9]
    stats = net.stats()
    assert stats["train_batches"] == 9 and stats["eval_batches"] == 2


# --------------------------------------------------------------------------------------------
# Returning IDs start from the initializer with fresh optimizer slots.
# --------------------------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(LR),
    "adagrad": lambda: adagrad.create_hash_optimizer(learning_rate=LR,
                                                     initial_accumulator_value=0.9),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(learning_rate=LR),
    "ftrl": lambda: ftrl.create_hash_optimizer(learning_rate=LR, initial_accumulator_value=0.3,
                                               l1_regularization_strength=0.01),
    "momentum": lambda: momentum.create_hash_optimizer(learning_rate=LR, momentum=0.9),
}
SLOTS = {"sgd": [], "adagrad": ["accumulator"], "lazy_adam": ["m", "v"],
         "ftrl": ["accum", "linear"], "momentum": ["momentum"]}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_evicted_id_returns_from_initializer_with_fresh_slots(mx, session, opt_name):
    mx(prefetch_batch_number=PREFETCH)
    opt = OPTIMIZERS[opt_name]()
    net = Net(dict(access_threshold=1, eviction_threshold=10), capacity=8, init_value=0.5,
              optimizer=opt)
    slots = [opt.get_slot(net.table.variable, name) for name in SLOTS[opt_name]]
    sess = session()
    initial_slots = sess.run(slots)
    net.step(sess, [1, 1, 1], [0])                       # 1 -> row 0, trained hard
    net.step(sess, [1], [1])
    for t in (100, 101, 102, 103):
        net.step(sess, [2], [t])                         # 2 -> row 1
    assert net.table.evict(10) == 1
    assert net.rows() == {2: 1}
    trained = sess.run([net.table.variable] + slots)
    assert not np.allclose(trained[0][0], 0.5)           # row 0 still holds 1's old values
    # 1 returns and takes its freed row 0; 9 is new and takes the never-used row 2. Same
    # gradient for both: their rows and every slot must agree, and equal one step from scratch.
    got = net.step(sess, [1, 9], [104])
    _close(got, [0.5, 0.5])
    assert net.rows() == {1: 0, 2: 1, 9: 2}
    after = sess.run([net.table.variable] + slots)
    for value in after:
        np.testing.assert_allclose(value[0], value[2], rtol=1e-6, atol=1e-7)
    if opt_name == "adagrad":
        _close(after[1][0], [1.9, 1.9])
        np.testing.assert_allclose(after[0][0], [0.5 - LR / np.sqrt(1.9)] * DIM, rtol=1e-6)
    if opt_name == "lazy_adam":
        _close(after[1][0], [0.1, 0.1])                  # m = (1 - beta1) * g, fresh
        np.testing.assert_allclose(after[2][0], [0.001] * DIM, rtol=0, atol=1e-7)
    for value, initial in zip(after[1:], initial_slots):
        np.testing.assert_array_equal(value[3:], initial[3:])


def test_evicted_id_must_be_admitted_again(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=3, eviction_threshold=1), capacity=4)
    sess = session()
    _close(net.step(sess, [1, 1, 1], [0]), [1, 1, 1])
    for t in (10, 11, 12, 13):
        net.step(sess, [2], [t])
    assert net.table.evict(1) == 1   # 1 (row 0); 2 in the window
    _close(net.step(sess, [1, 1], [14]), [0, 0])               # count 2 < 3
    _close(net.step(sess, [1], [15]), [1])                      # count 3, row 0 reinitialised
    assert net.rows() == {1: 0, 2: 1}                           # 2 was admitted at t=12
    assert net.stats()["admitted"] == 3


# --------------------------------------------------------------------------------------------
# PaddlePaddle-style entries
# --------------------------------------------------------------------------------------------

PROB_IDS = np.arange(2000, dtype=np.int64) * 7919 - 5000


def _probability_run(seed, probability=0.3):
    from mxrec.util.initialize import init, terminate_config_initializer
    terminate_config_initializer()
    _v1.reset_default_graph()
    init(prefetch_batch_number=PREFETCH)
    ids = _v1.placeholder(tf.int64, [None])
    emb = paddle_entry.sparse_embedding(ids, size=[2048, DIM], name="p",
                                        entry=paddle_entry.ProbabilityEntry(probability, seed),
                                        param_attr=_v1.constant_initializer(1.0))
    with _v1.Session(config=_session_config()) as sess:
        sess.run(_v1.global_variables_initializer())
        out = np.concatenate([sess.run(emb, {ids: chunk})[:, 0]
                              for chunk in np.array_split(PROB_IDS, 4)])
        # A second sight changes nothing: the decision is per ID, not per occurrence.
        again = sess.run(emb, {ids: PROB_IDS})[:, 0]
    table = _v1.get_collection("mxrec_sparse_tables")[0]._mxrec_table
    admitted = set(table.export_rows()[0].tolist())
    np.testing.assert_array_equal(np.isin(PROB_IDS, list(admitted)), out == 1.0)
    np.testing.assert_array_equal(again == 1.0, out == 1.0)
    terminate_config_initializer()
    _v1.reset_default_graph()
    return admitted


_SUBPROCESS = """
import sys
import numpy as np
from mxrec._lib import _mxrec_engine as e
e.create_table("sub/p", "p", 2, 2048)
e.configure_admission("sub/p", probability=0.3, seed=int(sys.argv[1]))
ids = np.arange(2000, dtype=np.int64) * 7919 - 5000
e.process(["sub/p"], [ids], True, 0)
print(" ".join(str(i) for i in sorted(e.export_rows("sub/p")[0].tolist())))
"""


def test_probability_entry_reproducible_per_seed():
    first = _probability_run(seed=7)
    second = _probability_run(seed=7)
    other = _probability_run(seed=8)
    assert first == second
    assert first != other
    for admitted in (first, other):
        assert abs(len(admitted) - 0.3 * len(PROB_IDS)) < 100  # 4.9 sigma
    # Another process, same seed, same IDs admitted.
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS, "7"], capture_output=True,
                         text=True, check=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert set(int(x) for x in out.stdout.split()) == first


def test_count_filter_entry_and_padding_idx(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    ids = _v1.placeholder(tf.int64, [None])
    emb = paddle_entry.sparse_embedding(ids, size=[16, DIM], padding_idx=0, name="c",
                                        entry=paddle_entry.CountFilterEntry(2),
                                        param_attr=_v1.constant_initializer(1.0))
    test_emb = paddle_entry.sparse_embedding(ids, size=[16, DIM], padding_idx=0, name="c",
                                             is_test=True)
    table = _v1.get_collection("mxrec_sparse_tables")[0]._mxrec_table
    assert len(_v1.get_collection("mxrec_sparse_tables")) == 1  # shared by name
    sess = session()
    _close(sess.run(emb, {ids: [3, 0, 4, 4]})[:, 0], [0, 0, 1, 1])
    _close(sess.run(test_emb, {ids: [3, 3, 3, 0, 4]})[:, 0], [0, 0, 0, 0, 1])
    _close(sess.run(emb, {ids: [3, 0, 0]})[:, 0], [1, 0, 0])
    assert sorted(dict(zip(*table.export_rows()))) == [3, 4]
    assert table.stats()["ids_seen"] == 4


def test_entry_errors(mx):
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            paddle_entry.CountFilterEntry(bad)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            paddle_entry.ProbabilityEntry(bad)
    mx()
    ids = _v1.placeholder(tf.int64, [None])
    with pytest.raises(TypeError):
        paddle_entry.sparse_embedding(ids, size=[4, DIM], entry="count")
    with pytest.raises(ValueError):
        paddle_entry.sparse_embedding(ids, size=[4])


# --------------------------------------------------------------------------------------------
# Shrink
# --------------------------------------------------------------------------------------------


def test_table_shrink_ages_ids_per_call(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=1), capacity=8)
    sess = session()
    net.step(sess, [1, 2, 3], [0])
    assert net.table.shrink(2) == 0          # all seen since: age 0
    net.step(sess, [1], [0])
    assert net.table.shrink(2) == 0          # 1: 0, 2: 1, 3: 1
    net.step(sess, [2], [0])
    assert net.table.shrink(2) == 1          # 2: 0, 1: 1, 3: 2 -> 3 goes
    assert sorted(net.rows()) == [1, 2]
    assert net.table.shrink(2) == 1          # 1: 2 -> goes; 2: 1
    assert net.table.shrink(2) == 1          # 2: 2 -> goes
    assert net.rows() == {} and net.stats()["rows_in_use"] == 0
    assert net.stats()["evicted"] == 3
    # Rows come back last-freed first and start from the initializer.
    _close(net.step(sess, [4, 5], [0]), [1, 1])
    assert net.rows() == {4: 1, 5: 0}


def test_table_shrink_counts_not_admitted_ids_and_resets_count(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=2), capacity=8)
    sess = session()
    net.step(sess, [1], [0])
    assert net.table.shrink(1) == 0
    assert net.table.shrink(1) == 1
    assert net.stats()["ids_tracked"] == 0
    _close(net.step(sess, [1], [0]), [0])    # count restarted at 1
    _close(net.step(sess, [1], [0]), [1])


def test_entry_shrink_ages_every_table(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=1), capacity=8)
    other = create_table(tf.int64, DIM, "other", _v1.constant_initializer(0.0),
                         device_vocabulary_size=4)
    sess = session()
    for key in (1, 2, 3, 4, 5):
        net.step(sess, [key], [0])
    assert paddle_entry.shrink(1) == 0       # all seen since the last shrink
    assert paddle_entry.shrink(1) == 5       # all age 1: the direct path has nothing pending
    net.step(sess, [6], [0])
    assert paddle_entry.shrink(1) == 0       # 6 is new (age 0)
    assert sorted(net.rows()) == [6]
    assert other.stats()["evicted"] == 0


def test_shrink_threshold_above_255(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=1), capacity=8)
    sess = session()
    net.step(sess, [1], [0])
    removed = sum(net.table.shrink(300) for _ in range(301))
    assert removed == 1


# --------------------------------------------------------------------------------------------
# USE_COMBINE_FAAE
# --------------------------------------------------------------------------------------------


def test_combined_faae_counts_across_tables(mx, session):
    """One count per ID over both tables. Under USE_COMBINE_FAAE the key stages of all
    tables are chained in lookup order, so a step runs a's before b's."""
    mx(prefetch_batch_number=PREFETCH, use_combine_faae=True)
    a = Net(dict(access_threshold=2), name="a")
    ids_b = _v1.placeholder(tf.int64, [None])
    table_b = create_table(tf.int64, DIM, "b", _v1.constant_initializer(1.0),
                           device_vocabulary_size=16)
    emb_b = sparse_lookup(table_b, ids_b, access_and_evict_config=dict(access_threshold=2))
    sess = session()

    def step(a_ids, b_ids):
        feed = {**a.feed(a_ids, [0]), ids_b: np.asarray(b_ids, np.int64)}
        emb_a, got_b, _ = sess.run([a.emb, emb_b, a.train_op], feed)
        return emb_a[:, 0], got_b[:, 0]

    _close(step([5], [])[0], [0])             # combined 5:1
    _close(step([], [5])[1], [1])             # combined 5:2 -> b admits
    _close(step([5], [])[0], [1])             # 5:3 -> a admits
    got_a, got_b = step([7], [7])             # 7:1 in a, then 7:2 in b: only b admits
    _close(got_a, [0])
    _close(got_b, [1])


def test_combined_faae_evicted_id_count_restarts(mx, session):
    mx(prefetch_batch_number=PREFETCH, use_combine_faae=True)
    net = Net(dict(access_threshold=2, eviction_threshold=1), capacity=4)
    sess = session()
    _close(net.step(sess, [5, 5], [0]), [1, 1])
    for t in (10, 11, 12, 13):
        net.step(sess, [6], [t])
    assert net.table.evict(1) == 1   # 5; 6 was seen at the newest time
    assert net.rows() == {6: 1}
    _close(net.step(sess, [5], [14]), [0])   # count restarts at 1 < 2


# --------------------------------------------------------------------------------------------
# Memory and statistics
# --------------------------------------------------------------------------------------------


def test_rows_in_use_tracks_admitted_ids_on_a_long_tail_stream(mx, session):
    """90% of IDs appear once, 10% three times; access_threshold=2."""
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=2, eviction_threshold=20), capacity=400)
    hook = EvictHook(evict_enable=True, evict_time_interval=None, evict_step_interval=None)
    sess = session()
    rng = np.random.default_rng(0)
    once = rng.permutation(np.arange(3000, dtype=np.int64) + 10**9)[:2700]
    repeated = np.arange(300, dtype=np.int64)
    stream = np.concatenate([once, np.repeat(repeated, 3)])
    rng.shuffle(stream)
    batches = np.array_split(stream, 30)
    for step, batch in enumerate(batches):
        net.step(sess, batch, [step])
        stats = net.stats()
        assert stats["rows_in_use"] == stats["admitted"] == len(net.rows())
        assert stats["rows_in_use"] <= 300
    stats = net.stats()
    assert stats["ids_seen"] == 3600
    assert stats["ids_tracked"] == 3000
    repeats_admitted = int(np.sum(np.isin(repeated, list(net.rows()))))
    assert stats["admitted"] == repeats_admitted
    assert stats["admitted"] > 250                         # nearly every repeated ID
    assert stats["rows_in_use"] < stats["ids_tracked"] / 9
    assert stats["rejected"] >= 2700
    # A later stretch of time: eviction frees the rows of IDs that stopped appearing. `evicted`
    # counts every removed host record, never-admitted ones included, so rows in use equal
    # admitted minus the *admitted* IDs removed (here all of them), not admitted - evicted.
    had_rows = set(net.rows())
    for step in range(4):
        net.step(sess, [10**12 + step], [100 + step])
    removed = hook.evict_now()
    stats = net.stats()
    assert removed == 3000 and stats["evicted"] == 3000 and stats["ids_tracked"] == 4
    assert stats["rows_in_use"] == 0 and net.rows() == {}
    assert stats["admitted"] - len(had_rows) == stats["rows_in_use"]


def test_table_stats_hook_writes_scalars(mx, tmp_path):
    mx(prefetch_batch_number=PREFETCH)
    net = Net(dict(access_threshold=2, eviction_threshold=100))
    hook = TableStatsHook(str(tmp_path), every_n_steps=2)
    creator = _v1.train.ChiefSessionCreator(config=_session_config())
    seen = {}
    with _v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
        for step, ids in enumerate([[1, 1, 2], [2, 3], [4], [5, 5, 5, 1]], start=1):
            sess.run(net.train_op, net.feed(ids, step))
            seen[step] = net.stats()
    values = read_scalars(tmp_path)
    stat_names = ("rows_in_use", "ids_tracked", "ids_seen", "admitted", "rejected", "evicted")
    assert set(values) == {f"mxrec/t/{name}" for name in stat_names}
    for name in stat_names:
        assert values[f"mxrec/t/{name}"] == {2: seen[2][name], 4: seen[4][name]}, name
    assert values["mxrec/t/rows_in_use"] == {2: 2, 4: 3}
    assert values["mxrec/t/ids_seen"] == {2: 5, 4: 10}


def test_table_stats_hook_arguments(tmp_path):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            TableStatsHook(str(tmp_path), every_n_steps=bad)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config, match", [
    (dict(eviction_threshold=10), "needs access_threshold"),
    (dict(access_threshold=1, eviction=10), "unknown"),
    (dict(access_threshold=-1), "access_threshold"),
    (dict(access_threshold=1, eviction_threshold=-5), "eviction_threshold"),
    (dict(access_threshold=1, faae_coefficient=0), "faae_coefficient"),
    (dict(access_threshold=1.5), "access_threshold"),
    (dict(access_threshold=True), "access_threshold"),
])
def test_access_and_evict_config_errors(mx, config, match):
    mx()
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                         device_vocabulary_size=4)
    with pytest.raises(ValueError, match=match):
        sparse_lookup(table, tf.constant([1], tf.int64), access_and_evict_config=config)


def test_access_and_evict_config_other_errors(mx):
    mx()
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                         device_vocabulary_size=4)
    ids = tf.constant([1], tf.int64)
    with pytest.raises(TypeError):
        sparse_lookup(table, ids, access_and_evict_config=[("access_threshold", 1)])
    sparse_lookup(table, ids, access_and_evict_config=dict(access_threshold=1))
    with pytest.raises(ValueError, match="different"):
        sparse_lookup(table, ids, access_and_evict_config=dict(access_threshold=2))
    with pytest.raises(ValueError):
        table.evict(-1)
    with pytest.raises(ValueError):
        table.shrink(0)


def test_eviction_rejected_with_dynamic_expansion(mx):
    mx(use_dynamic_expansion=True)
    table = create_table(tf.int64, DIM, "t", _v1.constant_initializer(0.0),
                         device_vocabulary_size=4)
    with pytest.raises(ValueError, match="dynamic_expansion"):
        sparse_lookup(table, tf.constant([1], tf.int64),
                      access_and_evict_config=dict(access_threshold=1, eviction_threshold=5))
    # Admission alone is fine.
    sparse_lookup(table, tf.constant([1], tf.int64),
                  access_and_evict_config=dict(access_threshold=1))


def test_evict_hook_arguments():
    with pytest.raises(TypeError):
        EvictHook(evict_enable="yes")
    with pytest.raises(ValueError):
        EvictHook(evict_enable=True, evict_time_interval=0)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError):
            EvictHook(evict_enable=True, evict_step_interval=bad)


def _static_shape_initializer(shape, dtype=tf.float32, partition_info=None):
    """Makes the variable's rows, but no rows for a count known only at run time (like
    Keras' Glorot, which needs the fan-in)."""
    del partition_info
    if isinstance(shape, tf.Tensor):
        raise TypeError("static_shape_initializer needs a static shape")
    return tf.ones(shape, dtype)


def test_initializer_that_cannot_refill_rows_shows_its_error(mx):
    mx()
    table = create_table(tf.int64, DIM, "t", _static_shape_initializer, device_vocabulary_size=4)
    sparse_lookup(table, tf.constant([1], tf.int64),
                  access_and_evict_config=dict(access_threshold=1))  # no eviction: fine
    assert not table.can_reinitialize
    for call in (lambda: table.evict(5), lambda: table.shrink(5)):
        with pytest.raises(ValueError, match="cannot evict.*TypeError: "
                           "static_shape_initializer needs a static shape") as info:
            call()
        assert isinstance(info.value.__cause__, TypeError)
    # Eviction configured on such a table fails where the lookup is built, not at the
    # first eviction hours later, and says why.
    evicting = create_table(tf.int64, DIM, "u", _static_shape_initializer,
                            device_vocabulary_size=4)
    with pytest.raises(ValueError, match="'u': eviction.*TypeError: static_shape_initializer "
                       "needs a static shape") as info:
        sparse_lookup(evicting, tf.constant([1], tf.int64),
                      access_and_evict_config=dict(access_threshold=1, eviction_threshold=5))
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(ValueError, match="'u' cannot evict.*static shape"):
        EvictHook(evict_enable=True).evict_now()


# --------------------------------------------------------------------------------------------
# Regressions: bugs found while writing these tests, fixed since.
# --------------------------------------------------------------------------------------------


def test_failed_full_batch_does_not_leak_stale_rows(mx, session):
    mx(prefetch_batch_number=0)
    net = Net(dict(access_threshold=1, eviction_threshold=0), capacity=2)
    sess = session()
    net.step(sess, [1, 1, 1, 2], [0])                  # 1 -> row 0 (0.7), 2 -> row 1
    net.step(sess, [2], [1])
    net.step(sess, [2], [2])
    assert net.table.evict(0) == 1   # 1 goes, row 0 is freed
    with pytest.raises(tf.errors.ResourceExhaustedError):
        net.step(sess, [3, 4], [3])                     # 3 takes row 0, 4 finds none
    # Whatever the engine keeps, new ID 3 must start from the initializer.
    _close(net.step(sess, [3], [4]), [1.0])


def test_second_graph_does_not_reset_admission(mx, session):
    mx(prefetch_batch_number=PREFETCH)
    ids = _v1.placeholder(tf.int64, [None])
    emb = paddle_entry.sparse_embedding(ids, size=[16, DIM], name="c",
                                        entry=paddle_entry.CountFilterEntry(3),
                                        param_attr=_v1.constant_initializer(1.0))
    sess = session()
    _close(sess.run(emb, {ids: [1]})[:, 0], [0])
    with tf.Graph().as_default():                       # the test program
        paddle_entry.sparse_embedding(_v1.placeholder(tf.int64, [None]), size=[16, DIM],
                                      name="c", is_test=True,
                                      param_attr=_v1.constant_initializer(1.0))
    # Training goes on in the first graph: 2 is seen once, threshold 3.
    _close(sess.run(emb, {ids: [2]})[:, 0], [0])


def test_combined_faae_admission_does_not_depend_on_scheduling():
    """Same model, same batch; only the readiness of the two lookups' IDs differs (one of them
    arrives 50 ms late). Which table admits must not change."""
    from mxrec.util.initialize import init, terminate_config_initializer

    def late(ids):
        return _v1.py_func(lambda x: (time.sleep(0.05), x)[1], [ids], tf.int64, stateful=True)

    outcomes = []
    for delayed in ("a", "b"):
        init(prefetch_batch_number=PREFETCH, use_combine_faae=True)
        with tf.Graph().as_default():
            ids = _v1.placeholder(tf.int64, [1])
            embs = []
            for name in ("a", "b"):
                table = create_table(tf.int64, DIM, name, _v1.constant_initializer(1.0),
                                     device_vocabulary_size=8)
                table_ids = late(ids) if name == delayed else ids
                table_ids.set_shape([1])
                embs.append(sparse_lookup(table, table_ids,
                                          access_and_evict_config=dict(access_threshold=2)))
            config = _v1.ConfigProto(intra_op_parallelism_threads=2,
                                     inter_op_parallelism_threads=4)
            with _v1.Session(config=config) as sess:
                sess.run(_v1.global_variables_initializer())
                a, b = sess.run(embs, {ids: [5]})
        outcomes.append((float(a[0, 0]), float(b[0, 0])))
        terminate_config_initializer()
    assert sorted(outcomes[0]) == [0.0, 1.0]   # exactly one table admits 5 in this step
    assert outcomes[0] == outcomes[1], outcomes

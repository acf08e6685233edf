"""send_back.send_back_all (the graph modifier's fused send-back: one buffer per send group of
(dtype, dim, gradient scale), one all-to-all per dtype each way) against each lookup's own
send_back on the direct path's exchange, and against NumPy, forward and backward, in one
process that plays one rank of N: the collectives are replaced by the identity (every peer
sent what this rank sent), so the layouts are exercised, not MPI (the multi-rank runs are
tests/test_multiworker_fused_exchange.py)."""

import types

import numpy as np
import pytest
import tensorflow as tf

from mxrec.distributed import communication, id_exchange, routing, send_back, sharded_pipeline
from mxrec.graph import modifier


def _table(name, dim):
    return types.SimpleNamespace(table_name=name, dim=dim, key_dtype=tf.int64,
                                 all2all_gradients_op="sum_gradients_and_div_by_ranksize")


@pytest.fixture
def fake_ranks(monkeypatch):
    moved = []

    def alltoall(t, grad_scale=None):
        moved.append(t.dtype)
        return tf.identity(t)

    def use(size):
        monkeypatch.setattr(communication, "get_rank_size", lambda: size)
        monkeypatch.setattr(communication, "allreduce", lambda t, reduction="sum": tf.identity(t))
        monkeypatch.setattr(communication, "alltoall", alltoall)
        return moved

    return use


def _lookups(rng):
    """(IDs, dim, embedding dtype, gradient scale) per lookup: lookups 0, 1 and 4 share a
    send group (float32, dim 4, 0.5), 3 is float64 of the same dim, one lookup is empty, IDs
    repeat, and the int64 extremes are covered."""
    return [(rng.integers(0, 50, (8, 3)), 4, tf.float32, 0.5),
            (np.zeros((0,), np.int64), 4, tf.float32, 0.5),
            (rng.integers(0, 7, (5,)), 2, tf.float32, None),
            (rng.integers(-2**62, 2**62, (4, 2)), 4, tf.float64, 0.5),
            (rng.integers(0, 3, (6, 2)), 4, tf.float32, 0.5),
            (rng.integers(0, 50, (7,)), 8, tf.float64, None)]


def _embedding(ids, dim, dtype):
    """The owner's embedding of each ID: small integers, so every sum is exact."""
    base = tf.cast(tf.math.floormod(ids, 13), dtype)[:, None]
    return base * tf.range(1, dim + 1, dtype=dtype)[None, :]


def _embedding_numpy(ids, dim):
    return (np.mod(ids, 13)[:, None] * np.arange(1, dim + 1)[None, :]).astype(np.float64)


def _weights(rng, lookups):
    return [rng.integers(-3, 4, np.shape(ids) + (dim,)).astype(np.float64)
            for ids, dim, _, _ in lookups]


def _build(lookups, weights, size, is_train, fused, passes):
    """Every lookup's send_back (fused: on exchange_all's exchanges placed in send groups),
    the losses of `passes` (lists of lookups each backward pass differentiates) and their
    gradients. Returns (exchanges, outs, d_embs per pass, groups, plans)."""
    tables = [_table(f"t{i}", dim) for i, (_, dim, _, _) in enumerate(lookups)]
    ids = [tf.constant(np.asarray(i, np.int64)) for i, _, _, _ in lookups]
    routes = [routing.route(t, size) for t in ids]
    keys = [(dtype, dim, scale) for _, dim, dtype, scale in lookups]
    groups = id_exchange.send_groups(keys) if fused else None
    if fused:
        planned = [id_exchange.PlannedLookup(f"lookup_{i}", t, None) for i, t in enumerate(tables)]
        exchanges, _, _ = id_exchange.exchange_all(planned, routes, [None] * len(lookups),
                                                   is_train, groups=groups)
    else:
        exchanges = [id_exchange.exchange(t, r, is_train, None) for t, r in zip(tables, routes)]
    embs = [_embedding(ex.owned, dim, dtype) for ex, (_, dim, dtype, _) in zip(exchanges,
                                                                               lookups)]
    outs = [send_back.send_back(t, emb, ex, r, i, scale)
            for t, emb, ex, r, i, (_, _, _, scale) in zip(tables, embs, exchanges, routes, ids,
                                                          lookups)]
    grads = []
    for used in passes:
        loss = tf.add_n([tf.reduce_sum(tf.cast(outs[i], tf.float64) * weights[i]) for i in used])
        found = tf.gradients(loss, [embs[i] for i in used])
        grads.append(dict(zip(used, found)))
    plans = send_back.plan_send_backs(exchanges, routes, groups) if fused else None
    return exchanges, outs, grads, groups, plans


def _expected_grad(owned, first, flat_ids, weight, scale):
    """d_emb by NumPy: each received ID's first copy gets the sum of the weights of this
    rank's flat IDs equal to it (every peer sent this rank's own buffer), times scale."""
    grad = np.zeros((len(owned), weight.shape[-1]))
    flat_w = weight.reshape(-1, weight.shape[-1])
    for row in first:
        grad[row] = flat_w[flat_ids == owned[row]].sum(axis=0)
    return grad * (1.0 if scale is None else scale)


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("is_train", [True, False])
def test_send_back_all_equals_each_lookup_and_numpy(fake_ranks, size, is_train):
    rng = np.random.default_rng(7 + size)
    lookups = _lookups(rng)
    weights = _weights(rng, lookups)
    # Two backward passes: one of every lookup, one that leaves lookups 1, 2 and 4 out (a
    # group member without a gradient in a pass sends zeros).
    passes = [list(range(len(lookups))), [0, 3, 5]]
    with tf.Graph().as_default():
        moved = fake_ranks(size)
        _, single_outs, single_grads, _, _ = _build(lookups, weights, size, is_train, False,
                                                    passes)
        exchanges, outs, grads, groups, plans = _build(lookups, weights, size, is_train, True,
                                                       passes)
        assert groups == [[0, 1, 4], [2], [3], [5]]
        del moved[:]
        pairs, gated = send_back.send_back_all(
            exchanges, groups, plans, [scale for _, _, _, scale in lookups],
            sharded_pipeline._gradient_scope)  # noqa: SLF001 (the pipeline's own grouping)
        assert not gated
        # One all-to-all per dtype forward and per dtype and backward pass.
        assert sorted(d.name for d in moved) == ["float32", "float32", "float32", "float64",
                                                 "float64", "float64"]
        new = {old.ref(): value for old, value in pairs}
        fused_outs = [new[ex.out.ref()] for ex in exchanges]
        fused_grads = [{i: new[g.ref()] for i, g in per_pass.items()} for per_pass in grads]
        assert len(pairs) == len(lookups) + sum(len(p) for p in passes)
        with tf.compat.v1.Session() as sess:
            got = sess.run([fused_outs, fused_grads, single_outs, single_grads,
                            [ex.owned for ex in exchanges], [ex.first for ex in exchanges]])
    fused_out, fused_grad, single_out, single_grad, owned, first = got
    for i, (ids, dim, dtype, scale) in enumerate(lookups):
        flat = np.asarray(ids, np.int64).reshape(-1)
        np.testing.assert_array_equal(fused_out[i], single_out[i].reshape(-1, dim))
        np.testing.assert_array_equal(fused_out[i], _embedding_numpy(flat, dim))
        assert fused_out[i].dtype == dtype.as_numpy_dtype
        for p, used in enumerate(passes):
            if i not in used:
                continue
            np.testing.assert_array_equal(fused_grad[p][i], single_grad[p][i])
            np.testing.assert_array_equal(
                fused_grad[p][i], _expected_grad(owned[i], first[i], flat, weights[i], scale))


def test_plan_send_backs_equals_plan_send_back_per_group(fake_ranks):
    rng = np.random.default_rng(3)
    lookups = _lookups(rng)
    with tf.Graph().as_default():
        fake_ranks(3)
        exchanges, _, _, groups, plans = _build(lookups, _weights(rng, lookups), 3, True,
                                                True, [])
        routes = [routing.route(tf.constant(np.asarray(i, np.int64)), 3)
                  for i, _, _, _ in lookups]
        single = [send_back.plan_send_back([exchanges[i] for i in g], [routes[i] for i in g])
                  for g in groups]
        fields = send_back.SendPlan.FIELDS
        with tf.compat.v1.Session() as sess:
            got, want = sess.run([[[getattr(p, f) for f in fields] for p in plans],
                                  [[getattr(p, f) for f in fields] for p in single]])
    for plan, reference in zip(got, want):
        for field, a, b in zip(fields, plan, reference):
            np.testing.assert_array_equal(a, b, err_msg=field)


def test_send_groups_by_key_in_order_of_first_use():
    keys = [("f32", 4, 0.5), None, ("f32", 8, 0.5), ("f32", 4, 0.5), ("f32", 4, None), None]
    assert id_exchange.send_groups(keys) == [[0, 3], [2], [4]]
    assert id_exchange.send_groups([None, None]) == []


@pytest.mark.parametrize("groups, message", [
    ([[0, 1], []], "an empty send group"),
    ([[0, 7]], "names lookup 7; the step has 2 lookups"),
    ([[0], [0, 1]], "lookup 0 is in two send groups"),
])
def test_bad_groups_are_refused(fake_ranks, groups, message):
    with tf.Graph().as_default():
        fake_ranks(2)
        routes = [routing.route(tf.range(4, dtype=tf.int64), 2) for _ in range(2)]
        planned = [id_exchange.PlannedLookup(f"l{i}", _table(f"t{i}", 4), None) for i in range(2)]
        with pytest.raises(ValueError, match=message):
            id_exchange.exchange_all(planned, routes, [None, None], True, groups=groups)


def test_send_back_all_refuses_a_mixed_group_and_a_lookup_without_send_back(fake_ranks):
    rng = np.random.default_rng(5)
    lookups = _lookups(rng)
    with tf.Graph().as_default():
        fake_ranks(2)
        exchanges, _, _, groups, plans = _build(lookups, _weights(rng, lookups), 2, True,
                                                True, [])
        scales = [scale for _, _, _, scale in lookups]
        mixed = [[0, 2]] + [g for g in groups if 0 not in g and 2 not in g]
        with pytest.raises(ValueError, match=r"send group \[0, 2\] mixes \(dtype, dim"):
            send_back.send_back_all(exchanges, mixed, plans[:len(mixed)], scales,
                                    lambda t: "")
        with pytest.raises(ValueError, match="one plan per group and one scale per lookup"):
            send_back.send_back_all(exchanges, groups, plans[:1], scales, lambda t: "")
        exchanges[4].out = None
        with pytest.raises(ValueError, match=r"lookups \[4\] have no send-back"):
            send_back.send_back_all(exchanges, groups, plans, scales, lambda t: "")


def _ancestors(tensors):
    """Every op `tensors` depend on, through data and control edges."""
    seen, stack = set(), [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def test_only_the_table_writes_wait_for_the_next_batchs_planning(fake_ranks):
    """With `after` (the graph modifier's planning of batch k + p), the gradients' exchange
    runs without waiting for it; the ops that write a gradient into a table do wait, and a
    gradient that nothing writes is read through an identity that waits (so a step that
    reads it still plans). Values are those of the ungated send-back."""
    rng = np.random.default_rng(11)
    lookups = _lookups(rng)
    weights = _weights(rng, lookups)
    with tf.Graph().as_default():
        fake_ranks(2)
        everything = [list(range(len(lookups)))]
        _, _, (single,), _, _ = _build(lookups, weights, 2, True, False, everything)
        exchanges, _, (per_pass,), groups, plans = _build(lookups, weights, 2, True, True,
                                                          everything)
        planned = tf.Variable(0, dtype=tf.int64)
        after = tf.identity(planned.assign_add(1))  # a tensor, as the pipeline's planning is
        tables, writes = {}, {}
        for i in (0, 3, 5):  # written to a table; the others are left unapplied
            old = per_pass[i]
            tables[i] = tf.Variable(tf.zeros(tf.shape(old), old.dtype), shape=[None, None])
            writes[i] = tf.raw_ops.ResourceScatterAdd(
                resource=tables[i].handle, indices=tf.range(tf.shape(old)[0]), updates=old)
        pairs, gated = send_back.send_back_all(
            exchanges, groups, plans, [scale for _, _, _, scale in lookups],
            sharded_pipeline._gradient_scope, after=[after])  # noqa: SLF001
        assert gated
        new = {old.ref(): value for old, value in pairs}
        for old in per_pass.values():  # the writes read the fused gradients, as in the step
            modifier._replace_uses(old, new[old.ref()])  # noqa: SLF001
        for i in writes:
            assert after.op in writes[i].control_inputs
            # What the write reads (the gradient all-to-all and all before it) does not.
            assert after.op not in _ancestors(list(writes[i].inputs))
        unwritten = [new[old.ref()] for i, old in per_pass.items() if i not in writes]
        assert unwritten and all(after.op in _ancestors([t]) for t in unwritten)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            reference = sess.run(single)
            assert sess.run(planned) == 0
            sess.run(list(writes.values()))
            assert sess.run(planned) == 1  # the writes ran the planning
            for i in writes:
                np.testing.assert_array_equal(sess.run(tables[i]), reference[i])
            got = sess.run(unwritten)
            assert sess.run(planned) == 2
        for value, i in zip(got, [i for i in per_pass if i not in writes]):
            np.testing.assert_array_equal(value, reference[i])

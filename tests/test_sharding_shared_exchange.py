"""id_exchange.shared_exchange: lookups of one IDs tensor on the direct path share the routing,
the ID exchange and the send-back's plan, and still give what each lookup's own exchange
gives, forward and backward, in one process that plays one rank of N (the collectives are
the identity, as in test_sharding_send_back_all). The multi-rank runs of a model that
looks its IDs up twice (wide & deep) are tests/test_streaming_ranks_equal.py."""

import re
import types

import numpy as np
import pytest
import tensorflow as tf

from mxrec.distributed import communication, id_exchange, replicated, routing, send_back


def _table(name, dim):
    return types.SimpleNamespace(table_name=name, dim=dim, key_dtype=tf.int64,
                                 all2all_gradients_op="sum_gradients_and_div_by_ranksize")


@pytest.fixture
def fake_ranks(monkeypatch):
    calls = {"allreduce": 0, "alltoall": 0}

    def allreduce(t, reduction="sum"):
        calls["allreduce"] += 1
        return tf.identity(t)

    def alltoall(t, grad_scale=None):
        calls["alltoall"] += 1
        return tf.identity(t)

    def use(size):
        monkeypatch.setattr(communication, "get_rank_size", lambda: size)
        monkeypatch.setattr(communication, "allreduce", allreduce)
        monkeypatch.setattr(communication, "alltoall", alltoall)
        return calls

    return use


def _owned_embedding(ids, dim):
    """The owner's embedding of each ID: small integers, so every sum is exact."""
    base = tf.cast(tf.math.floormod(ids, 13), tf.float32)[:, None]
    return base * tf.range(1, dim + 1, dtype=tf.float32)[None, :]


def _lookup(table, ids, routed, exchanged):
    owned = _owned_embedding(exchanged.owned, table.dim)
    out = send_back.send_back(table, owned, exchanged, routed, ids, 0.5)
    return owned, out


def _ops(graph, kind):
    return [op for op in graph.get_operations() if op.type == kind]


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("send_count", [None, 64])
def test_second_lookup_of_same_ids_shares_and_equals_its_own(fake_ranks, size, send_count):
    calls = fake_ranks(size)
    rng = np.random.default_rng(size)
    values = rng.integers(-2**62, 2**62, (16,))[rng.integers(0, 16, (9, 4))]  # repeats
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as sess:
        ids = tf.constant(values, tf.int64)
        deep, wide = _table("deep", 4), _table("wide", 1)
        routed_a, ex_a = id_exchange.shared_exchange(deep, ids, True, send_count)
        owned_a, out_a = _lookup(deep, ids, routed_a, ex_a)
        counted = dict(calls)
        routed_b, ex_b = id_exchange.shared_exchange(wide, ids, True, send_count)
        # Nothing more routed, agreed or exchanged; the plan is the first lookup's.
        assert calls["allreduce"] == counted["allreduce"]
        assert calls["alltoall"] == counted["alltoall"]
        assert routed_b is routed_a and ex_b is not ex_a
        assert ex_b.owned is ex_a.owned and ex_b.weights is ex_a.weights
        assert ex_b.plan is ex_a.plan and ex_b.backward == [] and ex_b.emb is None
        routes = len(_ops(graph, "MxrecRoute"))
        positions = len(_ops(graph, "MxrecSendPositions"))
        owned_b, out_b = _lookup(wide, ids, routed_b, ex_b)
        assert len(_ops(graph, "MxrecRoute")) == routes == 1
        assert len(_ops(graph, "MxrecSendPositions")) == positions == 1
        assert ex_b.emb is owned_b and ex_a.emb is owned_a  # each lookup its own record
        # The reference: the wide lookup through an exchange of its own.
        routed_c = routing.route(ids, size)
        ex_c = id_exchange.exchange(wide, routed_c, True, send_count)
        owned_c, out_c = _lookup(wide, ids, routed_c, ex_c)
        d_out = tf.cast(tf.reshape(tf.range(tf.size(out_b)), tf.shape(out_b)), tf.float32)
        grads = tf.gradients([out_b, out_c], [owned_b, owned_c], [d_out, d_out])
        got = sess.run({"b": (ex_b.owned, ex_b.weights, out_b, grads[0]),
                        "c": (ex_c.owned, ex_c.weights, out_c, grads[1]),
                        "a": out_a})
    for got_b, want_c in zip(got["b"], got["c"]):
        np.testing.assert_array_equal(got_b, want_c)
        assert got_b.dtype == want_c.dtype
    # NumPy: each position holds its ID's owner embedding.
    expect = (np.mod(values, 13)[..., None] * np.arange(1, 5)).astype(np.float32)
    np.testing.assert_array_equal(got["a"], expect)
    np.testing.assert_array_equal(got["b"][2], expect[..., :1])


def test_not_shared_across_ids_is_train_send_count_router_or_context(fake_ranks):
    fake_ranks(2)
    with tf.Graph().as_default() as graph:
        ids = tf.constant([[1, 2], [3, 1]], tf.int64)
        other = tf.constant([[1, 2], [3, 1]], tf.int64)
        table = _table("t", 4)
        routed, first = id_exchange.shared_exchange(table, ids, True, None)
        for kwargs in (dict(ids=other), dict(is_train=False), dict(send_count=8),
                       dict(router=replicated.route)):
            args = dict(table=table, ids=ids, is_train=True, send_count=None)
            args.update(kwargs)
            got_route, got = id_exchange.shared_exchange(**args)
            assert got_route is not routed and got.owned is not first.owned, kwargs
        # Inside a tf.cond the first exchange cannot be read: the branch builds its own.
        seen = []

        def branch():
            seen.append(id_exchange.shared_exchange(table, ids, True, None))
            return tf.constant(0)

        tf.cond(tf.constant(True), branch, lambda: tf.constant(1))
        assert seen[0][0] is not routed
        # The same key again outside: shared.
        again_route, again = id_exchange.shared_exchange(table, ids, True, None)
        assert again_route is routed and again.owned is first.owned
        # Routed in this graph: the first, other IDs, evaluation, send_count (the replicated
        # router is TF ops, the branch is a function graph of its own).
        assert len([op for op in graph.get_operations() if op.type == "MxrecRoute"]) == 4


def _reachable(tensors, limit=5000):
    seen, todo = set(), [t.op for t in tensors]
    while todo and len(seen) < limit:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return seen


@pytest.mark.parametrize("size", [1, 2, 3])
def test_shared_lookups_send_in_one_all_to_all_each_way(fake_ranks, size):
    """Three lookups of one IDs tensor: the two with the same gradient scale send their
    embeddings in one all-to-all and their gradients in one; the earlier lookup's own
    all-to-all is left unread. Values and gradients equal each lookup's own exchange."""
    calls = fake_ranks(size)
    rng = np.random.default_rng(10 + size)
    values = rng.integers(-2**62, 2**62, (20,))[rng.integers(0, 20, (7, 3))]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        ids = tf.constant(values, tf.int64)
        deep, wide, other = _table("deep", 4), _table("wide", 1), _table("other", 2)
        routed, ex_a = id_exchange.shared_exchange(deep, ids, True, None)
        owned_a, out_a = _lookup(deep, ids, routed, ex_a)
        _, ex_b = id_exchange.shared_exchange(wide, ids, True, None)
        owned_b, out_b = _lookup(wide, ids, routed, ex_b)
        _, ex_o = id_exchange.shared_exchange(other, ids, True, None)
        owned_o = _owned_embedding(ex_o.owned, 2)
        out_o = send_back.send_back(other, owned_o, ex_o, routed, ids, None)  # its own scale
        forward = [n for n in _reachable([out_a, out_b, out_o])
                   if re.search(r"alltoall(_\d+)?/Identity$", n)]
        assert len(forward) == 2, forward  # deep + wide together, other alone
        before = calls["alltoall"]
        d_a = tf.cast(tf.reshape(tf.range(tf.size(out_a)), tf.shape(out_a)), tf.float32)
        d_b = tf.cast(tf.reshape(tf.range(tf.size(out_b)), tf.shape(out_b)), tf.float32) - 5
        grads = tf.gradients([out_a, out_b], [owned_a, owned_b], [d_a, d_b])
        assert calls["alltoall"] - before == 1  # one backward all-to-all for both
        # References: each through an exchange of its own.
        ref = []
        for table, d in ((deep, d_a), (wide, d_b)):
            own_route = routing.route(ids, size)
            own = id_exchange.exchange(table, own_route, True, None)
            owned, out = _lookup(table, ids, own_route, own)
            ref.append((out, tf.gradients(out, owned, d)[0]))
        got = sess.run({"a": (out_a, grads[0]), "b": (out_b, grads[1]), "ref": ref,
                        "o": out_o})
    for mine, want in zip((got["a"], got["b"]), got["ref"]):
        for g, w in zip(mine, want):
            np.testing.assert_array_equal(g, w)
    expect = (np.mod(values, 13)[..., None] * np.arange(1, 5)).astype(np.float32)
    np.testing.assert_array_equal(got["a"][0], expect)
    np.testing.assert_array_equal(got["b"][0], expect[..., :1])
    np.testing.assert_array_equal(got["o"], expect[..., :2])

"""id_exchange.exchange_all (the graph modifier's fused ID exchange, vectorised over the
lookups) against `exchange` run lookup by lookup, the direct path's exchange, and against
NumPy, in one process that plays one rank of N: the collectives are replaced by the
identity (every peer sent what this rank sent), so the layouts are exercised, not MPI (the
multi-rank runs are tests/test_multiworker_fused_exchange.py)."""

import types

import numpy as np
import pytest
import tensorflow as tf

from mxrec.distributed import communication, id_exchange, routing, send_back


def _table(name, dim=4):
    return types.SimpleNamespace(table_name=name, dim=dim, key_dtype=tf.int64,
                                 all2all_gradients_op="sum_gradients_and_div_by_ranksize")


@pytest.fixture
def fake_ranks(monkeypatch):
    def use(size):
        monkeypatch.setattr(communication, "get_rank_size", lambda: size)
        monkeypatch.setattr(communication, "allreduce", lambda t, reduction="sum": tf.identity(t))
        monkeypatch.setattr(communication, "alltoall", lambda t, grad_scale=None: tf.identity(t))
    return use


def _batches(rng):
    # Different sizes, one empty lookup, repeated IDs (occurrence counts > 1).
    return [rng.integers(0, 50, (8, 3)), np.zeros((0,), np.int64), rng.integers(0, 7, (5,)),
            rng.integers(-2**62, 2**62, (4, 2)), rng.integers(0, 3, (6, 2))]


@pytest.fixture(params=[5, 1], ids=["5 lookups", "1 lookup"])
def lookups_used(request):
    return request.param


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("is_train", [True, False])
@pytest.mark.parametrize("send_count", [None, 64])
def test_exchange_all_equals_lookup_by_lookup(fake_ranks, lookups_used, size, is_train,
                                              send_count):
    fake_ranks(size)
    rng = np.random.default_rng(size)
    batches = _batches(rng)[:lookups_used]
    stamp_values = [5, None, None, 7, 3][:lookups_used]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        tables = [_table(f"t{i}") for i in range(len(batches))]
        routes = [routing.route(tf.constant(b, tf.int64), size) for b in batches]
        lookups = [id_exchange.PlannedLookup(f"lookup_{i}", t, send_count)
                   for i, t in enumerate(tables)]
        stamps = [None if v is None else tf.constant(v, tf.int64) for v in stamp_values]
        fused, times, (extra,) = id_exchange.exchange_all(
            lookups, routes, stamps, is_train, also=[tf.constant(-1, tf.int64)])
        single = [id_exchange.exchange(t, r, is_train, send_count) for t, r in zip(tables, routes)]
        fields = ("chunk", "valid", "owned", "first") + (("weights",) if is_train else ())
        assert all(e.weights is None for e in fused + single) or is_train
        got, want, pairs, times, extra = sess.run(
            ([{f: getattr(e, f) for f in fields} for e in fused],
             [{f: getattr(e, f) for f in fields} for e in single],
             [r.pairs for r in routes], [t for t in times if t is not None], extra))
    assert times == [v for v in stamp_values if v is not None] and extra == -1
    for i, (g, w) in enumerate(zip(got, want)):
        for field in fields:
            np.testing.assert_array_equal(g[field], w[field], err_msg=f"lookup {i} {field}")
            assert g[field].dtype == w[field].dtype, (i, field)
        # NumPy: with the identity for an all-to-all, peer q's row holds this rank's bucket
        # for q, so the owner receives every unique ID once, sorted by owner; in training
        # with its occurrences as its key-stage weight.
        ids, occurrences = pairs[i][:, 0], pairs[i][:, 1]
        np.testing.assert_array_equal(g["owned"], ids)
        np.testing.assert_array_equal(g["first"], np.arange(len(ids)))
        if is_train:
            np.testing.assert_array_equal(g["weights"], occurrences)
        assert g["chunk"] == (send_count or max(1, max(
            np.bincount(routing.owner_of_numpy(ids, size), minlength=size), default=0)))


def test_exchange_all_send_count_overflow_names_the_lookup(fake_ranks):
    fake_ranks(2)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        routes = [routing.route(tf.range(10, dtype=tf.int64), 2),
                  routing.route(tf.range(40, dtype=tf.int64), 2)]
        lookups = [id_exchange.PlannedLookup("small", _table("a"), None),
                   id_exchange.PlannedLookup("big", _table("b"), 3)]
        fused, _, _ = id_exchange.exchange_all(lookups, routes, [None, None], True)
        with pytest.raises(tf.errors.InvalidArgumentError) as failed:
            sess.run(fused[1].owned)
    message = str(failed.value).replace("\\'", "'")  # TF's messages escape quotes
    assert "sparse_lookup 'big' on table 'b'" in message
    assert "send_count=3" in message and "sparse_lookup 'small'" not in message


@pytest.mark.parametrize("size", [1, 2, 3])
def test_positions_gather_equals_the_route_and_its_gradient(size):
    """One gather by send_back.positions gives what gather_nd by `where`, the inverse of
    `order` and the gather by `index` give, forward and backward, bit for bit."""
    rng = np.random.default_rng(size)
    ids = rng.integers(0, 40, (16, 3))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        routed = routing.route(tf.constant(ids, tf.int64), size)
        chunk = tf.maximum(tf.reduce_max(routed.counts), 1)
        back = tf.constant(rng.normal(size=(size, 40, 5)).astype(np.float32))[:, :chunk]
        position = send_back.positions(routed, chunk)
        got = tf.gather(tf.reshape(back, [-1, 5]), position)
        local = tf.gather(tf.gather_nd(back, routed.where),
                          tf.math.invert_permutation(routed.order))
        want = tf.gather(local, routed.index)
        dy = tf.constant(rng.normal(size=(ids.size, 5)).astype(np.float32))
        (got_grad,), (want_grad,) = tf.gradients(got, [back], dy), tf.gradients(want, [back], dy)
        values = sess.run(dict(got=got, want=want, got_grad=tf.convert_to_tensor(got_grad),
                               want_grad=tf.convert_to_tensor(want_grad), back=back,
                               position=position))
    np.testing.assert_array_equal(values["got"], values["want"])
    np.testing.assert_array_equal(values["got_grad"], values["want_grad"])
    # NumPy: each ID's row is its owner's bucket at its rank among that owner's unique IDs.
    flat = ids.ravel()
    unique = list(dict.fromkeys(flat.tolist()))
    owner = routing.owner_of_numpy(np.array(unique), size)
    slot = {u: int(np.sum(owner[:i] == owner[i])) for i, u in enumerate(unique)}
    chunk = values["back"].shape[1]
    want_position = [int(owner[unique.index(v)]) * chunk + slot[v] for v in flat.tolist()]
    np.testing.assert_array_equal(values["position"], want_position)

"""Every op input of a wrong shape is an InvalidArgumentError naming the input, never a crash.

Inputs are fed through placeholders of unknown shape, so the ops' shape functions cannot
refuse them when the graph is built: the kernels must. Each case first runs the op with good
inputs (it must pass), then with one input replaced.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from mxrec._lib import loader

_v1 = tf.compat.v1
DIM = 4
_serial = itertools.count()


@pytest.fixture
def keys(engine):
    """Engine keys of a device-only table, a tiered table and a dynamic-expansion table."""
    prefix = f"test_op_inputs_{next(_serial)}/"
    names = {"plain": prefix + "plain", "tiered": prefix + "tiered", "dynamic": prefix + "dyn"}
    engine.create_table(key=names["plain"], name="plain", dim=DIM, capacity=100)
    engine.create_table(key=names["tiered"], name="tiered", dim=DIM, capacity=8,
                        host_capacity=16)
    engine.create_table(key=names["dynamic"], name="dyn", dim=DIM, capacity=2**31 - 1)
    engine.create_dynamic_store(key=names["dynamic"], name="dyn", dim=DIM, chunk_rows=256)
    yield names
    engine.drop_dynamic_stores(prefix)
    engine.drop_prefix(prefix)


def _i64(*values):
    return np.array(values, np.int64)


def _i32(*values):
    return np.array(values, np.int32)


def _f32(*values):
    return np.array(values, np.float32)


_NO_ROWS = np.zeros((0, DIM), np.float32)
_IMPORT = {  # a valid snapshot of two IDs with rows 0 and 1
    "keys": (tf.int64, _i64(1, 2)),
    "rows": (tf.int32, _i32(0, 1)),
    "counts": (tf.float32, _f32(1, 1)),
    "last_seen": (tf.int64, _i64(0, 0)),
    "free_rows": (tf.int32, _i32()),
    "meta": (tf.int64, _i64(2, 0, 0)),
    "threshold": (tf.float64, np.float64(0)),
}
_IMPORT_TIERED = {  # ID 1 on the device (row 0), ID 2 in the host tier
    **_IMPORT,
    "rows": (tf.int32, _i32(0, -1)),
    "meta": (tf.int64, _i64(1, 0, 0)),
    "in_host": (tf.int32, _i32(0, 1)),
    "lru_rows": (tf.int32, _i32(0)),
    "lru_ages": (tf.int64, _i64(0)),
    "tier_components": (tf.string, np.array([b"embedding"])),
    "tier_present": (tf.int64, _i64(1)),
    "tier_values": (tf.float32, np.ones((1, 1, DIM), np.float32)),
}
_SCALARS = ("lr", "beta1", "beta2", "epsilon", "beta1_power", "beta2_power")


def _lib():
    return loader.op_library()


def _key_stage(ph, k):
    return _lib().mxrec_key_stage(ids=[ph["ids"]], timestamp=ph["timestamp"], weights=[],
                                  table_keys=[k["plain"]])


def _lazy_adam(ph, k):
    return _lib().mxrec_dynamic_apply_lazy_adam(table_key=k["dynamic"], dim=DIM, m_slot="m",
                                                v_slot="v", **ph)


def _swap_in_place(ph, k):
    variable = _v1.get_variable("swap_table", initializer=np.zeros((8, DIM), np.float32),
                                use_resource=True)
    return _lib().mxrec_tier_swap_in_place(variable=variable.handle, table_key=k["tiered"], **ph)


# (op, {input: (dtype, good value)}, (bad input, value), message)
CASES = {
    "key_stage/timestamp": (
        _key_stage, {"ids": (tf.int64, _i64(1, 2)), "timestamp": (tf.int64, np.int64(5))},
        ("timestamp", _i64(5, 6)), "input 'timestamp' must be a scalar"),
    "key_stage/ids": (
        _key_stage, {"ids": (tf.int64, _i64(1, 2)), "timestamp": (tf.int64, np.int64(5))},
        ("ids", _i64(1, 2).reshape(1, 2)), "must be a vector"),
    "set_threshold/threshold": (
        lambda ph, k: _lib().mxrec_set_threshold(table_key=k["plain"], **ph),
        {"threshold": (tf.float32, np.float32(2))},
        ("threshold", _f32(2)), "input 'threshold' must be a scalar"),
    **{f"import/{name}": (
        lambda ph, k: _lib().mxrec_import_table(table_key=k["plain"], **ph), _IMPORT, bad, match)
       for name, bad, match in [
           ("keys", ("keys", _i64(1, 2).reshape(2, 1)), "input 'keys' must be a vector"),
           ("rows", ("rows", _i32(0)), "input 'rows' must have 2"),
           ("counts", ("counts", _f32(1, 1, 1)), "input 'counts' must have 2"),
           ("last_seen", ("last_seen", _i64(0)), "input 'last_seen' must have 2"),
           ("free_rows", ("free_rows", np.zeros((1, 1), np.int32)),
            "input 'free_rows' must be a vector"),
           ("meta_rank", ("meta", _i64(2, 0, 0).reshape(1, 3)), "input 'meta' must be a vector"),
           ("meta_length", ("meta", _i64(2, 0)), "input 'meta' must have 3"),
           ("threshold", ("threshold", np.zeros(1)), "input 'threshold' must be a scalar"),
       ]},
    **{f"import_tiered/{name}": (
        lambda ph, k: _lib().mxrec_import_table_tiered(table_key=k["tiered"], **ph),
        _IMPORT_TIERED, bad, match)
       for name, bad, match in [
           ("in_host_rank", ("in_host", _i32(0, 1).reshape(2, 1)),
            "input 'in_host' must be a vector"),
           ("in_host_length", ("in_host", _i32(1)), "input 'in_host' must have 2"),
           ("lru_rows", ("lru_rows", np.zeros((1, 1), np.int32)),
            "input 'lru_rows' must be a vector"),
           ("lru_ages", ("lru_ages", _i64(0, 0)), "input 'lru_ages' must have 1"),
           ("tier_components", ("tier_components", np.array([[b"embedding"]])),
            "input 'tier_components' must be a vector"),
           ("tier_present", ("tier_present", np.ones((1, 1), np.int64)),
            "input 'tier_present' must be a vector"),
           ("tier_values_rank", ("tier_values", np.ones((1, DIM), np.float32)),
            "input 'tier_values' must be of rank 3"),
           ("tier_values_ids", ("tier_values", np.ones((2, 1, DIM), np.float32)),
            "input 'tier_values' must have 1 .one per tier_present. in dimension 0"),
           ("tier_values_dim", ("tier_values", np.ones((1, 1, DIM + 1), np.float32)),
            r"input 'tier_values' must have 4 .the table's dim. in dimension 2"),
           ("threshold", ("threshold", np.zeros(2)), "input 'threshold' must be a scalar"),
       ]},
    "tier_swap/rows": (
        lambda ph, k: _lib().mxrec_tier_swap(table_key=k["tiered"], **ph),
        {"rows": (tf.int32, _i32()), "current": (tf.float32, _NO_ROWS),
         "fresh_values": (tf.float32, np.float32(0))},
        ("rows", np.zeros((0, 1), np.int32)), "input 'rows' must be a vector"),
    "tier_swap/current": (
        lambda ph, k: _lib().mxrec_tier_swap(table_key=k["tiered"], **ph),
        {"rows": (tf.int32, _i32()), "current": (tf.float32, _NO_ROWS),
         "fresh_values": (tf.float32, np.float32(0))},
        ("current", np.zeros((1, DIM), np.float32)), "current must be"),
    "tier_swap/fresh_values": (
        lambda ph, k: _lib().mxrec_tier_swap(table_key=k["tiered"], **ph),
        {"rows": (tf.int32, _i32()), "current": (tf.float32, _NO_ROWS),
         "fresh_values": (tf.float32, np.float32(0))},
        ("fresh_values", np.zeros((1, DIM), np.float32)), "fresh_values must be"),
    "tier_swap_in_place/fresh_values": (
        _swap_in_place,
        {"rows": (tf.int32, _i32()), "fresh_values": (tf.float32, np.float32(0))},
        ("fresh_values", np.zeros(DIM, np.float32)), "fresh_values must be"),
    "tier_swap_in_place/rows": (
        _swap_in_place,
        {"rows": (tf.int32, _i32()), "fresh_values": (tf.float32, np.float32(0))},
        ("rows", np.zeros((1, 1), np.int32)), "input 'rows' must be a vector"),
    "tier_read/ids": (
        lambda ph, k: _lib().mxrec_tier_read(table_key=k["tiered"], **ph),
        {"ids": (tf.int64, _i64(1, 2))},
        ("ids", _i64(1, 2).reshape(2, 1)), "input 'ids' must be a vector"),
    "dynamic_ensure_rows/addresses": (
        lambda ph, k: _lib().mxrec_dynamic_ensure_rows(table_key=k["dynamic"], **ph),
        {"addresses": (tf.int64, _i64())},
        ("addresses", np.zeros((0, 1), np.int64)), "input 'addresses' must be a vector"),
    "dynamic_gather/addresses": (
        lambda ph, k: _lib().mxrec_dynamic_gather(table_key=k["dynamic"], dim=DIM, **ph),
        {"addresses": (tf.int64, _i64())},
        ("addresses", np.zeros((0, 1), np.int64)), "input 'addresses' must be a vector"),
    "dynamic_assign/values": (
        lambda ph, k: _lib().mxrec_dynamic_assign(table_key=k["dynamic"], dim=DIM, **ph),
        {"addresses": (tf.int64, _i64()), "values": (tf.float32, _NO_ROWS)},
        ("values", np.zeros((0, DIM + 1), np.float32)), "input 'values' must have shape"),
    "dynamic_sgd/lr": (
        lambda ph, k: _lib().mxrec_dynamic_apply_sgd(table_key=k["dynamic"], dim=DIM, **ph),
        {"addresses": (tf.int64, _i64()), "grads": (tf.float32, _NO_ROWS),
         "lr": (tf.float32, np.float32(0.1))},
        ("lr", _f32(0.1, 0.2)), "input 'lr' must be a scalar"),
    "dynamic_sgd/grads": (
        lambda ph, k: _lib().mxrec_dynamic_apply_sgd(table_key=k["dynamic"], dim=DIM, **ph),
        {"addresses": (tf.int64, _i64()), "grads": (tf.float32, _NO_ROWS),
         "lr": (tf.float32, np.float32(0.1))},
        ("grads", np.zeros((1, DIM), np.float32)), "input 'grads' must have shape"),
    "dynamic_adagrad/lr": (
        lambda ph, k: _lib().mxrec_dynamic_apply_adagrad(
            table_key=k["dynamic"], dim=DIM, accumulator_slot="acc",
            initial_accumulator_value=0.1, **ph),
        {"addresses": (tf.int64, _i64()), "grads": (tf.float32, _NO_ROWS),
         "lr": (tf.float32, np.float32(0.1))},
        ("lr", np.zeros((1, 1), np.float32)), "input 'lr' must be a scalar"),
    **{f"dynamic_lazy_adam/{name}": (
        _lazy_adam,
        {"addresses": (tf.int64, _i64()), "grads": (tf.float32, _NO_ROWS),
         **{s: (tf.float32, np.float32(0.5)) for s in _SCALARS}},
        (name, _f32(0.5)), f"input '{name}' must be a scalar")
       for name in _SCALARS},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_input_shape_is_invalid_argument(keys, case):
    op, inputs, (bad, value), match = CASES[case]
    ph = {name: _v1.placeholder(dtype, shape=None, name=name)
          for name, (dtype, _) in inputs.items()}
    out = op(ph, keys)
    good = {ph[name]: v for name, (_, v) in inputs.items()}
    with _v1.Session() as sess:
        sess.run(_v1.global_variables_initializer())
        sess.run(out, good)
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            sess.run(out, {**good, ph[bad]: value})

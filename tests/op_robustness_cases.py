"""Bad inputs for every registered mxrec op, for tests/test_op_robustness.py.

Each case calls one op once, eagerly or in a graph whose inputs are placeholders of
unknown shape (so that no shape function refuses them before the kernel runs), and
states what must come of it: a result of the given shapes, or an error of the given
class whose message matches a pattern. The test runs the cases in child processes of
this script:

    python tests/op_robustness_cases.py eager|graph CASE...

which prints one JSON line when a case starts and one with its outcome, so that a
process that dies names the case that killed it.
"""

import json
import os
import re
import sys
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np

DIM = 4
HUGE = 2**62
INT32_MAX = 2**31 - 1
IA = "InvalidArgumentError"
PREFIX = "op_robustness/"
TABLES = {  # name -> engine.create_table arguments past the key and name
    "plain": dict(dim=DIM, capacity=100),
    "threshold": dict(dim=DIM, capacity=100),
    "import": dict(dim=DIM, capacity=100),
    "commit": dict(dim=DIM, capacity=100),
    "tiered": dict(dim=DIM, capacity=8, host_capacity=16),
    "tiered_import": dict(dim=DIM, capacity=8, host_capacity=16),
    "dyn": dict(dim=DIM, capacity=2**31 - 1),
}
MISSING = PREFIX + "no_such_table"


class Case(NamedTuple):
    """One call of `op`.

    Attributes:
        op: the registered op name.
        inputs: input name -> a NumPy value, a list of them (a list input), or a Variable.
        attrs: the op's attributes (type attributes are inferred from the inputs).
        expect: None (the call succeeds) or the class name of the error it raises.
        match: a pattern the error's message contains (expect set).
        shapes: the shapes of the flattened outputs on success (None: not checked).
    """

    op: str
    inputs: Dict[str, Any]
    attrs: Dict[str, Any]
    expect: Optional[str] = None
    match: str = ""
    shapes: Optional[Sequence[Tuple[int, ...]]] = None


class Variable(NamedTuple):
    """A resource variable made for the case: its value, or no variable behind the handle
    (exists=False). A read of it stays alive during the call, so that the kernel finds
    its buffer shared and must copy it before writing."""

    value: np.ndarray
    exists: bool = True


def key(table):
    return PREFIX + table


def i64(*values):
    return np.array(values, np.int64)


def i32(*values):
    return np.array(values, np.int32)


def f32(*values):
    return np.array(values, np.float32)


def zeros(shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def _cases_for(op, good, bad):
    """{op/name: Case}: `good` and `bad` map a case name to (inputs, attrs, expectation)
    with expectation a shapes list (good) or (error class, pattern) (bad)."""
    cases = {}
    for name, (inputs, attrs, shapes) in good.items():
        cases[f"{op}/{name}"] = Case(op, inputs, attrs, shapes=shapes)
    for name, (inputs, attrs, (expect, match)) in bad.items():
        cases[f"{op}/{name}"] = Case(op, inputs, attrs, expect, match)
    return cases


def _with(base, **changes):
    return {**base, **changes}


# --- the restore gather and its gradient ---------------------------------------------

_GATHER = dict(unique_emb=zeros((3, DIM)), restore=i32(0, 3, 1), default_row=zeros(DIM))
_GATHER_GRAD = dict(grad=zeros((3, DIM)), restore=i32(0, 1, 2), num_unique=np.int32(3))
_GATHER_GRAD64 = dict(grad=zeros((1, DIM)), restore=i64(0), num_unique=np.int64(1))
_GATHER_CASES = {
    **_cases_for("MxrecGatherRows", {
        "good": (_GATHER, {}, [(3, DIM)]),
        "empty": (_with(_GATHER, unique_emb=zeros((0, DIM)), restore=i32()), {}, [(0, DIM)]),
        "only_default_rows": (_with(_GATHER, unique_emb=zeros((0, DIM)), restore=i32(0, 0)),
                              {}, [(2, DIM)]),
    }, {
        "unique_emb_rank": (_with(_GATHER, unique_emb=zeros(12)), {},
                            (IA, "unique_emb must be a matrix")),
        "restore_rank": (_with(_GATHER, restore=i32(0, 1).reshape(1, 2)), {},
                         (IA, "restore must be a vector")),
        "default_row_length": (_with(_GATHER, default_row=zeros(DIM + 1)), {},
                               (IA, "default_row must be a vector of 4")),
        "restore_past_default": (_with(_GATHER, restore=i32(0, 4)), {},
                                 (IA, r"restore\[1\] = 4 is not in \[0, 3\]")),
        "restore_negative": (_with(_GATHER, restore=i32(-1)), {},
                             (IA, r"restore\[0\] = -1 is not in")),
        "restore_huge": (_with(_GATHER, restore=i64(HUGE)), {},
                         (IA, rf"restore\[0\] = {HUGE} is not in")),
    }),
    **_cases_for("MxrecGatherRowsGrad", {
        "good": (_GATHER_GRAD, {}, [(3, DIM)]),
        "empty": (_with(_GATHER_GRAD, grad=zeros((0, DIM)), restore=i32(),
                        num_unique=np.int32(0)), {}, [(0, DIM)]),
        "rows_no_position_names": (_with(_GATHER_GRAD, grad=zeros((0, DIM)), restore=i32(),
                                         num_unique=np.int32(5)), {}, [(5, DIM)]),
        "only_default_rows": (_with(_GATHER_GRAD, restore=i32(0, 0, 0),
                                    num_unique=np.int32(0)), {}, [(0, DIM)]),
    }, {
        # The row: num_unique = 2**62 ended the process in TensorShape.
        "num_unique_huge": (_with(_GATHER_GRAD64, num_unique=np.int64(HUGE)), {},
                            (IA, rf"num_unique = {HUGE}.*more than 2\^63 - 1 values")),
        "num_unique_times_dim_overflows": (
            _with(_GATHER_GRAD, grad=zeros((0, 2**40)), restore=i32(),
                  num_unique=np.int32(INT32_MAX)), {},
            (IA, rf"\[{INT32_MAX}, {2**40}\].*more than 2\^63 - 1 values")),
        "num_unique_past_memory": (
            _with(_GATHER_GRAD64, grad=zeros((0, DIM)), restore=i64(),
                  num_unique=np.int64(2**45)), {},
            (IA, rf"\[{2**45}, 4\].*bytes, more than this host's")),
        "num_unique_negative": (_with(_GATHER_GRAD, num_unique=np.int32(-1)), {},
                                (IA, "num_unique must be >= 0, got -1")),
        "num_unique_rank": (_with(_GATHER_GRAD, num_unique=i32(3)), {},
                            (IA, "num_unique must be a scalar")),
        "grad_rank": (_with(_GATHER_GRAD, grad=zeros(3)), {}, (IA, "grad must be a matrix")),
        "restore_rank": (_with(_GATHER_GRAD, restore=i32(0, 1, 2).reshape(3, 1)), {},
                         (IA, "restore must be a vector")),
        "restore_out_of_range": (_with(_GATHER_GRAD, restore=i32(0, 1, 4)), {},
                                 (IA, r"restore\[2\] = 4 is not in \[0, 3\]")),
        "leading_dims_differ": (_with(_GATHER_GRAD, restore=i32(0, 1)), {},
                                (IA, "grad has 3 rows but restore 2 positions")),
    }),
}

# --- the send plan -------------------------------------------------------------------

_SCATTER = dict(emb=zeros((2, DIM)), first=i32(1, 0), spots=i32(0, 2), rows=np.int32(3))
_GATHER_SUM = dict(buffer=zeros((3, DIM)), spots=i32(0, 2), first=i32(1, 1),
                   owned=np.int32(2), scale=np.float32(1))
_PACK = dict(where=[i32(1, 0).reshape(1, 2)], pairs=[i64(7, 2).reshape(1, 2)], chunks=i32(1))
_POSITIONS = dict(where=[i32(0, 0, 1, 0).reshape(2, 2)], order=[i32(1, 0)],
                  index=[i32(0, 1, 0)], width=i32(2), offset=i32(0))
_POSITIONS_ATTRS = dict(group_of=[0], num_groups=1)
_SEND_PLAN_CASES = {
    **_cases_for("MxrecScatterRows", {
        "good": (_SCATTER, {}, [(3, DIM)]),
        "empty": (_with(_SCATTER, emb=zeros((0, DIM)), first=i32(), spots=i32(),
                        rows=np.int32(0)), {}, [(0, DIM)]),
        "no_values": (_with(_SCATTER, first=i32(), spots=i32(), rows=np.int32(5)), {},
                      [(5, DIM)]),
    }, {
        "rows_times_dim_overflows": (
            _with(_SCATTER, emb=zeros((0, 2**40)), first=i32(), spots=i32(),
                  rows=np.int32(INT32_MAX)), {},
            (IA, rf"rows = {INT32_MAX}.*more than 2\^63 - 1 values")),
        "rows_past_memory": (
            _with(_SCATTER, emb=zeros((0, 2**20)), first=i32(), spots=i32(),
                  rows=np.int32(INT32_MAX)), {},
            (IA, "bytes, more than this host's")),
        "rows_negative": (_with(_SCATTER, rows=np.int32(-1)), {}, (IA, "rows = -1 < 0")),
        "emb_rank": (_with(_SCATTER, emb=zeros(8)), {}, (IA, "want emb")),
        "rows_rank": (_with(_SCATTER, rows=i32(3)), {}, (IA, "rows a scalar")),
        "first_rank": (_with(_SCATTER, first=i32(1, 0).reshape(1, 2)), {}, (IA, "want emb")),
        "lengths_differ": (_with(_SCATTER, first=i32(1)), {}, (IA, "first .V., spots .V.")),
        "first_out_of_range": (_with(_SCATTER, first=i32(2, 0)), {},
                               (IA, r"first\[0\] = 2 is not in \[0, 2\)")),
        "spots_out_of_range": (_with(_SCATTER, spots=i32(0, 3)), {},
                               (IA, r"spots\[1\] = 3 is not in \[0, 3\)")),
        "spots_negative": (_with(_SCATTER, spots=i32(-1, 0)), {},
                           (IA, r"spots\[0\] = -1 is not in")),
    }),
    **_cases_for("MxrecGatherSumRows", {
        "good": (_GATHER_SUM, dict(scaled=False), [(2, DIM)]),
        "good_scaled": (_GATHER_SUM, dict(scaled=True), [(2, DIM)]),
        "empty": (_with(_GATHER_SUM, buffer=zeros((0, DIM)), spots=i32(), first=i32(),
                        owned=np.int32(0)), dict(scaled=False), [(0, DIM)]),
    }, {
        "owned_times_dim_overflows": (
            _with(_GATHER_SUM, buffer=zeros((0, 2**40)), spots=i32(), first=i32(),
                  owned=np.int32(INT32_MAX)), dict(scaled=False),
            (IA, rf"owned = {INT32_MAX}.*more than 2\^63 - 1 values")),
        "owned_negative": (_with(_GATHER_SUM, owned=np.int32(-3)), dict(scaled=False),
                           (IA, "owned = -3 < 0")),
        "buffer_rank": (_with(_GATHER_SUM, buffer=zeros(3)), dict(scaled=False),
                        (IA, "want buffer")),
        "scale_rank": (_with(_GATHER_SUM, scale=f32(1)), dict(scaled=True),
                       (IA, "owned and scale scalars")),
        "lengths_differ": (_with(_GATHER_SUM, first=i32(1)), dict(scaled=False),
                           (IA, "want buffer")),
        "spots_out_of_range": (_with(_GATHER_SUM, spots=i32(0, 3)), dict(scaled=False),
                               (IA, r"spots\[1\] = 3 is not in \[0, 3\)")),
        "first_out_of_range": (_with(_GATHER_SUM, first=i32(1, 2)), dict(scaled=False),
                               (IA, r"first\[1\] = 2 is not in \[0, 2\)")),
    }),
    **_cases_for("MxrecPackSend", {
        "good": (_PACK, dict(size=2), [(2, 1, 2)]),
        "empty": (dict(where=[zeros((0, 2), np.int32)], pairs=[zeros((0, 2), np.int64)],
                       chunks=i32(0)), dict(size=2), [(2, 0, 2)]),
    }, {
        # The row: a size of 2**62 ended the process in TensorShape.
        "size_huge": (_PACK, dict(size=HUGE), (IA, rf"size = {HUGE}.*more than 2\^63 - 1")),
        "size_past_memory": (_PACK, dict(size=2**40), (IA, "bytes, more than this host's")),
        "chunks_negative": (_with(_PACK, chunks=i32(-1)), dict(size=2),
                            (IA, r"chunks\[0\] = -1 < 0")),
        "chunks_length": (_with(_PACK, chunks=i32(1, 1)), dict(size=2),
                          (IA, "chunks must be a vector of the 1 lookups")),
        "where_rank": (_with(_PACK, where=[i32(1, 0)]), dict(size=2),
                       (IA, r"where\[0\] and pairs\[0\] must be \[U, 2\]")),
        "leading_dims_differ": (_with(_PACK, pairs=[zeros((2, 2), np.int64)]), dict(size=2),
                                (IA, r"where\[0\] and pairs\[0\] must be \[U, 2\]")),
        "owner_out_of_range": (_with(_PACK, where=[i32(2, 0).reshape(1, 2)]), dict(size=2),
                               (IA, r"where\[0\]\[0\] = \(2, 0\) is outside the 2 owners")),
        "slot_out_of_range": (_with(_PACK, where=[i32(0, 1).reshape(1, 2)]), dict(size=2),
                              (IA, r"where\[0\]\[0\] = \(0, 1\) is outside")),
        "owner_negative": (_with(_PACK, where=[i32(-1, 0).reshape(1, 2)]), dict(size=2),
                           (IA, r"= \(-1, 0\) is outside")),
        "list_lengths_differ": (_with(_PACK, pairs=_PACK["pairs"] * 2), dict(size=2),
                                (IA, "do not match 4 inputs specified")),
    }),
    **_cases_for("MxrecSendPositions", {
        "good": (_POSITIONS, _POSITIONS_ATTRS, [(3,)]),
        "empty": (dict(where=[zeros((0, 2), np.int32)], order=[i32()], index=[i32()],
                       width=i32(2), offset=i32(0)), _POSITIONS_ATTRS, [(0,)]),
        "empty_group": (_POSITIONS, dict(group_of=[1], num_groups=2), [(0,), (3,)]),
    }, {
        "group_of_length": (_POSITIONS, dict(group_of=[0, 0], num_groups=1),
                            (IA, "group_of has 2 entries for N = 1 lookups")),
        "group_of_out_of_range": (_POSITIONS, dict(group_of=[1], num_groups=1),
                                  (IA, r"group_of\[0\] = 1 is not in \[0, num_groups = 1\)")),
        "num_groups_huge": (_POSITIONS, dict(group_of=[0], num_groups=HUGE),
                            ("ValueError", "Number of outputs is too big")),
        "width_length": (_with(_POSITIONS, width=i32(2, 2)), _POSITIONS_ATTRS,
                         (IA, "width and offset must be vectors of the 1 lookups")),
        "offset_rank": (_with(_POSITIONS, offset=np.int32(0)), _POSITIONS_ATTRS,
                        (IA, "width and offset must be vectors")),
        "where_rank": (_with(_POSITIONS, where=[i32(0, 0, 1, 0)]), _POSITIONS_ATTRS,
                       (IA, r"where\[0\] must be \[U, 2\]")),
        "order_length": (_with(_POSITIONS, order=[i32(1)]), _POSITIONS_ATTRS,
                         (IA, r"order\[0\] must be a vector of the 2 unique IDs")),
        "index_rank": (_with(_POSITIONS, index=[i32(0, 1, 0).reshape(3, 1)]), _POSITIONS_ATTRS,
                       (IA, r"index\[0\] must be a vector")),
        "order_not_a_permutation": (_with(_POSITIONS, order=[i32(0, 0)]), _POSITIONS_ATTRS,
                                    (IA, r"order\[0\] is not a permutation")),
        "order_out_of_range": (_with(_POSITIONS, order=[i32(0, 5)]), _POSITIONS_ATTRS,
                               (IA, r"order\[1\] = 5")),
        "index_out_of_range": (_with(_POSITIONS, index=[i32(0, 2)]), _POSITIONS_ATTRS,
                               (IA, r"index\[0\]\[1\] = 2 is not in \[0, 2\)")),
        "index_negative": (_with(_POSITIONS, index=[i32(-1)]), _POSITIONS_ATTRS,
                           (IA, r"index\[0\]\[0\] = -1 is not in")),
        "row_past_int32": (_with(_POSITIONS, width=i32(INT32_MAX), offset=i32(1)),
                           _POSITIONS_ATTRS,
                           (IA, r"outside \[0, 2\^31 - 1\]")),
        "list_lengths_differ": (_with(_POSITIONS, order=_POSITIONS["order"] * 2),
                                _POSITIONS_ATTRS, (IA, "do not match 6 inputs specified")),
    }),
}

# --- routes and the fused exchange ---------------------------------------------------

_RECEIVED = dict(received=i64(7, 1, 0, 0, 9, 2, 4, 1).reshape(4, 2), chunks=i32(1, 1))
_ROUTE_CASES = {
    **_cases_for("MxrecRoute", {
        "good": (dict(ids=i64(7, 3, 7, 9).reshape(2, 2)), dict(size=2),
                 [(3, 2), (2,), (3, 2), (3,), (4,)]),
        "empty": (dict(ids=i64()), dict(size=2), [(0, 2), (2,), (0, 2), (0,), (0,)]),
        "scalar": (dict(ids=np.int64(5)), dict(size=3), [(1, 2), (3,), (1, 2), (1,), (1,)]),
        "int64_extremes": (dict(ids=i64(-2**63, 2**63 - 1, -1)), dict(size=2), None),
    }, {
        "size_huge": (dict(ids=i64(1)), dict(size=HUGE),
                      (IA, rf"size = {HUGE} ranks is more than")),
        "size_past_ranks": (dict(ids=i64(1)), dict(size=INT32_MAX),
                            (IA, f"size = {INT32_MAX} ranks is more than the 1048576")),
        "size_zero": (dict(ids=i64(1)), dict(size=0),
                      (IA, "attr 'size' of 0 must be at least minimum 1")),
    }),
    **_cases_for("MxrecExchangeReceived", {
        "good": (_RECEIVED, dict(size=2), [(3, 2), (3,), (3,), (3,), (2,)]),
        "empty": (dict(received=zeros((0, 2), np.int64), chunks=i32()), dict(size=2),
                  [(0, 2), (0,), (0,), (0,), (0,)]),
        "empty_lookups": (dict(received=zeros((0, 2), np.int64), chunks=i32(0, 0)),
                          dict(size=2), [(0, 2), (0,), (0,), (0,), (2,)]),
    }, {
        "size_huge": (_RECEIVED, dict(size=HUGE), (IA, rf"size = {HUGE} ranks is more than")),
        "received_rank": (_with(_RECEIVED, received=i64(7, 1, 0, 0)), dict(size=2),
                          (IA, r"received must be \[R, 2\]")),
        "received_width": (_with(_RECEIVED, received=zeros((4, 3), np.int64)), dict(size=2),
                           (IA, r"received must be \[R, 2\]")),
        "chunks_rank": (_with(_RECEIVED, chunks=i32(1, 1).reshape(1, 2)), dict(size=2),
                        (IA, "chunks must be a vector")),
        "chunks_negative": (_with(_RECEIVED, chunks=i32(3, -1)), dict(size=2),
                            (IA, r"chunks\[1\] = -1 is negative")),
        "slots_mismatch": (_RECEIVED, dict(size=3),
                           (IA, r"received has 4 slots but size \* sum\(chunks\) = 3 \* 2")),
        "slots_huge": (_with(_RECEIVED, chunks=i32(INT32_MAX)), dict(size=INT32_MAX),
                       (IA, "received has 4 slots but size")),
        "occurrences_negative": (
            _with(_RECEIVED, received=i64(7, 1, 0, -1, 9, 2, 4, 1).reshape(4, 2)),
            dict(size=2), (IA, "slot 1 .peer 0, column 1. has -1 occurrences")),
    }),
}

# --- first values drawn from the ID --------------------------------------------------

_BY_ID = dict(dim=DIM, seed=3, distribution="normal", a=0.0, b=1.0)
_PLAN = dict(ids=i64(5, 6, 5), unique_rows=i32(0, 1), restore=i32(0, 1, 0), wanted_rows=i32(1))
_ROWS_BY_ID_CASES = {
    **_cases_for("MxrecRowsById", {
        "good": (dict(ids=i64(1, 2)), _BY_ID, [(2, DIM)]),
        "empty": (dict(ids=i64()), _BY_ID, [(0, DIM)]),
        "no_ids_huge_dim": (dict(ids=i64()), _with(_BY_ID, dim=2**40), [(0, 2**40)]),
    }, {
        # The row: dim = 2**62 ended the process in TensorShape.
        "dim_huge": (dict(ids=i64(1, 2)), _with(_BY_ID, dim=HUGE),
                     (IA, rf"\[2, {HUGE}\].*dim = {HUGE}.*more than 2\^63 - 1")),
        "dim_past_memory": (dict(ids=i64(1)), _with(_BY_ID, dim=2**45),
                            (IA, "bytes, more than this host's")),
        "ids_rank": (dict(ids=i64(1, 2).reshape(1, 2)), _BY_ID, (IA, "ids must be a vector")),
        "distribution": (dict(ids=i64(1)), _with(_BY_ID, distribution="cauchy"),
                         (IA, "attr 'distribution' of .cauchy. is not in the list")),
        "a_nan": (dict(ids=i64(1)), _with(_BY_ID, a=float("nan")),
                  (IA, "parameters a = nan and b = 1 must be finite")),
        "b_infinite": (dict(ids=i64(1)), _with(_BY_ID, distribution="uniform", b=float("inf")),
                       (IA, "uniform distribution's parameters a = 0 and b = inf")),
        "dim_zero": (dict(ids=i64(1)), _with(_BY_ID, dim=0),
                     (IA, "attr 'dim' of 0 must be at least minimum 1")),
    }),
    **_cases_for("MxrecPlanRowsById", {
        "good": (_PLAN, _BY_ID, [(1, DIM)]),
        "empty": (dict(ids=i64(), unique_rows=i32(), restore=i32(), wanted_rows=i32()),
                  _BY_ID, [(0, DIM)]),
        "repeated_wanted_row": (_with(_PLAN, wanted_rows=i32(1, 0, 1)), _BY_ID, [(3, DIM)]),
    }, {
        "dim_huge": (_with(_PLAN, wanted_rows=i32(0, 1)), _with(_BY_ID, dim=HUGE),
                     (IA, rf"dim = {HUGE}.*more than 2\^63 - 1")),
        "b_infinite": (_PLAN, _with(_BY_ID, b=float("-inf")), (IA, "must be finite")),
        "wanted_not_planned": (_with(_PLAN, wanted_rows=i32(7)), _BY_ID,
                               (IA, "wanted row 7 is not a row of the plan")),
        "restore_out_of_range": (_with(_PLAN, restore=i32(0, 9, 0)), _BY_ID,
                                 (IA, "wanted row 1 is not a row of the plan")),
        "unique_rows_rank": (_with(_PLAN, unique_rows=i32(0, 1).reshape(2, 1)), _BY_ID,
                             (IA, "unique_rows and wanted_rows must be vectors")),
        "wanted_rows_rank": (_with(_PLAN, wanted_rows=np.int32(1)), _BY_ID,
                             (IA, "unique_rows and wanted_rows must be vectors")),
        "ids_and_restore_differ": (_with(_PLAN, restore=i32(0, 1)), _BY_ID,
                                   (IA, "got 3 ids and 2 restore values")),
    }),
}

# --- the key stage -------------------------------------------------------------------

_STAGE = dict(ids=[i64(1, 2)], timestamp=np.int64(5), weights=[])
_STAGE_ATTRS = dict(table_keys=[key("plain")])
_PACKED = dict(ids=i64(1, 2, 3), splits=i64(0, 3), timestamp=np.int64(5))
_PACKED_ATTRS = dict(table_keys=[key("plain")])
_KEY_STAGE_CASES = {
    **_cases_for("MxrecKeyStage", {
        "good": (_STAGE, _STAGE_ATTRS, [(2,), (2,), (0,), (1,)]),
        "empty": (_with(_STAGE, ids=[i64()]), _STAGE_ATTRS, [(0,), (0,), (0,), (1,)]),
        "weighted": (_with(_STAGE, weights=[i64(2, 1)]), _STAGE_ATTRS,
                     [(2,), (2,), (0,), (1,)]),
        "int32_ids": (_with(_STAGE, ids=[i32(1, 2)]), _STAGE_ATTRS, [(2,), (2,), (0,), (1,)]),
        "int64_extremes": (_with(_STAGE, ids=[i64(-2**63, 2**63 - 1)]), _STAGE_ATTRS, None),
    }, {
        # The row: 1 ID tensor and 2 weight tensors ended the process.
        "more_weights_than_ids": (_with(_STAGE, weights=[i64(1, 1), i64(1, 1)]), _STAGE_ATTRS,
                                  (IA, "2 weight tensors for 1 ID tensors")),
        "fewer_weights_than_ids": (
            dict(ids=[i64(1), i64(2)], timestamp=np.int64(5), weights=[i64(1)]),
            dict(table_keys=[key("plain"), key("threshold")]),
            (IA, "1 weight tensors for 2 ID tensors")),
        "more_ids_than_tables": (_with(_STAGE, ids=[i64(1), i64(2)]), _STAGE_ATTRS,
                                 (IA, "2 ID tensors for 1 tables")),
        "no_tables": (_STAGE, dict(table_keys=[]), (IA, "1 ID tensors for 0 tables")),
        "missing_table": (_STAGE, dict(table_keys=[MISSING]), ("NotFoundError", "no_such_table")),
        "ids_rank": (_with(_STAGE, ids=[i64(1, 2).reshape(1, 2)]), _STAGE_ATTRS,
                     (IA, "must be a vector")),
        "timestamp_rank": (_with(_STAGE, timestamp=i64(5)), _STAGE_ATTRS,
                           (IA, "input 'timestamp' must be a scalar")),
        "weights_shape": (_with(_STAGE, weights=[i64(1)]), _STAGE_ATTRS,
                          (IA, "the weights of table 'plain' have shape")),
        "weight_zero": (_with(_STAGE, weights=[i64(1, 0)]), _STAGE_ATTRS,
                        (IA, "weight 0 at position 1")),
        "weights_overflow": (_with(_STAGE, weights=[i64(2**62, 2**62)]), _STAGE_ATTRS,
                             (IA, "add up to more than 2\\^31 - 1")),
        "weights_in_evaluation": (_with(_STAGE, weights=[i64(1, 1)]),
                                  _with(_STAGE_ATTRS, is_train=False),
                                  (IA, "an evaluation batch counts nothing")),
    }),
    **_cases_for("MxrecKeyStagePacked", {
        "good": (_PACKED, _PACKED_ATTRS, [(3,), (2,), (3,), (0,), (2,), (1,)]),
        "empty": (_with(_PACKED, ids=i64(), splits=i64(0, 0)), _PACKED_ATTRS,
                  [(0,), (2,), (0,), (0,), (2,), (1,)]),
    }, {
        "no_tables": (_PACKED, dict(table_keys=[]),
                      (IA, "attr 'table_keys' of 0 must be at least minimum 1")),
        "table_twice": (_with(_PACKED, splits=i64(0, 1, 3)),
                        dict(table_keys=[key("plain"), key("plain")]),
                        (IA, "is named twice in table_keys")),
        "splits_length": (_with(_PACKED, splits=i64(0, 1, 3)), _PACKED_ATTRS,
                          (IA, "input 'splits' must have 2")),
        "splits_rank": (_with(_PACKED, splits=i64(0, 3).reshape(1, 2)), _PACKED_ATTRS,
                        (IA, "input 'splits' must be a vector")),
        "splits_start": (_with(_PACKED, splits=i64(1, 3)), _PACKED_ATTRS,
                         (IA, r"splits\[0\] must be 0")),
        "splits_past_ids": (_with(_PACKED, splits=i64(0, HUGE)), _PACKED_ATTRS,
                            (IA, "not a range within the 3 IDs")),
        "splits_negative": (_with(_PACKED, splits=i64(0, -1)), _PACKED_ATTRS,
                            (IA, "not a range within the 3 IDs")),
        "splits_short": (_with(_PACKED, splits=i64(0, 2)), _PACKED_ATTRS,
                         (IA, r"splits\[1\] = 2 must be the number of IDs, 3")),
        "ids_rank": (_with(_PACKED, ids=i64(1, 2, 3).reshape(3, 1)), _PACKED_ATTRS,
                     (IA, "input 'ids' must be a vector")),
        "timestamp_rank": (_with(_PACKED, timestamp=i64(5)), _PACKED_ATTRS,
                           (IA, "input 'timestamp' must be a scalar")),
        "missing_table": (_PACKED, dict(table_keys=[MISSING]), ("NotFoundError", "no_such_table")),
    }),
    **_cases_for("MxrecCommitBatches", {
        "nothing_pending": (dict(batch_ids=i64(0)), dict(table_keys=[key("commit")]), [()]),
        "no_tables": (dict(batch_ids=i64()), dict(table_keys=[]), [()]),
    }, {
        "never_planned": (dict(batch_ids=i64(12345)), dict(table_keys=[key("commit")]),
                          (IA, "batch 12345, which .*never planned .it planned none")),
        "negative": (dict(batch_ids=i64(-1)), dict(table_keys=[key("commit")]),
                     (IA, "batch_ids\\[0\\] = -1")),
        "length": (dict(batch_ids=i64(0, 0)), dict(table_keys=[key("commit")]),
                   (IA, "batch_ids must be a vector of 1 ids")),
        "rank": (dict(batch_ids=i64(0).reshape(1, 1)), dict(table_keys=[key("commit")]),
                 (IA, "batch_ids must be a vector of 1 ids")),
        "missing_table": (dict(batch_ids=i64(0)), dict(table_keys=[MISSING]),
                          ("NotFoundError", "no_such_table")),
    }),
    **_cases_for("MxrecSetThreshold", {
        "good": (dict(threshold=np.float32(0)), dict(table_key=key("threshold")), [()]),
        "int64": (dict(threshold=np.int64(0)), dict(table_key=key("threshold")), [()]),
    }, {
        "rank": (dict(threshold=f32(2)), dict(table_key=key("threshold")),
                 (IA, "input 'threshold' must be a scalar")),
        "negative": (dict(threshold=np.float32(-1)), dict(table_key=key("threshold")),
                     (IA, "the threshold must be >= 0, got -1")),
        "nan": (dict(threshold=np.float32("nan")), dict(table_key=key("threshold")),
                (IA, "the threshold must be >= 0, got nan")),
        "missing_table": (dict(threshold=np.float32(0)), dict(table_key=MISSING),
                          ("NotFoundError", "no_such_table")),
    }),
}

# --- checkpoints ---------------------------------------------------------------------

_IMPORT = dict(keys=i64(1, 2), rows=i32(0, 1), counts=f32(1, 1), last_seen=i64(0, 0),
               free_rows=i32(), meta=i64(2, 0, 0), threshold=np.float64(0))
_IMPORT_EMPTY = dict(keys=i64(), rows=i32(), counts=f32(), last_seen=i64(), free_rows=i32(),
                     meta=i64(0, 0, 0), threshold=np.float64(0))
_TIERED = dict(_IMPORT, rows=i32(0, -1), meta=i64(1, 0, 0), in_host=i32(0, 1),
               lru_rows=i32(0), lru_ages=i64(0), tier_components=np.array([b"embedding"]),
               tier_present=i64(1), tier_values=np.ones((1, 1, DIM), np.float32))
_TIERED_EMPTY = dict(_IMPORT_EMPTY, in_host=i32(), lru_rows=i32(), lru_ages=i64(),
                     tier_components=np.array([b"embedding"]), tier_present=i64(),
                     tier_values=zeros((0, 1, DIM)))
_IMPORT_ATTRS = dict(table_key=key("import"))
_TIERED_ATTRS = dict(table_key=key("tiered_import"))
_CHECKPOINT_CASES = {
    **_cases_for("MxrecExportTable", {
        "good": ({}, dict(table_key=key("plain")), None),
        "tiered": ({}, dict(table_key=key("tiered")), None),
    }, {
        "missing_table": ({}, dict(table_key=MISSING), ("NotFoundError", "no_such_table")),
    }),
    **_cases_for("MxrecImportTable", {
        "good": (_IMPORT, _IMPORT_ATTRS, None),
        "empty": (_IMPORT_EMPTY, _IMPORT_ATTRS, None),
    }, {
        "keys_rank": (_with(_IMPORT, keys=i64(1, 2).reshape(2, 1)), _IMPORT_ATTRS,
                      (IA, "input 'keys' must be a vector")),
        "rows_length": (_with(_IMPORT, rows=i32(0)), _IMPORT_ATTRS,
                        (IA, "input 'rows' must have 2")),
        "meta_length": (_with(_IMPORT, meta=i64(2, 0)), _IMPORT_ATTRS,
                        (IA, "input 'meta' must have 3")),
        "threshold_rank": (_with(_IMPORT, threshold=np.zeros(1)), _IMPORT_ATTRS,
                           (IA, "input 'threshold' must be a scalar")),
        "row_out_of_range": (_with(_IMPORT, rows=i32(0, 500)), _IMPORT_ATTRS,
                             (IA, "checkpointed row 500 of ID 2 is out of range")),
        "rows_used_huge": (_with(_IMPORT, meta=i64(HUGE, 0, 0)), _IMPORT_ATTRS,
                           (IA, f"checkpoint uses {HUGE} rows")),
        "rows_used_negative": (_with(_IMPORT, meta=i64(-1, 0, 0)), _IMPORT_ATTRS,
                               (IA, "checkpoint uses -1 rows")),
        "row_below_not_admitted": (_with(_IMPORT, rows=i32(0, -7)), _IMPORT_ATTRS,
                                   (IA, r"input 'rows': rows\[1\] = -7; a row is >= 0, or -1")),
        "count_nan": (_with(_IMPORT, counts=f32(1, np.nan)), _IMPORT_ATTRS,
                      (IA, r"counts\[1\] = nan; an admission count is finite and >= 0")),
        "count_negative": (_with(_IMPORT, counts=f32(-2, 1)), _IMPORT_ATTRS,
                           (IA, r"counts\[0\] = -2")),
        "count_infinite": (_with(_IMPORT, counts=f32(np.inf, 1)), _IMPORT_ATTRS,
                           (IA, r"counts\[0\] = inf")),
        "threshold_nan": (_with(_IMPORT, threshold=np.float64(np.nan)), _IMPORT_ATTRS,
                          (IA, "input 'threshold' = nan; the admission threshold is >= 0")),
        "threshold_negative": (_with(_IMPORT, threshold=np.float64(-1)), _IMPORT_ATTRS,
                               (IA, "input 'threshold' = -1")),
        "duplicate_keys": (_with(_IMPORT, keys=i64(1, 1)), _IMPORT_ATTRS,
                           (IA, "ID 1 appears twice in the checkpoint")),
        "free_row_out_of_range": (_with(_IMPORT, free_rows=i32(50)), _IMPORT_ATTRS,
                                  (IA, "checkpointed free row 50 is out of range")),
        "missing_table": (_IMPORT, dict(table_key=MISSING), ("NotFoundError", "no_such_table")),
    }),
    **_cases_for("MxrecImportTableTiered", {
        "good": (_TIERED, _TIERED_ATTRS, None),
        "empty": (_TIERED_EMPTY, _TIERED_ATTRS, None),
    }, {
        "in_host_length": (_with(_TIERED, in_host=i32(1)), _TIERED_ATTRS,
                           (IA, "input 'in_host' must have 2")),
        "lru_ages_length": (_with(_TIERED, lru_ages=i64(0, 0)), _TIERED_ATTRS,
                            (IA, "input 'lru_ages' must have 1")),
        "tier_values_rank": (_with(_TIERED, tier_values=np.ones((1, DIM), np.float32)),
                             _TIERED_ATTRS, (IA, "input 'tier_values' must be of rank 3")),
        "tier_values_dim": (_with(_TIERED, tier_values=np.ones((1, 1, DIM + 1), np.float32)),
                            _TIERED_ATTRS, (IA, "input 'tier_values' must have 4")),
        "tier_values_ids": (_with(_TIERED, tier_values=np.ones((2, 1, DIM), np.float32)),
                            _TIERED_ATTRS, (IA, "input 'tier_values' must have 1")),
        "lru_row_out_of_range": (_with(_TIERED, lru_rows=i32(100)), _TIERED_ATTRS,
                                 (IA, "names row 100, which has no ID")),
        "tier_components_rank": (_with(_TIERED, tier_components=np.array([[b"embedding"]])),
                                 _TIERED_ATTRS, (IA, "input 'tier_components' must be a vector")),
        "host_flags_on_a_plain_table": (_TIERED, dict(table_key=key("import")),
                                        (IA, "IDs in a host tier, but this table has none")),
    }),
}

# --- the host tier -------------------------------------------------------------------

_SWAP = dict(rows=i32(), current=zeros((0, DIM)), fresh_values=np.float32(0))
_SWAP_ATTRS = dict(table_key=key("tiered"))
_IN_PLACE = dict(variable=Variable(zeros((8, DIM))), rows=i32(), fresh_values=np.float32(0))
_TIER_CASES = {
    **_cases_for("MxrecTierSwap", {
        "empty": (_SWAP, _SWAP_ATTRS, [(0, DIM)]),
    }, {
        "rows_rank": (_with(_SWAP, rows=zeros((0, 1), np.int32)), _SWAP_ATTRS,
                      (IA, "input 'rows' must be a vector")),
        "current_shape": (_with(_SWAP, current=zeros((1, DIM))), _SWAP_ATTRS,
                          (IA, r"current must be \[0, 4\]")),
        "fresh_values_shape": (_with(_SWAP, fresh_values=zeros((1, DIM))), _SWAP_ATTRS,
                               (IA, r"fresh_values must be a scalar or \[0, 4\]")),
        "no_plan": (_with(_SWAP, rows=i32(3), current=zeros((1, DIM))), _SWAP_ATTRS,
                    ("InternalError", "no planned batch is pending")),
        "plain_table": (_SWAP, dict(table_key=key("plain")), (IA, "has no host tier")),
        "missing_table": (_SWAP, dict(table_key=MISSING), ("NotFoundError", "no_such_table")),
    }),
    **_cases_for("MxrecTierSwapInPlace", {
        "empty": (_IN_PLACE, _SWAP_ATTRS, None),
    }, {
        "variable_dtype": (_with(_IN_PLACE, variable=Variable(zeros((8, DIM), np.float64))),
                           _SWAP_ATTRS, (IA, "the variable must be float32 .rows, 4., got "
                                             "double")),
        "variable_shape": (_with(_IN_PLACE, variable=Variable(zeros((8, DIM + 1)))),
                           _SWAP_ATTRS, (IA, "the variable must be float32 .rows, 4.")),
        "variable_rank": (_with(_IN_PLACE, variable=Variable(zeros(8))), _SWAP_ATTRS,
                          (IA, "the variable must be float32 .rows, 4.")),
        "no_variable": (_with(_IN_PLACE, variable=Variable(zeros((8, DIM)), exists=False)),
                        _SWAP_ATTRS, ("NotFoundError", "op_robustness_none")),
        "row_out_of_range": (_with(_IN_PLACE, rows=i32(100)), _SWAP_ATTRS,
                             (IA, "swap row 100 is outside the device table's 8 rows")),
        "row_negative": (_with(_IN_PLACE, rows=i32(-1)), _SWAP_ATTRS,
                         (IA, "swap row -1 is outside")),
        "rows_rank": (_with(_IN_PLACE, rows=zeros((1, 1), np.int32)), _SWAP_ATTRS,
                      (IA, "input 'rows' must be a vector")),
        "fresh_values_shape": (_with(_IN_PLACE, fresh_values=zeros(DIM)), _SWAP_ATTRS,
                               (IA, "fresh_values must be")),
    }),
    **_cases_for("MxrecTierRead", {
        "good": (dict(ids=i64(1, 2)), _SWAP_ATTRS, [(2, DIM), (2,)]),
        "empty": (dict(ids=i64()), _SWAP_ATTRS, [(0, DIM), (0,)]),
        "int32": (dict(ids=i32(1)), _SWAP_ATTRS, [(1, DIM), (1,)]),
    }, {
        "ids_rank": (dict(ids=i64(1, 2).reshape(2, 1)), _SWAP_ATTRS,
                     (IA, "input 'ids' must be a vector")),
        "plain_table": (dict(ids=i64(1)), dict(table_key=key("plain")),
                        (IA, "has no host tier")),
    }),
}

# --- dynamic expansion (rows 0 and 1 of table "dyn" are handed out at set-up) ---------

_DYN = dict(table_key=key("dyn"), dim=DIM)
_ROWS = dict(addresses=i64(0, 1), grads=zeros((2, DIM)), lr=np.float32(0.1))
_ADAM_SCALARS = ("lr", "beta1", "beta2", "epsilon", "beta1_power", "beta2_power")
_ADAM = dict(_ROWS, **{s: np.float32(0.5) for s in _ADAM_SCALARS})
_ADAM_ATTRS = dict(_DYN, m_slot="m", v_slot="v")
_ADAGRAD_ATTRS = dict(_DYN, accumulator_slot="acc", initial_accumulator_value=0.1)
_DYNAMIC_CASES = {
    **_cases_for("MxrecDynamicEnsureRows", {
        "good": (dict(addresses=i64(0, 1)), dict(table_key=key("dyn")), None),
        "empty": (dict(addresses=i64()), dict(table_key=key("dyn")), [(0,)]),
    }, {
        "rank": (dict(addresses=zeros((0, 1), np.int64)), dict(table_key=key("dyn")),
                 (IA, "input 'addresses' must be a vector")),
        "address_huge": (dict(addresses=i64(HUGE)), dict(table_key=key("dyn")),
                         (IA, f"got address {HUGE}")),
        "address_negative": (dict(addresses=i64(-1)), dict(table_key=key("dyn")),
                             (IA, "got address -1")),
        "missing_table": (dict(addresses=i64()), dict(table_key=MISSING),
                          ("NotFoundError", "no_such_table")),
    }),
    **_cases_for("MxrecDynamicGather", {
        "good": (dict(addresses=i64(1, 0, 1)), _DYN, [(3, DIM)]),
        "empty": (dict(addresses=i64()), _DYN, [(0, DIM)]),
    }, {
        "rank": (dict(addresses=zeros((1, 1), np.int64)), _DYN,
                 (IA, "input 'addresses' must be a vector")),
        "address_huge": (dict(addresses=i64(HUGE)), _DYN, (IA, str(HUGE))),
        "address_negative": (dict(addresses=i64(-5)), _DYN, (IA, "-5")),
        "dim": (dict(addresses=i64()), _with(_DYN, dim=DIM + 1),
                (IA, "was built for dim 5 but the store has dim 4")),
        "dim_huge": (dict(addresses=i64()), _with(_DYN, dim=HUGE),
                     (IA, f"was built for dim {HUGE}")),
    }),
    **_cases_for("MxrecDynamicAssign", {
        "good": (dict(addresses=i64(0, 1), values=zeros((2, DIM))), _DYN, None),
        "empty": (dict(addresses=i64(), values=zeros((0, DIM))), _DYN, None),
    }, {
        "values_shape": (dict(addresses=i64(0), values=zeros((2, DIM))), _DYN,
                         (IA, r"input 'values' must have shape \[1, 4\]")),
        "values_rank": (dict(addresses=i64(0), values=zeros(DIM)), _DYN,
                        (IA, "input 'values' must have shape")),
        "address_out_of_range": (dict(addresses=i64(HUGE), values=zeros((1, DIM))), _DYN,
                                 (IA, str(HUGE))),
    }),
    **_cases_for("MxrecDynamicApplySgd", {
        "good": (_ROWS, _DYN, None),
        "empty": (_with(_ROWS, addresses=i64(), grads=zeros((0, DIM))), _DYN, None),
    }, {
        "lr_rank": (_with(_ROWS, lr=f32(0.1, 0.2)), _DYN, (IA, "input 'lr' must be a scalar")),
        "grads_shape": (_with(_ROWS, grads=zeros((3, DIM))), _DYN,
                        (IA, "input 'grads' must have shape")),
        "address_negative": (_with(_ROWS, addresses=i64(0, -1)), _DYN, (IA, "-1")),
    }),
    **_cases_for("MxrecDynamicApplyAdagrad", {
        "good": (_ROWS, _ADAGRAD_ATTRS, None),
        "empty": (_with(_ROWS, addresses=i64(), grads=zeros((0, DIM))), _ADAGRAD_ATTRS, None),
    }, {
        "lr_rank": (_with(_ROWS, lr=zeros((1, 1))), _ADAGRAD_ATTRS,
                    (IA, "input 'lr' must be a scalar")),
        "grads_rank": (_with(_ROWS, grads=zeros(2 * DIM)), _ADAGRAD_ATTRS,
                       (IA, "input 'grads' must have shape")),
        "address_huge": (_with(_ROWS, addresses=i64(0, HUGE)), _ADAGRAD_ATTRS,
                         (IA, str(HUGE))),
    }),
    **_cases_for("MxrecDynamicApplyLazyAdam", {
        "good": (_ADAM, _ADAM_ATTRS, None),
        "empty": (_with(_ADAM, addresses=i64(), grads=zeros((0, DIM))), _ADAM_ATTRS, None),
    }, {
        **{f"{s}_rank": (_with(_ADAM, **{s: f32(0.5)}), _ADAM_ATTRS,
                         (IA, f"input '{s}' must be a scalar")) for s in _ADAM_SCALARS},
        "beta1_power_one": (_with(_ADAM, beta1_power=np.float32(1)), _ADAM_ATTRS,
                            (IA, "beta1_power must be < 1")),
        "grads_shape": (_with(_ADAM, grads=zeros((2, DIM + 1))), _ADAM_ATTRS,
                        (IA, "input 'grads' must have shape")),
    }),
}

# --- MPI (one rank: the process itself) ----------------------------------------------

_MPI = dict(channel=7, exchange="robust", timeout_seconds=30.0)
_A2A = dict(data=zeros((3, 2)), send_counts=i32(3))
_MPI_CASES = {
    **_cases_for("MxrecMpiRanks", {"good": ({}, {}, [(2,)])}, {}),
    **_cases_for("MxrecMpiAlltoallv", {
        "good": (_A2A, _MPI, [(3, 2), (1,)]),
        "empty": (dict(data=zeros((0, 2)), send_counts=i32(0)), _MPI, [(0, 2), (1,)]),
        "int64": (dict(data=zeros((2,), np.int64), send_counts=i32(2)), _MPI, [(2,), (1,)]),
    }, {
        "data_rank": (_with(_A2A, data=np.float32(1)), _MPI,
                      (IA, "data must have rank >= 1")),
        "send_counts_length": (_with(_A2A, send_counts=i32(1, 2)), _MPI,
                               (IA, r"send_counts must be \[1\]")),
        "send_counts_rank": (_with(_A2A, send_counts=np.int32(3)), _MPI,
                             (IA, r"send_counts must be \[1\]")),
        "send_count_negative": (_with(_A2A, send_counts=i32(-1)), _MPI,
                                (IA, "negative send count for rank 0")),
        "send_counts_sum": (_with(_A2A, send_counts=i32(2)), _MPI,
                            (IA, "send_counts add up to 2 rows, data has 3")),
        "send_count_huge": (dict(data=zeros((0, 2**40)), send_counts=i32(INT32_MAX)), _MPI,
                            (IA, f"send_counts add up to {INT32_MAX} rows, data has 0")),
        "empty_rows": (_with(_A2A, data=zeros((3, 0))), _MPI,
                       (IA, "rows of zero elements")),
        "channel_negative": (_A2A, _with(_MPI, channel=-1), (IA, "channel -1 is outside")),
        "channel_huge": (_A2A, _with(_MPI, channel=HUGE), (IA, f"channel {HUGE} is outside")),
        "timeout_zero": (_A2A, _with(_MPI, timeout_seconds=0.0),
                         (IA, "timeout_seconds must be > 0")),
        "timeout_nan": (_A2A, _with(_MPI, timeout_seconds=float("nan")),
                        (IA, "timeout_seconds must be > 0")),
    }),
    **_cases_for("MxrecMpiAllreduce", {
        "good": (dict(data=f32(1, 2)), _with(_MPI, reduction="sum"), [(2,)]),
        "empty": (dict(data=f32()), _with(_MPI, reduction="max"), [(0,)]),
        "scalar": (dict(data=np.int32(4)), _with(_MPI, reduction="min"), [()]),
        "infinite_timeout": (dict(data=f32(1)),
                             _with(_MPI, reduction="sum", timeout_seconds=float("inf")), [(1,)]),
    }, {
        "reduction": (dict(data=f32(1)), _with(_MPI, reduction="prod"),
                      (IA, "attr 'reduction' of .prod. is not in the list")),
        "channel_huge": (dict(data=f32(1)), _with(_MPI, reduction="sum", channel=HUGE),
                         (IA, f"channel {HUGE} is outside")),
        "timeout_negative": (dict(data=f32(1)),
                             _with(_MPI, reduction="sum", timeout_seconds=-1.0),
                             (IA, "timeout_seconds must be > 0")),
    }),
}

CASES: Dict[str, Case] = {
    **_GATHER_CASES, **_SEND_PLAN_CASES, **_ROUTE_CASES, **_ROWS_BY_ID_CASES,
    **_KEY_STAGE_CASES, **_CHECKPOINT_CASES, **_TIER_CASES, **_DYNAMIC_CASES, **_MPI_CASES,
}
MPI_OPS = {"MxrecMpiAlltoallv", "MxrecMpiAllreduce", "MxrecMpiRanks"}


def snake(op):
    """The Python wrapper's name of an op: MxrecGatherRows -> mxrec_gather_rows."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()


# --- running the cases (the child process) -------------------------------------------


def _libraries():
    from mxrec._lib import loader

    libraries = {"ops": loader.op_library()}
    if loader.mpi_op_library_path().exists():
        libraries["mpi"] = loader.mpi_op_library()
    return libraries


def _set_up_tables():
    from mxrec._lib import loader

    engine = loader.engine()
    for name, options in TABLES.items():
        engine.create_table(key=key(name), name=name, **options)
    engine.create_dynamic_store(key=key("dyn"), name="dyn", dim=DIM, chunk_rows=256)
    engine.process([key("dyn")], [i64(11, 12)], True, 0)  # hands out rows 0 and 1


def _variable(tf, spec, graph_mode):
    if not spec.exists:
        handle = tf.raw_ops.VarHandleOp(dtype=tf.as_dtype(spec.value.dtype),
                                        shape=spec.value.shape, shared_name="op_robustness_none")
        return handle, []
    variable = tf.Variable(spec.value)
    if graph_mode:
        return variable.handle, [variable.initializer]
    return variable.handle, [variable, variable.read_value()]


def _dtype(tf, value):
    return tf.string if value.dtype.kind in "SO" else tf.as_dtype(value.dtype)


def _placeholders(tf, inputs):
    """Each NumPy input as a placeholder of unknown shape, and the feed that fills it."""
    args, feed, keep = {}, {}, []
    for name, value in inputs.items():
        if isinstance(value, Variable):
            args[name], setup = _variable(tf, value, graph_mode=True)
            keep.extend(setup)
        elif isinstance(value, list):
            args[name] = [tf.compat.v1.placeholder(_dtype(tf, v), shape=None) for v in value]
            feed.update(zip(args[name], value))
        else:
            args[name] = tf.compat.v1.placeholder(_dtype(tf, value), shape=None)
            feed[args[name]] = value
    return args, feed, keep


def _call_eager(tf, wrapper, case):
    args, keep = {}, []
    for name, value in case.inputs.items():
        if isinstance(value, Variable):
            args[name], alive = _variable(tf, value, graph_mode=False)
            keep.extend(alive)
        else:
            args[name] = value
    out = wrapper(**args, **case.attrs)
    return [np.asarray(t) for t in tf.nest.flatten(out) if t is not None]


def _call_graph(tf, wrapper, case, session):
    with session.graph.as_default():
        try:
            args, feed, setup = _placeholders(tf, case.inputs)
            out = wrapper(**args, **case.attrs)
        except (ValueError, TypeError) as err:
            # A shape function or the wrapper refused the inputs before any kernel ran.
            raise _BuildError(err) from err
        if setup:
            session.run([op for op in setup if isinstance(op, tf.Operation)])
    fetches = [t for t in tf.nest.flatten(out) if isinstance(t, tf.Tensor)]
    if not fetches:
        session.run(out, feed)
        return []
    return [np.asarray(v) for v in session.run(fetches, feed)]


class _BuildError(Exception):
    """The graph could not be built: the error is the wrapped one, at build time."""


def _report(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def run(mode, names):
    """Runs the named cases in `mode` ('eager' or 'graph'), reporting each."""
    import tensorflow as tf

    if mode == "graph":
        tf.compat.v1.disable_eager_execution()
    libraries = _libraries()
    _set_up_tables()
    session = None
    if mode == "graph":
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1)
        session = tf.compat.v1.Session(graph=tf.Graph(), config=config)
    for name in names:
        case = CASES[name]
        library = libraries["mpi" if case.op in MPI_OPS else "ops"]
        wrapper = getattr(library, snake(case.op))
        _report(start=name)
        at = "run"
        try:
            if mode == "eager":
                outputs = _call_eager(tf, wrapper, case)
            else:
                outputs = _call_graph(tf, wrapper, case, session)
        except _BuildError as err:
            error = err.__cause__
            at = "build"
        except (tf.errors.OpError, ValueError, TypeError) as err:
            error = err
        else:
            _report(case=name, shapes=[list(o.shape) for o in outputs])
            continue
        message = error.message if isinstance(error, tf.errors.OpError) else str(error)
        _report(case=name, error=type(error).__name__, message=message, at=at)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run(sys.argv[1], sys.argv[2:])

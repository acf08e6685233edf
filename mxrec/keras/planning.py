"""What the layers see of mxrec.keras.data.plan_ahead: the lookups a model's trace makes
(`Recorder`), and the plans a step hands them (`StepPlans`).

A layer asks `current()` at its key stage (one rank) or routing (several ranks). Outside
plan_ahead nothing is active and the layer plans its own batch, as always. While
plan_ahead traces the model to find its lookups, a Recorder notes each lookup's IDs and
batch time and lets the trace go on. While a step runs on a planned batch, a StepPlans hands
each training lookup the plan made for it in the input pipeline, in the order the lookups
were recorded, and runs the batch's commit before the plan's rows are read (the engine
keeps a planned batch pending until then: docs/ARCHITECTURE.md, "The step boundary").

The active object is kept per thread in a stack, as TensorFlow keeps its name scopes:
tracing a step and running it happen on the thread that called it.
"""

import contextlib
import dataclasses
import threading
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import tensorflow as tf

from mxrec.distributed import routing
from mxrec.util import ops as mxrec_ops

OWNED = "owned"    # one rank: the plan is the key stage's (rows, restore, reused)
ROUTED = "routed"  # several ranks: the plan is the rank-local routing (routing.Route)

_stack = threading.local()


@dataclasses.dataclass
class Lookup:
    """One training lookup a trace of the model made.

    Attributes:
        table: the layer's KerasTable.
        kind: OWNED or ROUTED.
        ids: the flat IDs [n] the lookup plans (a tensor of the trace).
        stamp: its batch time (int64 scalar tensor of the trace), or None.
        is_dp: ROUTED only: the table is replicated (every rank gets every ID).
    """

    table: object
    kind: str
    ids: tf.Tensor
    stamp: Optional[tf.Tensor]
    is_dp: bool = False


class Recorder:
    """Notes the lookups of a trace of the model; the layers plan as usual meanwhile."""

    def __init__(self):
        self.lookups: List[Lookup] = []
        self.evaluation_lookups = 0

    def owned(self, table, ids, stamp, is_train):
        if is_train:
            self.lookups.append(Lookup(table, OWNED, tf.reshape(ids, [-1]), stamp))
        else:
            self.evaluation_lookups += 1
        return None

    def routed(self, table, ids, stamp, is_train):
        if is_train:
            self.lookups.append(Lookup(table, ROUTED, tf.reshape(ids, [-1]), stamp,
                                       table.is_dp))
        else:
            self.evaluation_lookups += 1
        return None


class StepPlans:
    """The plans of one batch, handed to the step's lookups in recorded order.

    Args:
        tables: the table of each planned lookup, in order.
        kinds: OWNED or ROUTED per lookup.
        plans: per lookup, (rows, restore, reused) for OWNED, routing.Route for ROUTED.
        rounds: the key-stage calls of the pipeline: per call, the indexes of its lookups.
        batch_ids: per call, its batch ids (int64 [len(call)]).
    """

    def __init__(self, tables, kinds, plans, rounds, batch_ids):
        self._queues: Dict[str, Deque[int]] = {}
        for index, table in enumerate(tables):
            self._queues.setdefault(table.table_key, deque()).append(index)
        self._tables, self._kinds, self._plans = list(tables), list(kinds), list(plans)
        self._round_of = {i: r for r, members in enumerate(rounds) for i in members}
        self._rounds, self._batch_ids = [list(m) for m in rounds], list(batch_ids)
        self._commits: Dict[int, tf.Operation] = {}

    def _take(self, table, kind: str, is_train: bool) -> int:
        where = f"mxrec.keras.data.plan_ahead: table {table.table_name!r}"
        if not is_train:
            raise RuntimeError(
                f"{where}: the batch was planned for training (its IDs are counted and given "
                "rows when the step trains it), but the model looks it up with "
                "training=False; give evaluate, predict and validation_data the dataset "
                "without plan_ahead (evaluation plans nothing ahead)")
        queue = self._queues.get(table.table_key)
        if not queue:
            raise RuntimeError(
                f"{where}: the step looks the table up more often than the model's trace "
                "did when plan_ahead planned the batch; the planned dataset must be trained "
                "by the model given to plan_ahead, whose lookups depend on the inputs only")
        index = queue.popleft()
        if self._kinds[index] != kind:
            raise RuntimeError(f"{where}: planned on {self._kinds[index]} lookups, but the "
                               f"step makes a {kind} one (the rank count changed?)")
        return index

    def owned(self, table, ids, stamp, is_train) -> Optional[Tuple[tf.Tensor, ...]]:
        """(rows, restore, reused) of the lookup, read after the batch's commit."""
        index = self._take(table, OWNED, is_train)
        rows, restore, reused = self._plans[index]
        commit = self._commit(self._round_of[index])
        with tf.device("/device:CPU:0"), tf.control_dependencies([commit]):
            rows, reused = tf.identity(rows), tf.identity(reused)
        restore.set_shape(tf.reshape(ids, [-1]).shape)
        return rows, restore, reused

    def routed(self, table, ids, stamp, is_train):
        """The lookup's routing.Route, computed in the pipeline."""
        return routing.Route(*self._plans[self._take(table, ROUTED, is_train)])

    def _commit(self, round_index: int) -> tf.Operation:
        if round_index not in self._commits:
            keys = [self._tables[i].table_key for i in self._rounds[round_index]]
            self._commits[round_index] = mxrec_ops.commit_batches(
                self._batch_ids[round_index], keys)
        return self._commits[round_index]

    def check_consumed(self) -> None:
        """Raises RuntimeError when a planned lookup was not made: its batch would stay
        planned and never trained."""
        left = sorted({self._tables[i].table_name for q in self._queues.values() for i in q})
        if left:
            raise RuntimeError(
                f"mxrec.keras.data.plan_ahead: the step did not look up table(s) {left} as "
                "the model's trace did when the batch was planned (call the model with "
                "training=True on the whole planned element)")


def current():
    """The active Recorder or StepPlans of this thread, or None."""
    stack = getattr(_stack, "items", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def active(scope):
    """Makes `scope` (a Recorder or StepPlans) the one the layers see, inside the block."""
    stack = getattr(_stack, "items", None)
    if stack is None:
        stack = _stack.items = []
    stack.append(scope)
    try:
        yield scope
    finally:
        stack.pop()

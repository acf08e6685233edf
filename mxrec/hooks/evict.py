"""EvictHook: removes IDs that stopped appearing, every N steps or T seconds.

mx_rec's path is `mx_rec.core.feature_process.EvictHook`: `mxrec.core.feature_process` is this
module (mxrec.compat), and `mxrec.hooks.EvictHook` the same class."""

import time
from typing import Optional

import tensorflow as tf
from absl import logging

from mxrec.util.config import get_config_initializer


class EvictHook(tf.compat.v1.train.SessionRunHook):
    """Runs eviction on every table that has an `eviction_threshold`.

    An ID is removed, with its row and optimizer slots, once its last batch
    time is more than `eviction_threshold` seconds older than the newest batch
    time the table has seen (batch time: the timestamp feature where one is
    given, the wall clock otherwise). Its row is re-initialised before reuse.
    IDs of batches that the key stage planned but the step has not trained yet
    (the prefetch window) are never removed.

    Args:
        evict_enable: whether the hook does anything.
        evict_time_interval: seconds of wall-clock time between evictions.
        evict_step_interval: steps between evictions (of the global step where the graph
            has one: after the steps that reach a multiple of it, and once after a restore
            at such a step); None to evict by time only.

    Example:
        >>> hook = EvictHook(evict_enable=True, evict_time_interval=24 * 3600,
        ...                  evict_step_interval=10000)
        >>> estimator.train(input_fn, hooks=[hook])
    """

    def __init__(self, evict_enable: bool = False, evict_time_interval: float = 24 * 60 * 60,
                 evict_step_interval: Optional[int] = None):
        if not isinstance(evict_enable, bool):
            raise TypeError(f"EvictHook: evict_enable must be a bool, got {evict_enable!r}")
        if evict_time_interval is not None and evict_time_interval <= 0:
            raise ValueError("EvictHook: evict_time_interval must be > 0 seconds, got "
                             f"{evict_time_interval}")
        if evict_step_interval is not None and (
                isinstance(evict_step_interval, bool) or not isinstance(evict_step_interval, int)
                or evict_step_interval <= 0):
            raise ValueError("EvictHook: evict_step_interval must be a positive int, got "
                             f"{evict_step_interval!r}")
        self._enabled = evict_enable
        self._time_interval = evict_time_interval
        self._step_interval = evict_step_interval
        self._steps = 0
        self._last_time = None
        self.evicted_total = 0

    def begin(self):
        self._steps = 0
        self._last_time = time.monotonic()
        # Where the graph has a global step, the step interval counts it (so training split
        # over several train() calls or restarted from a checkpoint evicts at the steps a
        # single run does); else the hook counts its own runs.
        self._global_step = (tf.compat.v1.train.get_global_step()
                             if self._enabled and self._step_interval is not None else None)

    def after_create_session(self, session, coord):
        del coord
        if self._global_step is None:
            return
        self._steps = int(session.run(self._global_step))
        # A checkpoint written at a step due for eviction may precede it (an Estimator runs
        # its CheckpointSaverHook before the user's hooks): evict again after a restore.
        # Eviction by batch time is idempotent (no batch came between): where the checkpoint
        # already had it this removes nothing.
        if self._steps > 0 and self._steps % self._step_interval == 0:
            self.evict_now()

    def after_run(self, run_context, run_values):
        if not self._enabled:
            return
        if self._global_step is not None:
            before = self._steps
            self._steps = int(run_context.session.run(self._global_step))
            due = self._steps // self._step_interval > before // self._step_interval
        else:
            self._steps += 1
            due = self._step_interval is not None and self._steps % self._step_interval == 0
        now = time.monotonic()
        if self._time_interval is not None and now - self._last_time >= self._time_interval:
            due = True
        if due:
            self._last_time = now
            self.evict_now()

    def evict_now(self) -> int:
        """Evicts on every table with an eviction_threshold; returns IDs removed."""
        runtime = get_config_initializer()
        removed = 0
        for table in runtime.tables.values():
            if table.eviction_threshold is None:
                continue
            count = table.evict(table.eviction_threshold)
            logging.info("EvictHook: table %s removed %d IDs", table.table_name, count)
            removed += count
        self.evicted_total += removed
        return removed

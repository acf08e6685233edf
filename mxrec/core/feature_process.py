"""EvictHook (mx_rec's `mx_rec.core.feature_process.EvictHook`): removes IDs that stopped
appearing, every N steps or T seconds (`mxrec.hooks.EvictHook` is the same class)."""

import time
from typing import Optional

import tensorflow as tf
from absl import logging

from mxrec.util.initialize import get_config_initializer


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
        evict_step_interval: steps between evictions; None to evict by time only.

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

    def after_run(self, run_context, run_values):
        if not self._enabled:
            return
        self._steps += 1
        now = time.monotonic()
        due = self._step_interval is not None and self._steps % self._step_interval == 0
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

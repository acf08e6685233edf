"""TableStatsHook: per-table host statistics as TensorBoard scalars."""

from typing import Optional

import tensorflow as tf

from mxrec.core import tiers
from mxrec.util.config import get_config_initializer

STAT_NAMES = ("rows_in_use", "ids_tracked", "ids_seen", "admitted", "rejected", "evicted")
# Tables with a host tier add rows per tier and the last step's swap traffic.
TIER_STAT_NAMES = ("host_rows", "ssd_rows", "swap_in_last", "swap_out_last")


class TableStatsHook(tf.compat.v1.train.SessionRunHook):
    """Writes `mxrec/<table>/<stat>` scalars every `every_n_steps` steps (STAT_NAMES, and
    TIER_STAT_NAMES for tables with a host tier).

    Args:
        output_dir: event file folder (the Estimator's model_dir, say).
        every_n_steps: steps between writes.

    Example:
        >>> hooks = [TableStatsHook(model_dir, every_n_steps=100)]
    """

    def __init__(self, output_dir: str, every_n_steps: int = 100):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) \
                or every_n_steps <= 0:
            raise ValueError(f"TableStatsHook: every_n_steps must be a positive int, "
                             f"got {every_n_steps!r}")
        self._output_dir = output_dir
        self._every = every_n_steps
        self._writer: Optional[tf.compat.v1.summary.FileWriter] = None
        self._steps = 0

    def begin(self):
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)
        self._steps = 0

    def after_run(self, run_context, run_values):
        self._steps += 1
        if self._steps % self._every == 0:
            self.write(self._steps)

    def end(self, session):
        self.write(self._steps)
        self._writer.flush()

    def write(self, step: int):
        values = []
        for table in get_config_initializer().tables.values():
            stats = table.stats()
            names = STAT_NAMES
            if tiers.is_tiered(table):
                stats = dict(stats, **tiers.stats(table))
                names = STAT_NAMES + TIER_STAT_NAMES
            for name in names:
                values.append(tf.compat.v1.Summary.Value(
                    tag=f"mxrec/{table.table_name}/{name}", simple_value=float(stats[name])))
        self._writer.add_summary(tf.compat.v1.Summary(value=values), step)

"""IncrementalCheckpointHook: full and delta checkpoints on a timer, restore at start.

The hook drives mxrec's Saver (`mxrec.saver.checkpoint`) as init(is_incremental_checkpoint=True,
...) configures it.
"""

import time
from typing import Optional

import tensorflow as tf

from mxrec.saver.checkpoint import Saver, check_flag
from mxrec.util.config import get_config_initializer


class IncrementalCheckpointHook(tf.compat.v1.train.SessionRunHook):
    """Full saves every `save_checkpoint_due_time` seconds, deltas every
    `save_delta_checkpoints_secs` seconds, as init(is_incremental_checkpoint=True, ...)
    configures; restores the latest version (or init's restore_model_version) when the
    session starts and a checkpoint exists.

    Args:
        checkpoint_dir: the versions' directory.
        save_checkpoint_due_time, save_delta_checkpoints_secs, restore_model_version:
            override init()'s settings.
        max_to_keep: the Saver's.
        check_finite: the Saver's: each save refuses (NonFiniteError, out of the
            session's run) a model holding a NaN or an infinity.
    """

    def __init__(self, checkpoint_dir: str, save_checkpoint_due_time: Optional[float] = None,
                 save_delta_checkpoints_secs: Optional[float] = None,
                 restore_model_version: Optional[int] = None, max_to_keep: Optional[int] = 5,
                 check_finite: bool = False):
        config = get_config_initializer().config
        self._check_finite = check_flag("IncrementalCheckpointHook", check_finite)
        self._dir = checkpoint_dir
        self._full_every = (config.save_checkpoint_due_time
                            if save_checkpoint_due_time is None else save_checkpoint_due_time)
        self._delta_every = (config.save_delta_checkpoints_secs
                             if save_delta_checkpoints_secs is None
                             else save_delta_checkpoints_secs)
        self._version = (config.restore_model_version
                         if restore_model_version is None else restore_model_version)
        self._max_to_keep = max_to_keep
        self._saver: Optional[Saver] = None
        self._step = 0
        self._last_full = self._last_delta = 0.0
        self.restored_step: Optional[int] = None

    def begin(self):
        self._saver = Saver(self._dir, max_to_keep=self._max_to_keep,
                            check_finite=self._check_finite)
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        if self._saver.versions():
            self.restored_step = self._saver.restore(session, self._version)
            self._step = self.restored_step
        else:
            self._saver.save(session, self._current_step(session), kind="full")
        self._last_full = self._last_delta = time.monotonic()

    def _current_step(self, session) -> int:
        if self._global_step is not None:
            return int(session.run(self._global_step))
        return self._step

    def after_run(self, run_context, run_values):
        self._step += 1
        now = time.monotonic()
        session = run_context.session
        step = self._current_step(session)
        if step == self._saver.last_step:
            return  # nothing trained since the last save (the global step did not move)
        if self._full_every and now - self._last_full >= self._full_every:
            self._saver.save(session, step, kind="full")
            self._last_full = self._last_delta = now
        elif self._delta_every and now - self._last_delta >= self._delta_every:
            self._saver.save(session, step, kind="delta")
            self._last_delta = now

    def end(self, session):
        step = self._current_step(session)
        if step != self._saver.last_step:
            self._saver.save(session, step, kind="delta")

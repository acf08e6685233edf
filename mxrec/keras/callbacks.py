"""Keras callbacks over mxrec.keras tables.

`Evict(every_steps=N)`: after the training steps that reach a multiple of N (counted by the
optimizer's iterations, so across epochs and fits), every `Embedding` of the model that has
an eviction_threshold evicts the IDs unseen for longer than it, as the Session path's
EvictHook does between steps. It runs between Model.fit's executions (with
steps_per_execution > 1, at the end of the execution that crosses the multiple).
"""

from typing import List, Optional

import tensorflow as tf

from mxrec.keras.layers import Embedding, embedding_layers  # noqa: F401 (its old path)


class Evict(tf.keras.callbacks.Callback):
    """Eviction every `every_steps` training steps.

    Attributes:
        evicted_total: IDs removed by this callback so far.

    Raises:
        ValueError: every_steps is not a positive int; at the start of training, a model
            without an Embedding that has an eviction_threshold.
    """

    def __init__(self, every_steps: int):
        super().__init__()
        if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps <= 0:
            raise ValueError(f"mxrec.keras.callbacks.Evict: every_steps must be a positive "
                             f"int, got {every_steps!r}")
        self.every_steps = every_steps
        self.evicted_total = 0
        self._layers: List[Embedding] = []
        self._last: Optional[int] = None

    def on_train_begin(self, logs=None):
        self._layers = [layer for layer in embedding_layers(self.model)
                        if layer.table.eviction_threshold is not None]
        if not self._layers:
            raise ValueError("mxrec.keras.callbacks.Evict: the model has no mxrec.keras "
                             "Embedding with an eviction_threshold")
        self._last = None

    def _steps(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_batch_begin(self, batch, logs=None):
        if self._last is None:  # read here: a Checkpoint callback may restore iterations
            self._last = self._steps()

    def on_train_batch_end(self, batch, logs=None):
        steps = self._steps()
        if self._last is None:
            self._last = steps - 1
        if steps // self.every_steps > self._last // self.every_steps:
            for layer in self._layers:
                self.evicted_total += layer.evict()
        self._last = steps


class Checkpoint(tf.keras.callbacks.Callback):
    """Full and delta checkpoints of the model during Model.fit, in the Session path's format
    (mxrec.saver.checkpoint; `mxrec.keras.saving.KerasSaver`), and resuming from them.

    At the start of training: the latest version in `directory` (or `restore_version`) is
    restored when there is one (tables, their optimizer slots, dense weights, the optimizer's
    state and iterations), else a full version is saved there. After the training steps that
    reach a multiple of `full_every` (counted by the optimizer's iterations, as Evict counts)
    a full version is saved, else after those reaching a multiple of `delta_every` a delta;
    at the end of training a delta, when steps were trained since the last save. Saves are
    atomic (a killed save leaves the versions before it) and run between steps, so they hold
    the state of trained steps only. On several ranks every rank runs the callback (saves
    and restores are collective) on one folder they all see: each writes its shard.

    Args:
        directory: where versions live.
        full_every, delta_every: steps between full saves / deltas (None: none).
        max_to_keep: full versions kept (with their deltas); None keeps all.
        restore: False starts from the model as it is (versions in the directory are then
            refused: a save would mix two runs).
        restore_version: the step of the version to restore (None: the latest).
        dense_names: {Keras name: name in the checkpoint} (see mxrec.keras.saving).

    Attributes:
        saver: the KerasSaver (after the start of training); restored_step: the step
            restored at the start, or None.

    Raises:
        ValueError: full_every / delta_every not positive ints (or both None).
    """

    def __init__(self, directory: str, full_every: Optional[int] = None,
                 delta_every: Optional[int] = None, max_to_keep: Optional[int] = 5,
                 restore: bool = True, restore_version: Optional[int] = None,
                 dense_names=None):
        super().__init__()
        for label, value in (("full_every", full_every), ("delta_every", delta_every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value <= 0):
                raise ValueError(f"mxrec.keras.callbacks.Checkpoint: {label} must be a positive "
                                 f"int or None, got {value!r}")
        if full_every is None and delta_every is None:
            raise ValueError("mxrec.keras.callbacks.Checkpoint: give full_every, delta_every "
                             "or both (steps between saves)")
        self.directory = directory
        self.full_every, self.delta_every = full_every, delta_every
        self._max_to_keep, self._restore, self._version = max_to_keep, restore, restore_version
        self._dense_names = dense_names
        self.saver = None
        self.restored_step: Optional[int] = None
        self._last = 0

    def _steps(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        from mxrec.keras import saving  # noqa: PLC0415 (saving imports this module's layers)

        optimizer = self.model.optimizer
        saving.check_optimizer("mxrec.keras.callbacks.Checkpoint", optimizer)
        saving.build_optimizer(optimizer, self.model)
        if self.saver is None:
            self.saver = saving.KerasSaver(self.directory, self.model, optimizer,
                                           max_to_keep=self._max_to_keep,
                                           dense_names=self._dense_names)
        if self.saver.last_step is None:  # the first fit of this callback
            if self.saver.versions():
                if not self._restore:
                    raise ValueError(
                        f"mxrec.keras.callbacks.Checkpoint: {self.directory!r} holds versions "
                        f"{self.saver.versions()[-1]} and restore=False; give an empty "
                        "directory, or restore=True to continue from them")
                self.restored_step = self.saver.restore(self._version)
            else:
                self.saver.save(kind="full")
        self._last = self._steps()

    def on_train_batch_end(self, batch, logs=None):
        steps = self._steps()
        if steps == self.saver.last_step:
            return

        def crossed(every):
            return every is not None and steps // every > self._last // every

        if crossed(self.full_every):
            self.saver.save(kind="full")
        elif crossed(self.delta_every):
            self.saver.save(kind="delta")
        self._last = steps

    def on_train_end(self, logs=None):
        if self.saver is not None and self._steps() != self.saver.last_step:
            self.saver.save(kind="delta")

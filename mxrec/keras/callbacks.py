"""Keras callbacks over mxrec.keras tables.

`Evict(every_steps=N)`: after the training steps that reach a multiple of N (counted by the
optimizer's iterations, so across epochs and fits), every `Embedding` of the model that has
an eviction_threshold evicts the IDs unseen for longer than it, as the Session path's
EvictHook does between steps. It runs between Model.fit's executions (with
steps_per_execution > 1, at the end of the execution that crosses the multiple).
"""

from typing import List

import tensorflow as tf

from mxrec.keras.layers import Embedding


def embedding_layers(model) -> List[Embedding]:
    """The mxrec.keras Embedding layers of `model`, nested models included, once each."""
    found, seen = [], set()

    def walk(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        if isinstance(layer, Embedding):
            found.append(layer)
        for inner in getattr(layer, "layers", ()) or ():
            walk(inner)

    walk(model)
    return found


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
        self._last = 0

    def on_train_begin(self, logs=None):
        self._layers = [layer for layer in embedding_layers(self.model)
                        if layer.table.eviction_threshold is not None]
        if not self._layers:
            raise ValueError("mxrec.keras.callbacks.Evict: the model has no mxrec.keras "
                             "Embedding with an eviction_threshold")
        self._last = self._steps()

    def _steps(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        steps = self._steps()
        if steps // self.every_steps > self._last // self.every_steps:
            for layer in self._layers:
                self.evicted_total += layer.evict()
        self._last = steps

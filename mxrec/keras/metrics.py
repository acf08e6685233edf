"""Keras metrics over the global batch on several ranks.

Each rank's Keras metrics see its slice of every global batch. `Global(metric)` keeps the
rank's own state and, when its result is read, sums every state variable over the ranks
(one all-reduce) into a twin metric, whose result is the metric of the global batches so
far: exact for the metrics whose state is sums (Keras' Mean, Sum, AUC, Precision, Recall,
the accuracies, the mean errors, the confusion-matrix metrics). On one rank it is the metric.

    model.compile(optimizer=..., loss=...,
                  metrics=[mk.metrics.Global(tf.keras.metrics.AUC(name="auc"))])
"""

import tensorflow as tf

from mxrec.distributed import communication
from mxrec.keras import _compat


class Global(tf.keras.metrics.Metric):
    """`metric` over the global batch: its state summed over the ranks when read.

    Args:
        metric: a Keras metric whose state variables are sums (not a max or a min).
        name: the metric's name in logs (the wrapped metric's by default).

    Raises:
        TypeError: `metric` is not a Keras Metric.
    """

    def __init__(self, metric, name=None, **kwargs):
        if not isinstance(metric, tf.keras.metrics.Metric):
            raise TypeError("mxrec.keras.metrics.Global: wrap a Keras metric "
                            f"(tf.keras.metrics.*), got {type(metric).__name__}")
        super().__init__(name=name or metric.name, dtype=metric.dtype, **kwargs)
        self.local = metric
        self.twin = type(metric).from_config(metric.get_config())

    def update_state(self, *args, **kwargs):
        return self.local.update_state(*args, **kwargs)

    def result(self):
        if communication.get_rank_size() == 1:
            return self.local.result()
        local = [_compat.tf_variable(v) for v in self.local.variables]
        twin = [_compat.tf_variable(v) for v in self.twin.variables]
        if len(local) != len(twin) or not local:
            raise ValueError(f"mxrec.keras.metrics.Global {self.name!r}: the metric has "
                             f"{len(local)} state variables and its twin {len(twin)}; build "
                             "the metric's state in its constructor")
        flat = tf.concat([tf.reshape(tf.cast(v, tf.float64), [-1]) for v in local], axis=0)
        summed = communication.allreduce(flat, "sum")
        pieces = tf.split(summed, [int(v.shape.num_elements()) for v in local])
        assigns = [t.assign(tf.cast(tf.reshape(p, t.shape), t.dtype))
                   for t, p in zip(twin, pieces)]
        with tf.control_dependencies(assigns):
            return tf.identity(self.twin.result())

    def reset_state(self):
        self.local.reset_state()
        self.twin.reset_state()

    def get_config(self):
        return {"name": self.name, "metric": tf.keras.metrics.serialize(self.local)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(tf.keras.metrics.deserialize(config.pop("metric")), **config)

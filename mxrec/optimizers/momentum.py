"""Momentum on the touched rows (ResourceSparseApplyMomentum)."""

import tensorflow as tf

from mxrec.optimizers.base import HashOptimizerMixin, check_arguments


class CustomizedMomentum(HashOptimizerMixin, tf.compat.v1.train.MomentumOptimizer):
    """Momentum whose accumulator changes only for the rows in the gradient."""

    def _slot_initial_values(self):
        return {"momentum": 0.0}

    def _float32_rows(self, grad, rows, slots):
        """The rule of a table stored in reduced precision (mxrec.optimizers.rounded), as
        TF's kernel: accum = momentum * accum + g; row -= lr * accum (Nesterov: row -=
        lr * g + lr * momentum * accum)."""
        lr = tf.cast(self._learning_rate_tensor, tf.float32)
        momentum = tf.cast(self._momentum_tensor, tf.float32)
        accum = momentum * slots["momentum"] + grad
        if self._use_nesterov:
            return rows - (lr * grad + lr * momentum * accum), {"momentum": accum}
        return rows - lr * accum, {"momentum": accum}


def create_hash_optimizer(learning_rate=0.001, momentum=0.9, use_locking=False, name="Momentum",
                          use_nesterov=False):
    check_arguments("momentum.create_hash_optimizer", learning_rate, use_locking, name)
    return CustomizedMomentum(learning_rate, momentum, use_locking=use_locking, name=name,
                              use_nesterov=use_nesterov)

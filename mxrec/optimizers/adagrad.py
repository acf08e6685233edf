"""Adagrad on the touched rows: accumulator += g^2; row -= lr * g / sqrt(accumulator)."""

import tensorflow as tf

from mxrec.optimizers.base import HashOptimizerMixin, check_arguments


class CustomizedAdagrad(HashOptimizerMixin, tf.compat.v1.train.AdagradOptimizer):
    """Adagrad whose sparse update (ResourceSparseApplyAdagrad) reads and writes
    only the rows in the gradient."""

    def _slot_initial_values(self):
        return {"accumulator": self._initial_accumulator_value}

    def _float32_rows(self, grad, rows, slots):
        """The rule of a table stored in reduced precision (mxrec.optimizers.rounded)."""
        accumulator = slots["accumulator"] + grad * grad
        lr = tf.cast(self._learning_rate_tensor, tf.float32)
        # DivNoNan (the accumulator is > 0, so the same quotient): Grappler rewrites
        # x / sqrt(y) into x * rsqrt(y), which rounds differently from the division.
        step = tf.math.divide_no_nan(lr * grad, tf.sqrt(accumulator))
        return rows - step, {"accumulator": accumulator}


def create_hash_optimizer(learning_rate=0.001, initial_accumulator_value=0.9, use_locking=False,
                          name="Adagrad"):
    check_arguments("adagrad.create_hash_optimizer", learning_rate, use_locking, name)
    if initial_accumulator_value <= 0:
        raise ValueError("adagrad.create_hash_optimizer: initial_accumulator_value must be > 0, "
                         f"got {initial_accumulator_value}")
    return CustomizedAdagrad(learning_rate, initial_accumulator_value=initial_accumulator_value,
                             use_locking=use_locking, name=name)

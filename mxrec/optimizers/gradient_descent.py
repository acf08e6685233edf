"""Plain SGD on the touched rows."""

import tensorflow as tf

from mxrec.optimizers.base import HashOptimizerMixin, check_arguments


class CustomizedGradientDescent(HashOptimizerMixin, tf.compat.v1.train.GradientDescentOptimizer):
    """SGD: row -= learning_rate * summed gradient of the row."""

    def _float32_rows(self, grad, rows, slots):
        """The rule of a table stored in reduced precision (mxrec.optimizers.rounded)."""
        del slots
        return rows - tf.cast(self._learning_rate_tensor, tf.float32) * grad, {}


def create_hash_optimizer(learning_rate, use_locking=False, name="GradientDescent"):
    check_arguments("gradient_descent.create_hash_optimizer", learning_rate, use_locking, name)
    return CustomizedGradientDescent(learning_rate, use_locking=use_locking, name=name)

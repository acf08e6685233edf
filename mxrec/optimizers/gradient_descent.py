"""Plain SGD on the touched rows."""

import tensorflow as tf

from mxrec.optimizers.base import HashOptimizerMixin, check_arguments


class CustomizedGradientDescent(HashOptimizerMixin, tf.compat.v1.train.GradientDescentOptimizer):
    """SGD: row -= learning_rate * summed gradient of the row."""


def create_hash_optimizer(learning_rate, use_locking=False, name="GradientDescent"):
    check_arguments("gradient_descent.create_hash_optimizer", learning_rate, use_locking, name)
    return CustomizedGradientDescent(learning_rate, use_locking=use_locking, name=name)

"""FTRL-Proximal on the touched rows (ResourceSparseApplyFtrl)."""

import tensorflow as tf

from mxrec.optimizers.base import HashOptimizerMixin, check_arguments


class CustomizedFtrl(HashOptimizerMixin, tf.compat.v1.train.FtrlOptimizer):
    """FTRL whose accumulators change only for the rows in the gradient."""

    def _slot_initial_values(self):
        return {"accum": self._initial_accumulator_value, "linear": 0.0}


def create_hash_optimizer(learning_rate=0.01, learning_rate_power=-0.5,
                          initial_accumulator_value=0.1, l1_regularization_strength=0.0,
                          l2_regularization_strength=0.0, use_locking=False, name="Ftrl",
                          **kwargs):
    check_arguments("ftrl.create_hash_optimizer", learning_rate, use_locking, name)
    return CustomizedFtrl(learning_rate, learning_rate_power=learning_rate_power,
                          initial_accumulator_value=initial_accumulator_value,
                          l1_regularization_strength=l1_regularization_strength,
                          l2_regularization_strength=l2_regularization_strength,
                          use_locking=use_locking, name=name, **kwargs)

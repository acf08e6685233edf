"""Momentum on the touched rows (ResourceSparseApplyMomentum)."""

import tensorflow as tf

from mxrec.optimizers.base import HashOptimizerMixin, check_arguments


class CustomizedMomentum(HashOptimizerMixin, tf.compat.v1.train.MomentumOptimizer):
    """Momentum whose accumulator changes only for the rows in the gradient."""

    def _slot_initial_values(self):
        return {"momentum": 0.0}


def create_hash_optimizer(learning_rate=0.001, momentum=0.9, use_locking=False, name="Momentum",
                          use_nesterov=False):
    check_arguments("momentum.create_hash_optimizer", learning_rate, use_locking, name)
    return CustomizedMomentum(learning_rate, momentum, use_locking=use_locking, name=name,
                              use_nesterov=use_nesterov)

"""LazyAdam: Adam whose moments decay only for the rows a batch touched.

For the rows r of a batch with summed gradient g (t = step, from 1):
    m[r] = beta1 * m[r] + (1 - beta1) * g
    v[r] = beta2 * v[r] + (1 - beta2) * g^2
    row[r] -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m[r] / (sqrt(v[r]) + epsilon)
Rows not in the batch, and their moments, stay as they are.
"""

import tensorflow as tf

from mxrec.optimizers.base import HashOptimizerMixin, check_arguments


class CustomizedLazyAdam(HashOptimizerMixin, tf.compat.v1.train.AdamOptimizer):
    """TF's Adam bookkeeping (slots m and v, beta powers) with a lazy sparse update."""

    def _slot_initial_values(self):
        return {"m": 0.0, "v": 0.0}

    def _float32_rows(self, grad, rows, slots):
        """The rule of a table stored in reduced precision (mxrec.optimizers.rounded): the
        same arithmetic as `_resource_apply_sparse`, in float32."""
        step_size, beta1, beta2, epsilon = self._float32_constants(tf.float32)
        m_rows = beta1 * slots["m"] + (1.0 - beta1) * grad
        v_rows = beta2 * slots["v"] + (1.0 - beta2) * tf.square(grad)
        update = step_size * m_rows / (tf.sqrt(v_rows) + epsilon)
        return rows - update, {"m": m_rows, "v": v_rows}

    def _float32_constants(self, dtype):
        """(step size, beta1, beta2, epsilon) as `dtype` tensors."""
        beta1_power, beta2_power = self._get_beta_accumulators()
        beta1_power = tf.cast(beta1_power, dtype)
        beta2_power = tf.cast(beta2_power, dtype)
        lr = tf.cast(self._lr_t, dtype)
        step_size = lr * tf.sqrt(1.0 - beta2_power) / (1.0 - beta1_power)
        return (step_size, tf.cast(self._beta1_t, dtype), tf.cast(self._beta2_t, dtype),
                tf.cast(self._epsilon_t, dtype))

    def _resource_apply_sparse(self, grad, var, indices):
        beta1_power, beta2_power = self._get_beta_accumulators()
        dtype = var.dtype.base_dtype
        beta1_power = tf.cast(beta1_power, dtype)
        beta2_power = tf.cast(beta2_power, dtype)
        lr = tf.cast(self._lr_t, dtype)
        beta1 = tf.cast(self._beta1_t, dtype)
        beta2 = tf.cast(self._beta2_t, dtype)
        epsilon = tf.cast(self._epsilon_t, dtype)
        step_size = lr * tf.sqrt(1.0 - beta2_power) / (1.0 - beta1_power)

        m = self.get_slot(var, "m")
        v = self.get_slot(var, "v")
        m_rows = beta1 * tf.gather(m, indices) + (1.0 - beta1) * grad
        v_rows = beta2 * tf.gather(v, indices) + (1.0 - beta2) * tf.square(grad)
        update = step_size * m_rows / (tf.sqrt(v_rows) + epsilon)
        m_op = m.scatter_update(tf.IndexedSlices(m_rows, indices))
        v_op = v.scatter_update(tf.IndexedSlices(v_rows, indices))
        with tf.control_dependencies([m_op, v_op]):
            var_op = var.scatter_sub(tf.IndexedSlices(update, indices))
        return tf.group(m_op, v_op, var_op)


def create_hash_optimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                          use_locking=False, name="LazyAdam"):
    check_arguments("lazy_adam.create_hash_optimizer", learning_rate, use_locking, name)
    for label, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"lazy_adam.create_hash_optimizer: {label} must be in [0, 1), "
                             f"got {beta}")
    if epsilon <= 0:
        raise ValueError(f"lazy_adam.create_hash_optimizer: epsilon must be > 0, got {epsilon}")
    return CustomizedLazyAdam(learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon,
                              use_locking=use_locking, name=name)

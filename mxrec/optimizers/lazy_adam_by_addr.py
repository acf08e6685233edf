"""LazyAdam by address for dynamic-expansion tables.

The formula of mxrec.optimizers.lazy_adam, on the rows at the given addresses
(summed gradient g, t = number of apply_gradients calls so far, from 1):
    m[a] = beta1 * m[a] + (1 - beta1) * g
    v[a] = beta2 * v[a] + (1 - beta2) * g^2
    row[a] -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m[a] / (sqrt(v[a]) + epsilon)
m and v are the store slots `<name>/m` and `<name>/v`; beta1^t and beta2^t are
TF variables of this optimizer (`<name>/beta1_power`, `<name>/beta2_power`),
saved with the graph's other variables and advanced after each call.
"""

import weakref

import tensorflow as tf

from mxrec.core import dynamic
from mxrec.optimizers.by_address import ByAddressOptimizer


class LazyAdamByAddress(ByAddressOptimizer):
    """LazyAdam on the rows at the given addresses (see ByAddressOptimizer)."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 name="LazyAdamByAddress"):
        super().__init__(learning_rate, name, "lazy_adam_by_addr")
        for label, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"lazy_adam_by_addr.create_hash_optimizer_by_address: {label} "
                                 f"must be in [0, 1), got {beta}")
        if epsilon <= 0:
            raise ValueError("lazy_adam_by_addr.create_hash_optimizer_by_address: epsilon must "
                             f"be > 0, got {epsilon}")
        self._beta1 = float(beta1)
        self._beta2 = float(beta2)
        self._epsilon = float(epsilon)
        self._powers = weakref.WeakKeyDictionary()  # graph -> (beta1_power, beta2_power)

    def get_slot_names(self):
        return ["m", "v"]

    def beta_powers(self):
        """(beta1_power, beta2_power) variables of the default graph, or None before the
        first apply_gradients in it."""
        return self._powers.get(tf.compat.v1.get_default_graph())

    def _prepare(self):
        graph = tf.compat.v1.get_default_graph()
        if graph in self._powers:
            return
        # Outside any caller's name scope or control dependencies, like TF's
        # non-slot variables.
        with tf.control_dependencies(None), graph.name_scope(None), tf.device("/device:CPU:0"):
            self._powers[graph] = tuple(
                tf.compat.v1.Variable(value, name=f"{self._name}/{label}", dtype=tf.float32,
                                      trainable=False, use_resource=True)
                for label, value in (("beta1_power", self._beta1), ("beta2_power", self._beta2)))

    def _apply(self, table, grad, address, lr):
        beta1_power, beta2_power = self.beta_powers()
        return dynamic._ops().mxrec_dynamic_apply_lazy_adam(
            address, grad, lr, tf.constant(self._beta1), tf.constant(self._beta2),
            tf.constant(self._epsilon), beta1_power.read_value(), beta2_power.read_value(),
            table_key=table.table_key, dim=table.dim, m_slot=self.store_slot("m"),
            v_slot=self.store_slot("v"))

    def _finish(self):
        beta1_power, beta2_power = self.beta_powers()
        return [beta1_power.assign(beta1_power * self._beta1),
                beta2_power.assign(beta2_power * self._beta2)]


def create_hash_optimizer_by_address(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                                     use_locking=False, name="LazyAdamByAddress"):
    """LazyAdam for tables of init(use_dynamic_expansion=True).

    Example:
        >>> opt = create_hash_optimizer_by_address(learning_rate=0.001)
        >>> train_op = opt.apply_gradients(list(zip(grads, addresses)))
    """
    if not isinstance(use_locking, bool):
        raise TypeError(f"lazy_adam_by_addr: use_locking must be a bool, got {use_locking!r}")
    # Either value is honoured: every update holds the store's lock.
    return LazyAdamByAddress(learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon,
                             name=name)


# mx_rec's other spelling (its Estimator example imports this one).
create_hash_optimizer_by_addr = create_hash_optimizer_by_address

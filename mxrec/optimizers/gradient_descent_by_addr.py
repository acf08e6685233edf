"""SGD by address for dynamic-expansion tables, with mx_rec's optional weight decay.

For each distinct address a of one apply_gradients call (g: its summed gradient):
    row[a] -= learning_rate * (g + weight_decay * row[a])     (weight_decay None: g alone)
"""

import tensorflow as tf

from mxrec.core import dynamic
from mxrec.optimizers.by_address import ByAddressOptimizer


def _check_weight_decay(weight_decay, factory: str):
    if weight_decay is None:
        return None
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)):
        raise TypeError(f"{factory}: weight_decay must be a number or None, got "
                        f"{weight_decay!r}")
    if not 0.0 <= weight_decay <= 1.0:  # mx_rec's documented range
        raise ValueError(f"{factory}: weight_decay must be in [0.0, 1.0] (as in mx_rec), got "
                         f"{weight_decay}")
    return float(weight_decay)


class SGDByAddr(ByAddressOptimizer):
    """SGD on the rows at the given addresses (see ByAddressOptimizer)."""

    def __init__(self, learning_rate, name="SGDByAddr", weight_decay=None):
        super().__init__(learning_rate, name, "gradient_descent_by_addr")
        self.weight_decay = _check_weight_decay(weight_decay, "gradient_descent_by_addr")

    def _apply(self, table, grad, address, lr):
        if self.weight_decay:
            # Decay once per distinct address: sum a repeated address's gradients first.
            address, positions = tf.unique(address)
            grad = tf.math.unsorted_segment_sum(grad, positions, tf.size(address))
            # After the step's lookups made their new rows (they are read here).
            with tf.control_dependencies(table.refills(tf.compat.v1.get_default_graph())):
                rows = dynamic._ops().mxrec_dynamic_gather(address, table_key=table.table_key,
                                                           dim=table.dim)
            grad = grad + tf.constant(self.weight_decay, tf.float32) * rows
        return dynamic._ops().mxrec_dynamic_apply_sgd(
            address, grad, lr, table_key=table.table_key, dim=table.dim)


def create_hash_optimizer_by_address(learning_rate, use_locking=False, name="SGDByAddr",
                                     weight_decay=None):
    """SGD for tables of init(use_dynamic_expansion=True).

    weight_decay: None (plain SGD) or in [0.0, 1.0], mx_rec's range; each distinct
        address decays once per call: row -= lr * (summed gradient + weight_decay * row).

    Example:
        >>> opt = create_hash_optimizer_by_address(0.1)
        >>> train_op = opt.apply_gradients(list(zip(grads, addresses)))
    """
    if not isinstance(use_locking, bool):
        raise TypeError(f"gradient_descent_by_addr: use_locking must be a bool, got "
                        f"{use_locking!r}")
    # Either value is honoured: every update holds the store's lock.
    return SGDByAddr(learning_rate, name=name, weight_decay=weight_decay)


# mx_rec's spelling (its examples import this one). mx_rec documents weight_decay=0.0001 as
# its default; here the default stays None (plain SGD, this function's behaviour before
# weight_decay existed): pass weight_decay=0.0001 for mx_rec's update (docs/MX_REC_ZOO.md).
create_hash_optimizer_by_addr = create_hash_optimizer_by_address

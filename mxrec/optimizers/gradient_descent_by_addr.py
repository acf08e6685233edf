"""SGD by address for dynamic-expansion tables: row -= learning_rate * summed gradient."""

from mxrec.core import dynamic
from mxrec.optimizers.by_address import ByAddressOptimizer


class SGDByAddr(ByAddressOptimizer):
    """Plain SGD on the rows at the given addresses (see ByAddressOptimizer)."""

    def __init__(self, learning_rate, name="SGDByAddr"):
        super().__init__(learning_rate, name, "gradient_descent_by_addr")

    def _apply(self, table, grad, address, lr):
        return dynamic._ops().mxrec_dynamic_apply_sgd(
            address, grad, lr, table_key=table.table_key, dim=table.dim)


def create_hash_optimizer_by_address(learning_rate, use_locking=False, name="SGDByAddr"):
    """SGD for tables of init(use_dynamic_expansion=True).

    Example:
        >>> opt = create_hash_optimizer_by_address(0.1)
        >>> train_op = opt.apply_gradients(list(zip(grads, addresses)))
    """
    del use_locking  # every update holds the store's lock
    return SGDByAddr(learning_rate, name=name)


# mx_rec's other spelling (its Estimator example imports this one).
create_hash_optimizer_by_addr = create_hash_optimizer_by_address

"""Adagrad by address for dynamic-expansion tables.

For each address a with summed gradient g: accum[a] += g^2;
row[a] -= lr * g / sqrt(accum[a]) (TensorFlow's SparseApplyAdagrad). The
accumulator is the store slot `<name>/accumulator`, starting at
initial_accumulator_value for every row.
"""

from mxrec.core import dynamic
from mxrec.optimizers.by_address import ByAddressOptimizer


class AdagradByAddress(ByAddressOptimizer):
    """Adagrad on the rows at the given addresses (see ByAddressOptimizer)."""

    def __init__(self, learning_rate, initial_accumulator_value=0.9, name="AdagradByAddress"):
        super().__init__(learning_rate, name, "adagrad_by_addr")
        if initial_accumulator_value <= 0:
            raise ValueError("adagrad_by_addr.create_hash_optimizer_by_address: "
                             "initial_accumulator_value must be > 0, got "
                             f"{initial_accumulator_value}")
        self._initial_accumulator_value = float(initial_accumulator_value)

    def slot_initial_value(self, slot: str) -> float:
        return self._initial_accumulator_value if slot == "accumulator" else 0.0

    def get_slot_names(self):
        return ["accumulator"]

    def _apply(self, table, grad, address, lr):
        return dynamic._ops().mxrec_dynamic_apply_adagrad(
            address, grad, lr, table_key=table.table_key, dim=table.dim,
            accumulator_slot=self.store_slot("accumulator"),
            initial_accumulator_value=self._initial_accumulator_value)


def create_hash_optimizer_by_address(learning_rate=0.001, initial_accumulator_value=0.9,
                                     use_locking=False, name="AdagradByAddress"):
    """Adagrad for tables of init(use_dynamic_expansion=True).

    Example:
        >>> opt = create_hash_optimizer_by_address(0.1, initial_accumulator_value=0.5)
        >>> train_op = opt.apply_gradients(list(zip(grads, addresses)))
    """
    if not isinstance(use_locking, bool):
        raise TypeError(f"adagrad_by_addr: use_locking must be a bool, got {use_locking!r}")
    # Either value is honoured: every update holds the store's lock.
    return AdagradByAddress(learning_rate, initial_accumulator_value=initial_accumulator_value,
                            name=name)


# mx_rec's other spelling (its Estimator example imports this one).
create_hash_optimizer_by_addr = create_hash_optimizer_by_address

"""What the by-address optimizers share: checking (gradient, address) pairs and applying them.

In dynamic-expansion mode (init(use_dynamic_expansion=True)) a table has no
tf.Variable; a training lookup publishes the rows it read (`local_emb`
[U, dim]) and their int64 addresses [U] in the collections of
`mxrec.core.dynamic`. A by-address optimizer takes
`apply_gradients([(tf.gradients(loss, local_emb)[i], address_i), ...])` and
updates the table's store, and its slots there, at those addresses. The pairs
of one table in one call are applied as one update, the gradients of a
repeated address summed first, as the hash optimizers do.
"""

from typing import List, Tuple

import tensorflow as tf

from mxrec.core import dynamic
from mxrec.optimizers.base import check_declared, check_learning_rate

_CPU = "/device:CPU:0"


class ByAddressOptimizer(tf.compat.v1.train.Optimizer):
    """Base of SGDByAddr, AdagradByAddress and LazyAdamByAddress.

    A `tf.compat.v1.train.Optimizer`, as mx_rec's by-address optimizers are, so that
    scripts may pass it where TF expects one (RecSDK's loss-scale wrappers check
    `isinstance(opt, Optimizer)` and rescale `opt._learning_rate`); `compute_gradients` is
    TF's, `apply_gradients` takes (gradient, address) pairs (below).

    Subclasses implement `_apply(table, grad, address, lr)` and may override
    `_prepare()` (before the updates, e.g. to create step variables) and
    `_finish()` (after all updates of one apply_gradients call).
    """

    def __init__(self, learning_rate, name: str, factory: str):
        check_learning_rate(learning_rate, factory)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{factory}: name must be a non-empty string, got {name!r}")
        super().__init__(use_locking=False, name=name)
        self._learning_rate = learning_rate
        self._name = name

    def get_name(self) -> str:
        return self._name

    def get_slot_names(self) -> List[str]:
        """Slot names; in a table's store they are `<optimizer name>/<slot>`."""
        return []

    def slot_initial_value(self, slot: str) -> float:
        """The value every row of `slot` starts at."""
        del slot
        return 0.0

    def store_slot(self, slot: str) -> str:
        """The name of `slot` in a table's dynamic store (see dynamic.export_values)."""
        return f"{self._name}/{slot}"

    def _learning_rate_tensor(self) -> tf.Tensor:
        value = self._learning_rate() if callable(self._learning_rate) else self._learning_rate
        return tf.cast(value, tf.float32)

    def _check_pairs(self, grads_and_vars) -> List[Tuple[tf.Tensor, tf.Tensor, object]]:
        label = type(self).__name__
        # The seed's prose writes apply_gradients([grad, addr]): one pair, not a list of pairs.
        if (isinstance(grads_and_vars, (tuple, list)) and len(grads_and_vars) == 2
                and not any(isinstance(x, (tuple, list)) for x in grads_and_vars)):
            grads_and_vars = [grads_and_vars]
        pairs = []
        for pair in grads_and_vars:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"{label}.apply_gradients takes (gradient, address) pairs, got "
                                f"{pair!r}")
            grad, address = pair
            table = dynamic.table_of_address(address, label)
            check_declared(self, table)
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                grad = tf.convert_to_tensor(grad)
            grad = tf.convert_to_tensor(grad)
            if grad.dtype != tf.float32:
                raise TypeError(f"{label}: the gradient for table {table.table_name!r} must be "
                                f"float32, got {grad.dtype.name}")
            if grad.shape.rank is not None and grad.shape.rank != 2:
                raise ValueError(f"{label}: the gradient for table {table.table_name!r} must be "
                                 f"[addresses, dim], got shape {grad.shape}")
            rows, dim = (grad.shape.as_list() if grad.shape.rank == 2 else (None, None))
            if dim is not None and dim != table.dim:
                raise ValueError(f"{label}: the gradient for table {table.table_name!r} has "
                                 f"{dim} columns, the table's dim is {table.dim}")
            count = address.shape[0] if address.shape.rank == 1 else None
            if rows is not None and count is not None and rows != count:
                raise ValueError(
                    f"{label}: the gradient for table {table.table_name!r} has {rows} rows but "
                    f"its address tensor {address.name} has {count}; the first dimension of "
                    "each gradient must equal the length of its addresses")
            pairs.append((grad, address, table))
        if not pairs:
            raise ValueError(f"{label}.apply_gradients: no gradients provided")
        return pairs

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> tf.Operation:
        """Updates each pair's table at its addresses.

        Args:
            grads_and_vars: (gradient [U, dim], address [U]) pairs; the addresses are tensors
                of tf.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET) and the gradients those
                of the matching ASCEND_SPARSE_LOOKUP_LOCAL_EMB tensors. A None gradient is
                skipped.
            global_step: a variable to increment by one after the updates.
            name: name scope of the update ops.

        Returns:
            The update op.

        Raises:
            TypeError: an address tensor that no training lookup made.
            ValueError: shapes that do not match, or no gradient at all.

        Example:
            >>> grads = tf.gradients(loss, tf.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB))
            >>> addresses = tf.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
            >>> train_op = opt.apply_gradients(list(zip(grads, addresses)))
        """
        pairs = self._check_pairs(grads_and_vars)
        self._prepare()
        # All pairs of one table become one update, as a hash optimizer sums the
        # gradients of every lookup of a table into one: a row two lookups share
        # gets one Adagrad or LazyAdam step with the summed gradient.
        by_table = {}
        for grad, address, table in pairs:
            by_table.setdefault(id(table), (table, [], []))
            by_table[id(table)][1].append(grad)
            by_table[id(table)][2].append(address)
        with tf.name_scope(name or self._name):
            lr = self._learning_rate_tensor()
            updates = []
            for table, grads, addresses in by_table.values():
                if self not in table.optimizers:
                    table.optimizers.append(self)
                with tf.device(_CPU):
                    grad = grads[0] if len(grads) == 1 else tf.concat(grads, axis=0)
                    address = addresses[0] if len(addresses) == 1 else tf.concat(addresses, 0)
                    if table.pad_row is not None:
                        # init(use_dynamic=False): the padding (address -1) trains nothing.
                        keep = address >= 0
                        grad = tf.boolean_mask(grad, keep)
                        address = tf.boolean_mask(address, keep)
                    # After this step's lookups made their new rows: a gradient that does
                    # not depend on the rows' values (a loss linear in them) would not
                    # order the update after the assignment that would overwrite it.
                    with tf.control_dependencies(
                            table.refills(tf.compat.v1.get_default_graph())):
                        updates.append(self._apply(table, grad, address, lr))
            with tf.control_dependencies(updates):
                finish = list(self._finish())
                if global_step is not None:
                    with tf.control_dependencies(finish):
                        finish.append(tf.compat.v1.assign_add(global_step, 1))
            return tf.group(*updates, *finish)

    def _prepare(self):
        pass

    def _finish(self):
        return []

    def _apply(self, table, grad: tf.Tensor, address: tf.Tensor, lr: tf.Tensor) -> tf.Operation:
        raise NotImplementedError

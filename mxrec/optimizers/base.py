"""What every hash optimizer shares: checks on what it is asked to apply."""

import weakref

import tensorflow as tf

from mxrec.distributed import sharded_state
from mxrec.util import communication


class HashOptimizerMixin:
    """Put before a tf.compat.v1.train.Optimizer subclass in the bases.

    Subclasses name the initial value of each slot in `_slot_initial_values`, so
    that a row handed to a new ID after eviction starts with fresh slots.
    """

    def _slot_initial_values(self):
        return {}

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        table = handle._mxrec_table
        # Slot rows change owner with their rows: reset to their initial values, or (a
        # tiered table) swapped with the host tier, lookup by lookup in plan order. Built
        # once per graph and variable: a script that applies this optimizer once per loss
        # (mx_rec's demo) must not swap a step's slot rows twice.
        graph = tf.compat.v1.get_default_graph()
        if not hasattr(self, "_mxrec_slot_refills"):
            self._mxrec_slot_refills = weakref.WeakKeyDictionary()
        built = self._mxrec_slot_refills.setdefault(graph, {})
        if handle.name not in built:
            built[handle.name] = table.slot_refills(self, handle, graph)
        resets = built[handle.name]
        with tf.control_dependencies(resets):
            return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices,
                                                                    **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        for grad, var in grads_and_vars:
            dynamic_table = getattr(var, "_mxrec_dynamic_table", None)
            if dynamic_table is not None:
                raise TypeError(
                    f"{type(self).__name__} updates table variables; table "
                    f"{dynamic_table.table_name!r} uses init(use_dynamic_expansion=True), whose "
                    "addresses need create_hash_optimizer_by_address (gradient_descent_by_addr, "
                    "adagrad_by_addr, lazy_adam_by_addr)")
            table = getattr(var, "_mxrec_table", None)
            if table is None:
                raise TypeError(
                    f"{type(self).__name__} updates mxrec tables only; {var.name} is not one. "
                    "Train dense variables with a dense optimizer "
                    "(see get_dense_and_sparse_variable)")
            if grad is not None and not isinstance(grad, tf.IndexedSlices):
                raise TypeError(
                    f"{type(self).__name__}: the gradient of table {table.table_name!r} must be "
                    f"IndexedSlices from tf.gradients(loss, table variable), got "
                    f"{type(grad).__name__}")
            check_declared(self, table)
            if self not in table.optimizers:
                table.optimizers.append(self)
        update = super().apply_gradients(grads_and_vars, global_step=global_step, name=name)
        if communication.get_rank_size() > 1:
            _slots_to_local_variables(self, [var for _, var in grads_and_vars])
        return update


def _slots_to_local_variables(optimizer, table_variables) -> None:
    """On several ranks a table's slot rows, like its rows, are this rank's own layout: they
    leave GLOBAL_VARIABLES for LOCAL_VARIABLES (initialised with them, not saved by TF's
    Saver), and the table's ShardedTableSaveable saves them keyed by ID."""
    global_variables = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    for variable in table_variables:
        for slot_name in optimizer.get_slot_names():
            slot = optimizer.get_slot(variable, slot_name)
            if slot is not None and any(slot is v for v in global_variables):
                saveable = getattr(variable._mxrec_table, "sharded_saveable", None)  # noqa: SLF001
                if saveable is not None and saveable.built:
                    raise ValueError(
                        f"{type(optimizer).__name__} creates slot {slot_name!r} of table "
                        f"{variable._mxrec_table.table_name!r} after a TF Saver was built "  # noqa: SLF001
                        "over it: on several ranks the table saves its slots through its "
                        "ShardedTableSaveable, which the Saver has fixed; build the Saver "
                        "after the train op")
                global_variables[:] = [v for v in global_variables if v is not slot]
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES, slot)
                sharded_state.initialize_once(slot)


def check_declared(optimizer, table) -> None:
    """create_table(optimizer_list=[...]) names the optimizers that train the table."""
    declared = getattr(table, "declared_optimizers", None)
    if declared is not None and not any(optimizer is d for d in declared):
        raise ValueError(
            f"{type(optimizer).__name__} applies gradients to table {table.table_name!r}, whose "
            "create_table(optimizer_list=...) does not list it; add it to the list or leave "
            "optimizer_list out")


def check_learning_rate(learning_rate, optimizer: str):
    if not callable(learning_rate) and not isinstance(learning_rate, tf.Tensor):
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
            raise TypeError(f"{optimizer}: learning_rate must be a number, got {learning_rate!r}")
        if learning_rate <= 0:
            raise ValueError(f"{optimizer}: learning_rate must be > 0, got {learning_rate}")

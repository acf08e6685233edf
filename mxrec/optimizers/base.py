"""What every hash optimizer shares: checks on what it is asked to apply."""

import weakref
from collections import defaultdict

import tensorflow as tf

from mxrec.core import initial_values, storage_dtype, wing
from mxrec.core.graph_state import graph_state
from mxrec.optimizers import rounded


class HashOptimizerMixin:
    """Put before a tf.compat.v1.train.Optimizer subclass in the bases.

    Subclasses name the initial value of each slot in `_slot_initial_values`, so
    that a row handed to a new ID after eviction starts with fresh slots.
    """

    def _slot_initial_values(self):
        return {}

    # A table's slots start as a Fill of the slot's initial value (`_slot_initial_values`)
    # that no constant folding turns into a constant whose buffer the slot would share
    # (mxrec.core.initial_values: the first sparse update would copy the whole slot, and
    # the constant would stay resident beside it). Other slots as TF makes them.
    def _table_slot_initializer(self, var, slot_name):
        value = self._slot_initial_values().get(slot_name)
        if not hasattr(var, "_mxrec_table") or value is None:
            return None
        return initial_values.FilledInitializer(value)

    def _table_slot(self, var, slot_name, op_name, dtype):
        """A table's slot with its FilledInitializer, or None for TF's own way."""
        initializer = self._table_slot_initializer(var, slot_name)
        if initializer is None or not var.get_shape().is_fully_defined():
            return None
        return super()._get_or_make_slot_with_initializer(var, initializer, var.get_shape(),
                                                          dtype, slot_name, op_name)

    def _zeros_slot(self, var, slot_name, op_name):
        slot = self._table_slot(var, slot_name, op_name,
                                rounded.check_slot_dtype(var, var.dtype.base_dtype))
        return slot if slot is not None else super()._zeros_slot(var, slot_name, op_name)

    def _get_or_make_slot(self, var, val, slot_name, op_name):
        slot = self._table_slot(var, slot_name, op_name,
                                rounded.check_slot_dtype(var, val.dtype.base_dtype))
        return slot if slot is not None else super()._get_or_make_slot(var, val, slot_name,
                                                                        op_name)

    def _get_or_make_slot_with_initializer(self, var, initializer, shape, dtype, slot_name,
                                           op_name):
        initializer = self._table_slot_initializer(var, slot_name) or initializer
        dtype = rounded.check_slot_dtype(var, dtype)
        return super()._get_or_make_slot_with_initializer(var, initializer, shape, dtype,
                                                          slot_name, op_name)

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        with tf.control_dependencies(_slot_refills(self, handle)):
            if storage_dtype.is_reduced(handle._mxrec_table):
                return rounded.apply(self, grad, handle, indices, distinct_indices(indices))
            if distinct_indices(indices) and _next_sums_duplicates(type(self), HashOptimizerMixin):
                return self._resource_apply_sparse(grad, handle, indices, **kwargs)
            return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices,
                                                                    **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = _check_table_pairs(self, grads_and_vars)
        update = super().apply_gradients(grads_and_vars, global_step=global_step, name=name)
        wing.current().slots_created(self, [var for _, var in grads_and_vars])
        return update


def distinct_indices(indices: tf.Tensor) -> bool:
    """Whether a table gradient's `indices` are a lookup's unique rows (no row twice).

    TF's sparse optimizers sum the values of repeated indices first (Unique and
    UnsortedSegmentSum over the step's rows) before the update. A table's gradient
    from one unpadded training lookup has one index per row already: the key stage's
    unique rows, which the gather's gradient reshapes (TF's ResourceGather gradient).
    Summing a row's one value leaves it as it is, and Unique keeps first-occurrence
    order, so skipping the sum changes no bit of the update. Anything else (two lookups
    of a table, whose gradients are concatenated; padded rows; a user's own indices)
    is summed as TF does.
    """
    if not isinstance(indices, tf.Tensor) or tf.executing_eagerly():
        return False
    source = indices
    while source.op.type in ("Reshape", "Identity"):
        source = source.op.inputs[0]
    return source.name in graph_state(source.graph).distinct_rows


def _next_sums_duplicates(cls, after) -> bool:
    """Whether the `_resource_apply_sparse_duplicate_indices` that `cls` reaches past
    `after` in its MRO is TF's base one, which sums duplicates and then calls
    `_resource_apply_sparse` (GradientDescentOptimizer's scatter-adds instead)."""
    mro = cls.__mro__
    for klass in mro[mro.index(after) + 1:]:
        if "_resource_apply_sparse_duplicate_indices" in klass.__dict__:
            return klass is tf.compat.v1.train.Optimizer
    return False


def _slot_refills(optimizer, handle):
    """The ops that a hash optimizer runs before updating table variable `handle`."""
    table = handle._mxrec_table
    # Slot rows change owner with their rows: reset to their initial values, or (a
    # tiered table) swapped with the host tier, lookup by lookup in plan order. Built
    # once per graph and variable: a script that applies this optimizer once per loss
    # (mx_rec's demo) must not swap a step's slot rows twice.
    graph = tf.compat.v1.get_default_graph()
    if "_mxrec_slot_refills" not in optimizer.__dict__:
        optimizer._mxrec_slot_refills = weakref.WeakKeyDictionary()
    built = optimizer._mxrec_slot_refills.setdefault(graph, {})
    if handle.name not in built:
        # The rows' own refills too: a gradient that does not depend on the rows' values
        # (a loss linear in them) does not order the update after the refill, which would
        # then overwrite the update (or, a tiered table, send it to the old owner).
        built[handle.name] = table.refills(graph) + table.slot_refills(optimizer, handle,
                                                                       graph)
    return built[handle.name]


def _check_table_pairs(optimizer, grads_and_vars):
    """(gradient, table variable) pairs checked; the optimizer joins each table's list."""
    grads_and_vars = list(grads_and_vars)
    for grad, var in grads_and_vars:
        dynamic_table = getattr(var, "_mxrec_dynamic_table", None)
        if dynamic_table is not None:
            raise TypeError(
                f"{type(optimizer).__name__} updates table variables; table "
                f"{dynamic_table.table_name!r} uses init(use_dynamic_expansion=True), whose "
                "addresses need create_hash_optimizer_by_address (gradient_descent_by_addr, "
                "adagrad_by_addr, lazy_adam_by_addr)")
        table = getattr(var, "_mxrec_table", None)
        if table is None:
            raise TypeError(
                f"{type(optimizer).__name__} updates mxrec tables only; {var.name} is not one. "
                "Train dense variables with a dense optimizer "
                "(see get_dense_and_sparse_variable)")
        if grad is not None and not isinstance(grad, tf.IndexedSlices):
            raise TypeError(
                f"{type(optimizer).__name__}: the gradient of table {table.table_name!r} must "
                f"be IndexedSlices from tf.gradients(loss, table variable), got "
                f"{type(grad).__name__}")
        check_declared(optimizer, table)
        if optimizer not in table.optimizers:
            table.optimizers.append(optimizer)
    return grads_and_vars


class CustomizedOptimizer:
    """mx_rec's base of hash optimizers, for optimizers users write themselves.

    As in mx_rec, a user optimizer derives from a TF1 optimizer and this class, e.g.
    `class SGDWithWeightDecay(gradient_descent.GradientDescentOptimizer,
    CustomizedOptimizer)`, calls `self._get_name(name)` and passes `self.unique_name` to
    the TF optimizer's __init__, and writes its update for the table variable in
    `_apply_sparse_duplicate_indices(grad: IndexedSlices, var)` (the gradients of a row two
    positions share arrive separately), in `_apply_sparse` (summed per row first), or
    inherits the TF optimizer's. It trains tables as the built-in hash optimizers do:
    the pairs are checked to be (IndexedSlices, table variable); before the update the
    slot rows of rows that change owner (eviction, host tiers) are reset or swapped;
    slots are saved and restored with the table (a TF Saver, mxrec's Saver, several
    ranks).

    Slots: the TF optimizer's `_create_slots` makes them; `get_slot_init_values()`
    returns each slot's initial value in the order `_create_slots` makes them (mx_rec's
    order of initialize_slots), used for rows that change owner. An optimizer without
    slots returns [] (as RecSDK's DLRM example does).
    """

    name_counter = defaultdict(int)

    def __init__(self):
        self.unique_name = ""
        self.base_name = ""

    def initialize_slots(self, var, table_instance):
        """mx_rec's slot creation; in mxrec the TF optimizer's _create_slots makes the
        slots, so this is not called."""
        raise NotImplementedError(f"Please define a specific realization on "
                                  f"{self.__class__.__name__}")

    def insert_slot(self, slot, named_slots_key, slot_name):
        """mx_rec's slot registration; not called by mxrec (see initialize_slots)."""
        raise NotImplementedError(f"Please define a specific realization on "
                                  f"{self.__class__.__name__}")

    def get_slot_init_values(self):
        """Each slot's initial value, in the order the slots are made."""
        raise NotImplementedError(f"Please define a specific realization on "
                                  f"{self.__class__.__name__}")

    def _get_name(self, name="CustomizedOptimizer"):
        """mx_rec's naming: `unique_name` is `<name>_<n>`, n counting the optimizers
        made with that name in this process (0 first)."""
        if name in CustomizedOptimizer.name_counter:
            CustomizedOptimizer.name_counter[name] += 1
        count = CustomizedOptimizer.name_counter[name]
        self.unique_name = f"{name}_{count}"
        self.base_name = name

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The TF optimizer comes first in a user's bases, so its apply_gradients shadows
        # anything this class defines: the hash optimizer's pieces go onto the class.
        if not issubclass(cls, tf.compat.v1.train.Optimizer):
            return
        for name, make in (("apply_gradients", _customized_apply_gradients),
                           ("_resource_apply_sparse_duplicate_indices", _customized_update),
                           ("_slot_initial_values", _customized_slot_initial_values)):
            if not _defined_outside_tensorflow(cls, name):
                function = make(cls)
                function._mxrec_customized = True
                setattr(cls, name, function)


def _defined_outside_tensorflow(cls, name: str) -> bool:
    """Whether `name` comes from the user's classes (or was put there by this module)
    rather than from TensorFlow's."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if getattr(attr, "_mxrec_customized", False):
                return True
            return not klass.__module__.startswith(("tensorflow", "keras"))
    return False


def _customized_apply_gradients(cls):
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = _check_table_pairs(self, grads_and_vars)
        update = super(cls, self).apply_gradients(grads_and_vars, global_step=global_step,
                                                  name=name)
        wing.current().slots_created(self, [var for _, var in grads_and_vars])
        return update

    return apply_gradients


def _customized_update(cls):
    def update(self, grad, handle, indices, **kwargs):
        with tf.control_dependencies(_slot_refills(self, handle)):
            if storage_dtype.is_reduced(handle._mxrec_table):
                return rounded.apply(self, grad, handle, indices, distinct_indices(indices))
            slices = tf.IndexedSlices(grad, indices, tf.shape(handle, out_type=indices.dtype))
            if _defined_outside_tensorflow(type(self), "_apply_sparse_duplicate_indices"):
                return self._apply_sparse_duplicate_indices(slices, handle)
            if _defined_outside_tensorflow(type(self), "_apply_sparse"):
                unique, positions = tf.unique(indices)
                summed = tf.math.unsorted_segment_sum(grad, positions, tf.size(unique))
                return self._apply_sparse(tf.IndexedSlices(summed, unique, slices.dense_shape),
                                          handle)
            if distinct_indices(indices) and _next_sums_duplicates(type(self), cls):
                return self._resource_apply_sparse(grad, handle, indices, **kwargs)
            return super(cls, self)._resource_apply_sparse_duplicate_indices(
                grad, handle, indices, **kwargs)

    return update


def _customized_slot_initial_values(cls):
    del cls

    def slot_initial_values(self):
        names = list(self._slots)  # creation order (TF keeps them in a dict)
        if not names:
            return {}
        try:
            values = list(self.get_slot_init_values())
        except NotImplementedError as err:
            raise NotImplementedError(
                f"{type(self).__name__} has slots {names}: define get_slot_init_values() "
                "(each slot's initial value, in the order its _create_slots makes them), "
                "which rows handed to new IDs start from") from err
        if len(values) != len(names):
            raise ValueError(
                f"{type(self).__name__}.get_slot_init_values() gives {len(values)} values for "
                f"its {len(names)} slots {names} (one per slot, in the order its "
                "_create_slots makes them)")
        return {slot: float(value) for slot, value in zip(names, values)}

    return slot_initial_values


def check_declared(optimizer, table) -> None:
    """create_table(optimizer_list=[...]) names the optimizers that train the table."""
    declared = getattr(table, "declared_optimizers", None)
    if declared is not None and not any(optimizer is d for d in declared):
        raise ValueError(
            f"{type(optimizer).__name__} applies gradients to table {table.table_name!r}, whose "
            "create_table(optimizer_list=...) does not list it; add it to the list or leave "
            "optimizer_list out")


def check_arguments(optimizer: str, learning_rate, use_locking, name) -> None:
    """The arguments every hash-optimizer factory takes, checked (TF would take any truthy
    use_locking and any name silently).

    Raises:
        TypeError: learning_rate is not a number, tensor or callable; use_locking is not a
            bool; name is not a string.
        ValueError: learning_rate <= 0, or name is empty.
    """
    check_learning_rate(learning_rate, optimizer)
    if not isinstance(use_locking, bool):
        raise TypeError(f"{optimizer}: use_locking must be a bool, got {use_locking!r}")
    if not isinstance(name, str):
        raise TypeError(f"{optimizer}: name must be a string, got {name!r}")
    if not name:
        raise ValueError(f"{optimizer}: name must not be empty")


def check_learning_rate(learning_rate, optimizer: str):
    if not callable(learning_rate) and not isinstance(learning_rate, tf.Tensor):
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
            raise TypeError(f"{optimizer}: learning_rate must be a number, got {learning_rate!r}")
        if learning_rate <= 0:
            raise ValueError(f"{optimizer}: learning_rate must be > 0, got {learning_rate}")

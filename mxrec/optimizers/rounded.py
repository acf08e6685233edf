"""The update of a table whose rows or slots rest in fewer bits than float32.

TensorFlow's fused sparse kernels read and write the variable in its own dtype; a table
stored in bfloat16 or float16 (`create_table(storage_dtype=..., slot_dtype=...)`,
mxrec.core.storage_dtype) is updated here instead, in float32:

    rows  = float32(table[indices])            slots = float32(slot[indices])
    new_rows, new_slots = the optimizer's float32 rule (its `_float32_rows`)
    table[indices] = round(new_rows)           slot[indices] = round(new_slots)

The gradient arrives in float32 (the lookup's upcast keeps it so) and the gradients of a
row that appears twice are summed first, as TF's sparse optimizers do. The optimizer's rule
uses the float32 values it computed, also for a slot that is then stored rounded.

With `rounding="stochastic"` each update draws its rounding from a stateless seed (the
table's seed, the table's update count and the component), so a run repeats bit for bit;
the count is a variable of the table (`<table>/mxrec_rounding_updates`), saved with the
dense variables.
"""

import weakref

import tensorflow as tf

from mxrec.core import storage_dtype


def apply(optimizer, grad: tf.Tensor, handle, indices: tf.Tensor, distinct: bool):
    """The update op of table variable `handle` by `optimizer` for gradient rows `grad`
    [N, dim] float32 at `indices` [N] (distinct: no index twice, so no sum first).

    Raises:
        NotImplementedError: the optimizer has no float32 rule for reduced storage.
    """
    table = handle._mxrec_table  # noqa: SLF001
    rule = getattr(optimizer, "_float32_rows", None)
    if rule is None:
        raise NotImplementedError(
            f"{type(optimizer).__name__} cannot train table {table.table_name!r}, whose rows "
            f"rest in {table.storage_dtype.name} and slots in {table.slot_dtype.name}: the "
            "hash optimizers gradient_descent, adagrad, lazy_adam and momentum can; or use "
            "float32 storage")
    grad = tf.cast(grad, tf.float32)
    if not distinct:
        indices, positions = tf.unique(indices)
        grad = tf.math.unsorted_segment_sum(grad, positions, tf.size(indices))
    slots = {name: optimizer.get_slot(handle, name) for name in optimizer.get_slot_names()}
    slots = {name: slot for name, slot in slots.items() if slot is not None}
    # The rows read after this step's refills of rows handed to new IDs: a gradient need not
    # depend on the lookup's values (a loss linear in them), so nothing else orders them.
    with tf.control_dependencies(table.refills(handle.graph)):
        rows = storage_dtype.upcast(tf.gather(handle, indices))
        old = {name: storage_dtype.upcast(tf.gather(slot, indices))
               for name, slot in slots.items()}
    new_rows, new_slots = rule(grad, rows, old)
    return write(table, handle, slots, indices, new_rows, new_slots,
                 seeds(table, 1 + len(new_slots), _update_count(table)))


def write(table, variable, slots, indices: tf.Tensor, new_rows: tf.Tensor, new_slots,
          update_seeds) -> tf.Operation:
    """Writes an update's float32 results rounded to where they rest: `new_rows` [N, dim]
    into `variable` (the table's storage dtype), each `new_slots[name]` into `slots[name]`
    (its own dtype), at `indices` [N] (distinct). update_seeds: `seeds(...)` of this update.
    The Session path's hash optimizers and mxrec.keras' table optimizers both write here."""
    writes = [slots[name].scatter_update(tf.IndexedSlices(
        storage_dtype.store(value, table, update_seeds[1 + i], slots[name].dtype.base_dtype),
        indices)) for i, (name, value) in enumerate(sorted(new_slots.items()))]
    writes.append(variable.scatter_update(
        tf.IndexedSlices(storage_dtype.store(new_rows, table, update_seeds[0]), indices)))
    return tf.group(*writes)


def seeds(table, count: int, updates):
    """[count] stateless seeds ([2] int64 each) of one update, or Nones (rounding to
    nearest): (the table's seed * count + component, `updates`: the table's update count,
    an int64 scalar advanced once per update). Component 0 is the rows, 1.. the slots in
    name order."""
    if table.rounding != "stochastic":
        return [None] * count
    base = tf.constant(table.rounding_seed * count, tf.int64)
    return [tf.stack([base + c, updates]) for c in range(count)]


def _update_count(table):
    """The table's update count after this update (a graph's variable
    `<table>/mxrec_rounding_updates`, advanced once per update), or None (rounding to
    nearest)."""
    if table.rounding != "stochastic":
        return None
    graph = tf.compat.v1.get_default_graph()
    counters = table.__dict__.setdefault("_rounding_counters", weakref.WeakKeyDictionary())
    if graph not in counters:
        with tf.init_scope(), tf.compat.v1.variable_scope(table.table_name, reuse=False):
            counters[graph] = tf.compat.v1.get_variable(
                "mxrec_rounding_updates", shape=[], dtype=tf.int64,
                initializer=tf.compat.v1.zeros_initializer(), trainable=False,
                use_resource=True)
    return counters[graph].assign_add(1)


def check_slot_dtype(var, dtype):
    """The dtype a slot of `var` rests in: the table's slot_dtype for a table variable
    whose storage is reduced, `dtype` otherwise."""
    table = getattr(var, "_mxrec_table", None)
    if table is None or not storage_dtype.is_reduced(table):
        return dtype
    return table.slot_dtype

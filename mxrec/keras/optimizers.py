"""Keras optimizers that also train mxrec.keras tables.

Each is the Keras optimizer of its name for the dense variables (the model's Dense kernels
and the like: updated exactly as that Keras optimizer updates them), and mxrec's hash
optimizer of the same rule for the tables (`Embedding` weights), as the Session path's
`create_hash_optimizer` applies it:

- only the rows in the batch's gradient (IndexedSlices over the unique rows) change, with
  the same TensorFlow kernels as the Session path (`ResourceScatterAdd` for SGD,
  `ResourceSparseApplyAdagrad` for Adagrad after summing repeated rows);
- each table slot starts at its initial value for every row; the slots of rows the step's
  lookups handed to new IDs (rows freed by eviction) go back to that value before the update
  (the Session path's slot_refills);
- a table with a host tier swaps its slots with the tier instead, plan by plan as its lookups
  swapped the rows (component `<optimizer name>/<slot>`, as the Session path's swap_slots),
  so that an ID coming back from the tier brings its slots with it.

    SGD(learning_rate)      dense: Keras' SGD;   rows: row -= lr * g
    Adagrad(learning_rate, initial_accumulator_value, epsilon)
                            dense: Keras' Adagrad (acc += g^2; w -= lr g / sqrt(acc + eps));
                            rows: mxrec's adagrad (acc += g^2; row -= lr g / sqrt(acc)),
                            acc starting at initial_accumulator_value
    LazyAdam(learning_rate, beta_1, beta_2, epsilon)
                            dense: Keras' Adam; rows: mxrec's lazy_adam (the moments of
                            the touched rows only; its own beta powers, starting at beta
                            and multiplied by it after each update, as TF1 Adam's)

The learning rate must be a number (the tables read the optimizer's learning-rate variable,
so a callback that assigns it changes both); a LearningRateSchedule, momentum, gradient
clipping, weight decay, EMA and gradient accumulation are refused for now.
"""

from typing import Dict, List, Tuple

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import storage_dtype, tiers
from mxrec.distributed import communication
from mxrec.keras import _compat
from mxrec.keras.trackable import StoreSubset, TableSlots, from_store, refuse_on_ranks, to_store
from mxrec.optimizers import rounded

_KERAS3 = _compat.keras_major() >= 3
_SLOT_PREFIX = "mxrec."  # the table slots' names in Keras weights files
# Keras optimizer arguments the table update does not follow yet.
_REFUSED = ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "use_ema",
            "gradient_accumulation_steps", "loss_scale_factor")


def _check_arguments(name: str, learning_rate, kwargs) -> None:
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
        raise NotImplementedError(
            f"mxrec.keras.optimizers.{name}: learning_rate must be a number for now, got "
            f"{type(learning_rate).__name__} (a LearningRateSchedule is not available yet for "
            "tables; a callback that assigns optimizer.learning_rate works)")
    if learning_rate <= 0:
        raise ValueError(f"mxrec.keras.optimizers.{name}: learning_rate must be > 0, got "
                         f"{learning_rate}")
    for key in _REFUSED:
        if kwargs.get(key) not in (None, False):
            raise NotImplementedError(
                f"mxrec.keras.optimizers.{name}: {key}={kwargs[key]!r} is not available yet "
                "(the table update would not follow it); leave it out")


class _TableOptimizer:
    """Put before the Keras optimizer in the bases: splits (gradient, variable) pairs into
    dense ones (the Keras optimizer's) and table ones (`_apply_table`)."""

    _table_slot_values: Dict[str, float] = {}

    def _init_tables(self):
        self._table_slots: Dict[str, Dict[str, tf.Variable]] = {}
        self.mxrec_tables = TableSlots()  # what checkpoints track
        # Table slots read from a weights file before the optimizer made them
        # (load_own_variables): {table name: {slot: array}}, used when they are made.
        self._loaded_table_slots: Dict[str, Dict[str, object]] = {}

    # Keras' weights files (`model.save_weights("x.weights.h5")` saves a compiled model's
    # optimizer too): Keras' own variables under "0", "1", ..., the table slots and table
    # beta powers under "mxrec.<table>__<slot>" and "mxrec.<name>".
    def _refuse_on_ranks(self, what: str, keys) -> None:
        """On several ranks, refuses a weights file holding table slots (its own or, loading,
        the file's): Keras may visit the optimizer before the tables' layers refuse."""
        tables = sorted(set(self._table_slots) | {
            key[len(_SLOT_PREFIX):].rpartition("__")[0] for key in keys
            if key.startswith(_SLOT_PREFIX) and "__" in key})
        if tables:
            refuse_on_ranks(tables[0], what)

    def save_own_variables(self, store):
        self._refuse_on_ranks("model.save_weights", ())
        super().save_own_variables(store)
        for table_name, slots in sorted(self._table_slots.items()):
            for slot_name, slot in sorted(slots.items()):
                store[f"{_SLOT_PREFIX}{table_name}__{slot_name}"] = to_store(slot)
        for name, power in zip(("beta1_power", "beta2_power"),
                               getattr(self, "_table_beta_powers", ())):
            store[f"{_SLOT_PREFIX}{name}"] = power.numpy()

    def load_own_variables(self, store):
        keys = list(store.keys())
        self._refuse_on_ranks("model.load_weights", keys)  # before any state changes
        super().load_own_variables(StoreSubset(store, [k for k in keys
                                                       if not k.startswith(_SLOT_PREFIX)]))
        powers = dict(zip(("beta1_power", "beta2_power"),
                          getattr(self, "_table_beta_powers", ())))
        for key in keys:
            if not key.startswith(_SLOT_PREFIX):
                continue
            name = key[len(_SLOT_PREFIX):]
            value = from_store(store[key])
            if name in powers:
                powers[name].assign(value)
                continue
            table_name, _, slot_name = name.rpartition("__")
            slots = self._table_slots.get(table_name)
            if slots is not None and slot_name in slots:
                slots[slot_name].assign(value)
            else:  # made at the table's first update (or checkpoint), from this value
                self._loaded_table_slots.setdefault(table_name, {})[slot_name] = value

    def _split(self, grads_and_vars) -> Tuple[List, List]:
        dense, tables = [], []
        for grad, var in grads_and_vars:
            table = _compat.table_of(var)
            if table is None:
                dense.append((grad, var))
            elif grad is not None:
                if not isinstance(grad, tf.IndexedSlices):
                    raise TypeError(
                        f"mxrec.keras.optimizers.{type(self).__name__}: the gradient of table "
                        f"{table.table_name!r} must be IndexedSlices (the gradient of its "
                        f"lookups), got {type(grad).__name__}")
                tables.append((grad, table))
        return dense, tables

    def _apply_tables(self, tables) -> None:
        where = f"mxrec.keras.optimizers.{type(self).__name__}"
        for grad, table in tables:
            variable = table.variable
            # The components registered before _slots_of registers this optimizer's.
            known = set(loader.engine().tier_components(table.table_key)) if table.tiered else ()
            slots = self._slots_of(table)
            if table.tiered:
                resets = self._swap_slots(table, slots, table.lookups_for_update(where), known)
            else:
                reused = table.reused_for_update(where)
                resets = []
                for slot_name, slot in slots.items():
                    fresh = tf.fill(tf.stack([tf.size(reused), table.dim]),
                                    tf.constant(self._table_slot_values[slot_name], slot.dtype))
                    resets.append(slot.scatter_update(tf.IndexedSlices(fresh, reused)))
            reduced = storage_dtype.is_reduced(table)
            lr = tf.cast(tf.convert_to_tensor(self._table_learning_rate()),
                         tf.float32 if reduced else variable.dtype)
            with tf.control_dependencies(resets):
                if reduced:
                    self._apply_rounded(grad.values, grad.indices, table, slots, lr)
                else:
                    self._apply_table(grad.values, grad.indices, variable, slots, lr)
        if tables:
            self._finish_tables()

    def _swap_slots(self, table, slots, lookups, known) -> list:
        """A tiered table's slots swapped with the host tier, each lookup's plan in order
        after the embedding's swaps of the step (tiers.swap_slots). known: the components
        registered before this apply; one registered only now (eagerly, at the first update
        after the step's lookups) was marked done for the plans already queued, so it skips
        them: its rows start at the initial value anyway."""
        embedding_swaps = [swap for _, swap in lookups if swap is not None]
        ops = []
        for slot_name, slot in sorted(slots.items()):
            component = self._tier_component(slot_name)
            if tf.executing_eagerly() and component not in known:
                continue
            fresh = tf.constant(self._table_slot_values[slot_name], tf.float32)
            previous = []
            for reused, _ in lookups:
                previous = [tiers.apply_swap(table.table_key, slot, reused, component, fresh,
                                             after=previous + embedding_swaps)]
                ops += previous
        return [op for op in ops if op is not None]

    def _apply_rounded(self, grad, indices, table, slots, lr) -> None:
        """A table whose rows or slots rest in half precision (Embedding(storage_dtype=...,
        slot_dtype=...)): the rule `_table_rule` in float32 on the upcast rows and slots of
        the summed gradient's rows, the results rounded as they are stored by the Session
        path's own code (mxrec.optimizers.rounded.write: to nearest even, or stochastically
        with the seeds of that path's hash optimizer of the same slots)."""
        grad, indices = _deduplicate(tf.cast(grad, tf.float32), indices)
        rows = tf.cast(tf.gather(table.variable, indices), tf.float32)  # exact
        old = {name: tf.cast(tf.gather(slot, indices), tf.float32)
               for name, slot in slots.items()}
        new_rows, new_slots = self._table_rule(grad, rows, old, lr)
        updates = None
        if table.rounding_updates is not None:
            updates = table.rounding_updates.assign_add(1)
        rounded.write(table, table.variable, slots, indices, new_rows, new_slots,
                      rounded.seeds(table, 1 + len(new_slots), updates))

    def _table_rule(self, grad, rows, slots, lr):
        """(new rows, {slot: new values}) in float32 from the gradient's rows [U, dim]
        (distinct rows, float32), their float32 rows and slots: the arithmetic of the
        Session path's hash optimizer's `_float32_rows`."""
        raise NotImplementedError

    def _tier_component(self, slot_name: str) -> str:
        """The host tier's name of a slot: `<optimizer name>/<slot>`, as the Session path's
        hash optimizers name theirs (and checkpoints the slot's state)."""
        return f"{self.name}/{slot_name}"

    def _finish_tables(self) -> None:
        """After every table of one apply (LazyAdam's beta powers)."""

    def _table_learning_rate(self):
        rate = self.learning_rate
        return rate.value if _KERAS3 and hasattr(rate, "value") else rate

    def _slots_of(self, table) -> Dict[str, tf.Variable]:
        """The table's slot variables, made at the first call (a tiered table's slots are
        registered with its host tier then, under `<optimizer name>/<slot>`)."""
        key = table.table_name
        if key not in self._table_slots:
            slots = {}
            with tf.init_scope():
                loaded = self._loaded_table_slots.pop(key, {})
                # the Session path's slots: slot_dtype where the table is reduced
                dtype = table.slot_dtype if storage_dtype.is_reduced(table) else table.value_dtype
                for slot_name, value in self._table_slot_values.items():
                    initial = tf.fill(table.variable.shape, tf.constant(value, dtype))
                    if slot_name in loaded:
                        initial = tf.constant(loaded[slot_name], dtype)
                        if initial.shape != table.variable.shape:
                            raise ValueError(
                                f"mxrec.keras.optimizers.{type(self).__name__}: slot "
                                f"{slot_name!r} of table {key!r} has shape "
                                f"{initial.shape.as_list()} in the weights file, but the table "
                                f"has {table.variable.shape.as_list()}")
                    slots[slot_name] = tf.Variable(
                        initial, trainable=False, name=f"{table.table_name}/{slot_name}")
                    setattr(self.mxrec_tables, f"{key}__{slot_name}", slots[slot_name])
                    if table.tiered:
                        loader.engine().tier_register(table.table_key,
                                                      self._tier_component(slot_name))
            self._table_slots[key] = slots
        return self._table_slots[key]

    def table_slot(self, layer, slot_name: str) -> tf.Variable:
        """The slot `slot_name` of an Embedding layer's table ([rows, dim])."""
        return self._table_slots[layer.table.table_name][slot_name]

    def _apply_table(self, grad, indices, variable, slots, lr):
        raise NotImplementedError

    # Keras 2 and Keras 3 enter through different methods.
    def build(self, var_list):
        super().build([v for v in var_list if _compat.table_of(v) is None])

    if _KERAS3:
        def apply(self, grads, trainable_variables=None):
            if trainable_variables is None:
                raise ValueError(f"mxrec.keras.optimizers.{type(self).__name__}.apply needs "
                                 "trainable_variables")
            dense, tables = self._split(zip(grads, trainable_variables))
            dense = _averaged_over_ranks(dense)
            if dense:
                super().apply([g for g, _ in dense], [v for _, v in dense])
            else:
                self.iterations.assign_add(1)
            self._apply_tables(tables)
    else:
        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            dense, tables = self._split(list(grads_and_vars))
            dense = _averaged_over_ranks(dense)
            if dense:
                result = super().apply_gradients(dense, *args, **kwargs)
            else:
                result = self.iterations.assign_add(1)
            self._apply_tables(tables)
            return result


def _averaged_over_ranks(dense):
    """On several ranks, the dense gradients' mean over the ranks, in one all-reduce for all
    of them (each rank's loss is the mean over its slice of the global batch, so the mean of
    the ranks' gradients is the gradient of the global batch's mean); as given on one rank."""
    size = communication.get_rank_size()
    present = [(grad, var) for grad, var in dense if grad is not None]
    if size == 1 or not present:
        return dense
    flat = [tf.reshape(tf.convert_to_tensor(grad), [-1]) for grad, _ in present]
    dtypes = {f.dtype for f in flat}
    if len(dtypes) > 1:
        raise TypeError("mxrec.keras.optimizers: on several ranks the dense gradients are "
                        "averaged in one all-reduce and must share one dtype, got "
                        f"{sorted(d.name for d in dtypes)}")
    total = communication.allreduce(tf.concat(flat, axis=0), "sum") / float(size)
    pieces = tf.split(total, [int(np.prod(tuple(var.shape))) for _, var in present])
    averaged = iter(tf.reshape(piece, var.shape) for piece, (_, var) in zip(pieces, present))
    return [(next(averaged) if grad is not None else None, var) for grad, var in dense]


def _deduplicate(grad, indices):
    """Repeated rows' gradients summed (TF1 optimizers' _deduplicate_indexed_slices)."""
    unique, positions = tf.unique(indices)
    summed = tf.math.unsorted_segment_sum(grad, positions, tf.shape(unique)[0])
    return summed, unique


class SGD(_TableOptimizer, tf.keras.optimizers.SGD):
    """Keras' SGD for dense variables; rows of tables: row -= learning_rate * gradient
    (mxrec's gradient_descent hash optimizer). momentum and nesterov are not available."""

    _table_slot_values = {}

    def __init__(self, learning_rate=0.01, name="SGD", **kwargs):
        _check_arguments("SGD", learning_rate, kwargs)
        for key in ("momentum", "nesterov"):
            if kwargs.get(key):
                raise NotImplementedError(f"mxrec.keras.optimizers.SGD: {key} is not available "
                                          "yet for tables; leave it out")
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self._init_tables()

    def _apply_table(self, grad, indices, variable, slots, lr):
        # GradientDescentOptimizer._resource_apply_sparse_duplicate_indices
        tf.raw_ops.ResourceScatterAdd(resource=variable.handle, indices=indices,
                                      updates=-grad * lr)

    def _table_rule(self, grad, rows, slots, lr):
        del slots  # CustomizedGradientDescent._float32_rows
        return rows - lr * grad, {}


class Adagrad(_TableOptimizer, tf.keras.optimizers.Adagrad):
    """Keras' Adagrad for dense variables; rows of tables: mxrec's adagrad hash optimizer
    (TF1 Adagrad: accumulator += g^2; row -= lr * g / sqrt(accumulator)), the accumulator
    starting at initial_accumulator_value. epsilon is Keras' (dense variables only)."""

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
                 name="Adagrad", **kwargs):
        _check_arguments("Adagrad", learning_rate, kwargs)
        if initial_accumulator_value <= 0:
            raise ValueError("mxrec.keras.optimizers.Adagrad: initial_accumulator_value must "
                             f"be > 0, got {initial_accumulator_value}")
        super().__init__(learning_rate=learning_rate,
                         initial_accumulator_value=initial_accumulator_value, epsilon=epsilon,
                         name=name, **kwargs)
        self._table_slot_values = {"accumulator": float(initial_accumulator_value)}
        self._init_tables()

    def _apply_table(self, grad, indices, variable, slots, lr):
        # AdagradOptimizer._resource_apply_sparse, after _deduplicate_indexed_slices
        summed, unique = _deduplicate(grad, indices)
        tf.raw_ops.ResourceSparseApplyAdagrad(
            var=variable.handle, accum=slots["accumulator"].handle, lr=lr, grad=summed,
            indices=unique, use_locking=False, update_slots=True)

    def _table_rule(self, grad, rows, slots, lr):
        # CustomizedAdagrad._float32_rows (DivNoNan: Grappler would turn x / sqrt(y) into
        # x * rsqrt(y), which rounds differently)
        accumulator = slots["accumulator"] + grad * grad
        return rows - tf.math.divide_no_nan(lr * grad, tf.sqrt(accumulator)), {
            "accumulator": accumulator}


class LazyAdam(_TableOptimizer, tf.keras.optimizers.Adam):
    """Keras' Adam for dense variables; rows of tables: mxrec's lazy_adam hash optimizer
    (m and v of the touched rows only; step size lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
    from beta powers of its own, multiplied after each update as TF1's Adam does). amsgrad
    is not available."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 name="LazyAdam", **kwargs):
        _check_arguments("LazyAdam", learning_rate, kwargs)
        if kwargs.get("amsgrad"):
            raise NotImplementedError("mxrec.keras.optimizers.LazyAdam: amsgrad is not "
                                      "available; leave it out")
        for label, beta in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"mxrec.keras.optimizers.LazyAdam: {label} must be in [0, 1), "
                                 f"got {beta}")
        if epsilon <= 0:
            raise ValueError(f"mxrec.keras.optimizers.LazyAdam: epsilon must be > 0, got "
                             f"{epsilon}")
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, name=name, **kwargs)
        self._table_slot_values = {"m": 0.0, "v": 0.0}
        self._table_betas = (float(beta_1), float(beta_2), float(epsilon))
        self._init_tables()
        with tf.init_scope():
            self._table_beta_powers = (
                tf.Variable(float(beta_1), trainable=False, name="table_beta1_power"),
                tf.Variable(float(beta_2), trainable=False, name="table_beta2_power"))
        self.mxrec_tables.beta1_power, self.mxrec_tables.beta2_power = self._table_beta_powers

    def _apply_table(self, grad, indices, variable, slots, lr):
        # CustomizedLazyAdam._resource_apply_sparse, after _deduplicate_indexed_slices
        grad, indices = _deduplicate(grad, indices)
        dtype = variable.dtype
        beta1, beta2, epsilon = (tf.constant(x, dtype) for x in self._table_betas)
        beta1_power, beta2_power = (tf.cast(p, dtype) for p in self._table_beta_powers)
        step_size = lr * tf.sqrt(1.0 - beta2_power) / (1.0 - beta1_power)
        m, v = slots["m"], slots["v"]
        m_rows = beta1 * tf.gather(m, indices) + (1.0 - beta1) * grad
        v_rows = beta2 * tf.gather(v, indices) + (1.0 - beta2) * tf.square(grad)
        update = step_size * m_rows / (tf.sqrt(v_rows) + epsilon)
        m.scatter_update(tf.IndexedSlices(m_rows, indices))
        v.scatter_update(tf.IndexedSlices(v_rows, indices))
        variable.scatter_sub(tf.IndexedSlices(update, indices))

    def _table_rule(self, grad, rows, slots, lr):
        # CustomizedLazyAdam._float32_rows
        beta1, beta2, epsilon = (tf.constant(x, tf.float32) for x in self._table_betas)
        beta1_power, beta2_power = (tf.cast(p, tf.float32) for p in self._table_beta_powers)
        step_size = lr * tf.sqrt(1.0 - beta2_power) / (1.0 - beta1_power)
        m_rows = beta1 * slots["m"] + (1.0 - beta1) * grad
        v_rows = beta2 * slots["v"] + (1.0 - beta2) * tf.square(grad)
        return rows - step_size * m_rows / (tf.sqrt(v_rows) + epsilon), {"m": m_rows,
                                                                         "v": v_rows}

    def _finish_tables(self) -> None:
        # TF1 Adam's _finish: the beta powers advance once per update
        for power, beta in zip(self._table_beta_powers, self._table_betas[:2]):
            power.assign(power * beta)

"""A sharded table in TF's Saver: every rank saves the whole table, in the one-process layout.

On several ranks each rank holds only the IDs it owns, in rows of its own choosing, so its
variable means nothing to another rank count. TF's Saver therefore does not see the table's
variable and optimizer slots there (they are LOCAL_VARIABLES); the table saves through one
ShardedTableSaveable instead, whose save gathers every rank's IDs and rows (per table and
save two all-to-alls, of integers and floats, and three small all-reduces, all under the
collectives' timeout) and writes the whole table as one process would
hold it:

    <table>                       [max(R, n), dim]  row i = the i-th admitted ID by value,
                                                    then initializer rows (R: the
                                                    variable's rows on a rank)
    <slot variable name>          [max(R, n), dim]  each optimizer slot, same rows
                                                    (then its initial value)
    <table>/mxrec_host/keys ...   every tracked ID by value, its row in that layout (-1
                                  while not admitted), count and last batch time; no free
                                  rows; meta = [n, newest batch time, counting frozen]

These are the names and meanings of a one-process checkpoint (HostStateSaveable and the
variables), so the checkpoint of N ranks restores on one process as its own, and a one-
process checkpoint restores on N ranks. The content does not depend on N: a restore on M
ranks keeps the IDs that rank owns under M (`routing.owner_of`) and gives them rows
0, 1, ... in ID order.

Every rank must run the save (the gather is collective) at the same step, and write to a
path of its own (`communication.rank_directory`): several processes writing one path would
corrupt it. Restore reads one checkpoint, whichever rank wrote it (they are equal).
"""

from typing import List, Tuple

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object
from tensorflow.python.util import object_identity

from mxrec._lib import loader
from mxrec.core import host_state
from mxrec.core.host_state import _keys_with_sparse_folder
from mxrec.distributed import communication, routing

_HOST = ("keys", "rows", "counts", "last_seen", "free_rows", "meta", "threshold")


def _gather_all(values: tf.Tensor, sizes: tf.Tensor, chunk: tf.Tensor) -> tf.Tensor:
    """Every rank's `values` [n_rank, width], in rank order: [sum(sizes), width]."""
    size = communication.get_rank_size()
    padded = tf.pad(values, [[0, chunk - tf.shape(values)[0]], [0, 0]])
    received = communication.alltoall(tf.tile(padded[None], [size, 1, 1]))
    return tf.boolean_mask(received, tf.sequence_mask(sizes, chunk))


class ShardedTableSaveable(saveable_object.SaveableObject):
    """Saves and restores a device-only table on several ranks (see the module docstring).

    Its specs are built when a Saver first asks for them (after the optimizers made their
    slots): build the Saver after the train op, as TF's own slots need anyway.
    """

    def __init__(self, table):
        self._table = table
        self._built = None
        super().__init__(table.variable, None, f"{table.table_name}/mxrec_host")

    @property
    def specs(self) -> List[saveable_object.SaveSpec]:
        if self._built is None:
            self._built = self._build_specs()
        return self._built

    @specs.setter
    def specs(self, value):
        del value  # built on first use

    # What TF's variables_initializer and report_uninitialized_variables read from an entry
    # of GLOBAL_VARIABLES (register): an initializer, a dtype and an initialised flag.
    @property
    def initializer(self) -> tf.Operation:
        """Initialises the rank's table variable and slots (each only while uninitialised,
        so a restored table is left alone)."""
        with tf.name_scope(f"{self._table.table_name}/mxrec_initialize"):
            return tf.group(*[variable.initializer for variable, _ in self._states()])

    @property
    def dtype(self) -> tf.DType:
        return self._table.variable.dtype

    def ref(self):
        """A hashable reference, as Variable.ref() (custom_gradient sets of variables)."""
        return object_identity.Reference(self)

    def is_initialized(self, name=None) -> tf.Tensor:
        flags = [variable.is_initialized() for variable, _ in self._states()]
        return tf.reduce_all(tf.stack(flags), name=name)

    @property
    def built(self) -> bool:
        """Whether a Saver has built the specs (the slots they hold are then fixed)."""
        return self._built is not None

    def _states(self) -> List[Tuple[tf.Variable, float]]:
        """(variable, value of a row never used) of the embedding and each slot."""
        table = self._table
        states = [(table.variable, None)]
        for optimizer in table.optimizers:
            initial = optimizer._slot_initial_values()  # noqa: SLF001
            for slot_name in optimizer.get_slot_names():
                slot = optimizer.get_slot(table.variable, slot_name)
                if slot is not None:
                    states.append((slot, float(initial.get(slot_name, 0.0))))
        return states

    def _fresh_rows(self, count: tf.Tensor, initial) -> tf.Tensor:
        table = self._table
        if initial is not None:
            return tf.fill(tf.stack([count, table.dim]), tf.constant(initial, table.value_dtype))
        rows = table.initial_rows(count)
        if rows is None:  # an initializer that needs a static shape: unused rows are zeros
            rows = tf.zeros(tf.stack([count, table.dim]), table.value_dtype)
        return rows

    def _build_specs(self) -> List[saveable_object.SaveSpec]:
        table, rank = self._table, communication.get_rank_id()
        size = communication.get_rank_size()
        states = self._states()
        capacity = int(table.variable.shape[0])
        with tf.device("/device:CPU:0"), tf.name_scope(f"{table.table_name}_gather_shards"):
            exported = loader.op_library().mxrec_export_table(
                table_key=table.table_key, name="export_host_state")
            keys, rows, counts, last_seen, _, meta, threshold = exported[:7]
            admitted = rows >= 0
            local = tf.size(keys)
            # Every rank's ID count (one-hot sum) and the largest: the all-to-all's chunk.
            sizes = communication.allreduce(tf.one_hot(rank, size, dtype=tf.int32) * local)
            with tf.control_dependencies([self._size_check(sizes, len(states))]):
                chunk = tf.maximum(tf.reduce_max(sizes), 1)
            ints = tf.stack([keys, last_seen, tf.cast(admitted, tf.int64)], axis=1)
            picked = tf.maximum(rows, 0)
            floats = tf.concat([counts[:, None]] + [
                tf.cast(tf.gather(variable, picked), tf.float32) for variable, _ in states],
                axis=1)
            all_ints = _gather_all(ints, sizes, chunk)
            all_floats = _gather_all(floats, sizes, chunk)
            # meta[1:] = newest batch time, counting frozen: the largest over the ranks.
            newest_frozen = communication.allreduce(meta[1:], "max")
            order = tf.argsort(all_ints[:, 0], stable=True)
            all_ints = tf.gather(all_ints, order)
            all_floats = tf.gather(all_floats, order)
            is_admitted = all_ints[:, 2] > 0
            new_rows = tf.where(is_admitted,
                                tf.cumsum(tf.cast(is_admitted, tf.int32)) - 1, -1)
            admitted_count = tf.reduce_sum(tf.cast(is_admitted, tf.int32))
            unused = tf.maximum(capacity - admitted_count, 0)
            layouts = []
            for index, (variable, initial) in enumerate(states):
                values = tf.boolean_mask(
                    all_floats[:, 1 + index * table.dim:1 + (index + 1) * table.dim],
                    is_admitted)
                layouts.append(tf.concat([tf.cast(values, variable.dtype.base_dtype),
                                          self._fresh_rows(unused, initial)], axis=0))
            host = [all_ints[:, 0], new_rows, all_floats[:, 0], all_ints[:, 1],
                    tf.zeros([0], tf.int32),
                    tf.concat([tf.cast(admitted_count, tf.int64)[None], newest_frozen], 0),
                    threshold]
        specs = [saveable_object.SaveSpec(layout, "", variable.op.name)
                 for layout, (variable, _) in zip(layouts, states)]
        keys_all = host[0]
        for field, tensor in zip(_HOST, host):
            name = f"{table.table_name}/mxrec_host/{field}"
            if field == "keys" and rank == 0:
                # mx_rec's sparse folder beside the checkpoint, from rank 0 only (one writer).
                specs.append(saveable_object.SaveSpec(
                    lambda: _keys_with_sparse_folder(keys_all, table.table_name), "", name,
                    dtype=tf.int64, device="/device:CPU:0"))
            else:
                specs.append(saveable_object.SaveSpec(tensor, "", name))
        return specs

    def _size_check(self, sizes: tf.Tensor, states: int) -> tf.Operation:
        """Refuses, before the gathers, a save whose whole table (every rank's IDs: three
        int64 and a count each, and a row of each state) would exceed MXREC_TF_SAVER_MAX_MB
        on each rank (it is held there several times over while it is sorted and laid out).
        """
        table = self._table
        limit_mb = host_state.tf_saver_limit_mb()
        per_id = 3 * 8 + 4 + states * table.dim * 4
        estimate = tf.reduce_sum(tf.cast(sizes, tf.int64)) * per_id
        limit = int(min(limit_mb * 2**20, 2**62))
        message = host_state.over_limit_message(
            table.table_name, "every rank's IDs, rows and slots on each rank", None, limit_mb)
        # The estimate is known only when the save runs: the Assert prints it after.
        return tf.debugging.Assert(estimate <= limit, [message, "bytes (estimate):", estimate],
                                   summarize=1)

    def restore(self, restored_tensors, restored_shapes):
        """Keeps the IDs this rank owns under the current rank count, rows 0, 1, ... in ID
        order; fails, naming the table and device_vocabulary_size, if they do not fit."""
        del restored_shapes
        table = self._table
        rank, size = communication.get_rank_id(), communication.get_rank_size()
        states = self._states()
        layouts = restored_tensors[:len(states)]
        keys, rows, counts, last_seen, _, meta, threshold = [
            tf.reshape(t, [-1]) if field != "threshold" else tf.reshape(t, [])
            for field, t in zip(_HOST, restored_tensors[len(states):])]
        layouts = [tf.reshape(layout, [-1, tf.shape(layout)[-1]]) for layout in layouts]
        capacity = int(table.variable.shape[0])
        with tf.device("/device:CPU:0"):
            checks = [tf.debugging.Assert(
                tf.equal(tf.shape(layout)[1], table.dim),
                [f"restoring table {table.table_name!r} (dim {table.dim}): the checkpoint's "
                 f"{variable.op.name!r} has rows of another dim:", tf.shape(layout)])
                for layout, (variable, _) in zip(layouts, states)]
            mine = tf.equal(routing.owner_of(tf.cast(keys, tf.int64), size), rank)
            keys, rows = tf.boolean_mask(keys, mine), tf.boolean_mask(rows, mine)
            counts = tf.boolean_mask(counts, mine)
            last_seen = tf.boolean_mask(last_seen, mine)
            admitted = rows >= 0
            count = tf.reduce_sum(tf.cast(admitted, tf.int32))
            checks.append(tf.debugging.Assert(
                count <= table.device_vocabulary_size,
                [f"restoring table {table.table_name!r} on {size} ranks: rank {rank} owns "
                 "more admitted IDs than its device_vocabulary_size="
                 f"{table.device_vocabulary_size} rows (raise device_vocabulary_size, or "
                 "restore on more ranks); IDs it owns:", count]))
            with tf.control_dependencies(checks):
                new_rows = tf.where(admitted, tf.cumsum(tf.cast(admitted, tf.int32)) - 1, -1)
                old_rows = tf.boolean_mask(rows, admitted)
                unused = tf.maximum(capacity - count, 0)
            assigns = []
            for layout, (variable, initial) in zip(layouts, states):
                value = tf.concat([tf.gather(layout, old_rows),
                                   self._fresh_rows(unused, initial)], axis=0)
                assigns.append(variable.assign(tf.cast(value, variable.dtype.base_dtype),
                                               read_value=False))
            imported = loader.op_library().mxrec_import_table(
                tf.cast(keys, tf.int64), tf.cast(new_rows, tf.int32),
                tf.cast(counts, tf.float32), tf.cast(last_seen, tf.int64),
                tf.zeros([0], tf.int32),
                tf.concat([tf.cast(count, tf.int64)[None], tf.cast(meta[1:], tf.int64)], 0),
                tf.cast(threshold, tf.float64), table_key=table.table_key)
            return tf.group(imported, *assigns)


def initialize_once(variable: tf.Variable) -> None:
    """Makes `variable.initializer` initialise it only while it is uninitialised.

    A table's variable and slots on several ranks are LOCAL_VARIABLES, and a
    MonitoredSession (Estimator) runs the local initializer after restoring a checkpoint:
    an unconditional initializer would erase the rows the restore has just written. TF has
    no public way to give a variable another initializer, hence the attribute.

    Built outside the caller's control dependencies (a hash optimizer makes its slots in
    apply_gradients, which a script may call under `tf.control_dependencies` of the step's
    gradients): an initializer that waited for them would compute a step's gradients while
    the other variables are still being initialised.
    """
    with tf.control_dependencies(None), tf.name_scope(f"{variable.op.name}/initialize_once"):
        def initialize():
            with tf.control_dependencies([variable.assign(variable.initial_value,
                                                          read_value=False)]):
                return tf.constant(True)

        done = tf.cond(variable.is_initialized(), lambda: tf.constant(False), initialize)
    variable._initializer_op = done.op  # noqa: SLF001


def register(table) -> ShardedTableSaveable:
    """Adds the table's saveable to the graph's GLOBAL_VARIABLES collection.

    There, rather than in SAVEABLE_OBJECTS, TF's Saver still saves the table through it (a
    SaveableObject in its var list), and `global_variables_initializer()` also initialises
    the table's rank-local variable and slots (LOCAL_VARIABLES): a script written for one
    process, with only that initializer, runs on N ranks. TF's readiness checks
    (report_uninitialized_variables) see it as initialised when all of them are.
    """
    saveable = ShardedTableSaveable(table)
    table.sharded_saveable = saveable
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, saveable)
    return saveable


"""Multi-worker training plugged into the single-process layers (`mxrec.core.wing`).

`init()` on several ranks calls `setup`, which starts this rank's server
(mxrec.distributed.communication) and puts `MultiRank` in the registry's `WING` slot
(mxrec.util.registry): lookups of tensor IDs go to the sharded and replicated planners
(mxrec.distributed.sharded_lookup), a table's variables and slots are this rank's own
layout (LOCAL_VARIABLES, initialised once, saved through the table's `ShardedTableSaveable`
by ID), mxrec's Saver waits for every rank and a restore keeps the IDs this rank owns. On one
rank `setup` puts the one-process behaviour back.
"""

import numpy as np
import tensorflow as tf

from mxrec.core import wing
from mxrec.distributed import (  # noqa: F401 (end_of_data fills the END_OF_DATA slot)
    communication,
    end_of_data,
    routing,
    sharded_lookup,
    sharded_state,
)
from mxrec.util import registry


class MultiRank(wing.OneProcess):
    """Several ranks (rank size > 1)."""

    def lookup_planner(self, table, modify_graph: bool):
        del table, modify_graph
        return sharded_lookup.sharded_lookup

    def variables_collection(self) -> str:
        # A rank's rows mean nothing to another rank count: TF's Saver saves the table
        # through its ShardedTableSaveable, keyed by ID, and not this variable.
        return tf.compat.v1.GraphKeys.LOCAL_VARIABLES

    def table_variable_created(self, variable) -> None:
        sharded_state.initialize_once(variable)

    def slots_created(self, optimizer, table_variables) -> None:
        _slots_to_local_variables(optimizer, table_variables)

    def register_saveable(self, table, tiered: bool, is_dp: bool) -> bool:
        if tiered or is_dp:
            # HostStateSaveable, which refuses TF's Saver on several ranks. Without a
            # ShardedTableSaveable in GLOBAL_VARIABLES to initialise them, the variable (and
            # below its slots) go back there, so that global_variables_initializer() alone
            # initialises them, as in one process.
            _to_collection(table.variable, tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                           tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            return False
        sharded_state.register(table)  # the whole table, gathered from every rank
        return True

    def checkpoint_barrier(self, graph):
        if graph.finalized:
            raise ValueError("mxrec Saver on several ranks: build it before the graph is "
                             "finalized (its saves synchronise the ranks with a collective)")
        with tf.name_scope("mxrec_checkpoint/barrier"):
            return communication.allreduce(tf.constant(1, tf.int32), "sum")

    def owned(self, table, keys: np.ndarray, rank: int, size: int) -> np.ndarray:
        if table.is_dp:
            return np.ones(len(keys), bool)
        return routing.owner_of_numpy(keys, size) == rank


def setup(rank: int, size: int):
    """Starts this rank's server (size > 1) and puts the behaviour of `size` ranks in
    force; called by init()."""
    cluster = communication.setup(rank, size)
    registry.provide(registry.WING, MultiRank() if size > 1 else None)
    return cluster


def _to_collection(variable, source: str, target: str) -> None:
    """Moves `variable` from the graph collection `source` to `target`."""
    members = tf.compat.v1.get_collection_ref(source)
    members[:] = [v for v in members if v is not variable]
    tf.compat.v1.add_to_collection(target, variable)


def _slots_to_local_variables(optimizer, table_variables) -> None:
    """On several ranks a table's slot rows, like its rows, are this rank's own layout: they
    leave GLOBAL_VARIABLES for LOCAL_VARIABLES (initialised with them, not saved by TF's
    Saver), and the table's ShardedTableSaveable saves them keyed by ID. Tables without one
    (tiered, is_dp=True) keep their slots in GLOBAL_VARIABLES, as their variable."""
    global_variables = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    for variable in table_variables:
        table = getattr(variable, "_mxrec_table", None)
        if table is not None and getattr(table, "sharded_saveable", None) is None:
            continue
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

"""What a table, a lookup, an optimizer and a checkpoint do in one process, and how
multi-worker training (`mxrec.distributed`) replaces it.

The layers below the wing (core, graph, optimizers, saver) never import `mxrec.distributed`:
they ask `current()`, which is `OneProcess()` until `init()` on several ranks fills the
registry's `WING` slot (mxrec.util.registry) with the wing's
(`mxrec.distributed.multirank.MultiRank`). Each method is one decision those layers
would otherwise make with `if get_rank_size() > 1`.
"""

from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from mxrec.util import registry


class OneProcess:
    """Single-process training: the defaults."""

    def lookup_planner(self, table, modify_graph: bool) -> Optional[Callable]:
        """A function (table, ids, is_train, send_count, scope, modify_graph, default,
        is_grad) -> embeddings that plans and looks up `table`'s tensor IDs instead of the
        one-process key stage, or None (the one-process planners)."""
        del table, modify_graph
        return None

    def variables_collection(self) -> str:
        """The collection of a table's variables (and its optimizers' slots)."""
        return tf.compat.v1.GraphKeys.GLOBAL_VARIABLES

    def table_variable_created(self, variable) -> None:
        """Called with each table variable create_table makes."""
        del variable

    def slots_created(self, optimizer, table_variables: List) -> None:
        """Called after a hash optimizer's apply_gradients made its slots."""
        del optimizer, table_variables

    def register_saveable(self, table, tiered: bool, is_dp: bool) -> bool:
        """Registers the saveable TF's Saver saves `table` through; False leaves it to the
        one-process `HostStateSaveable`."""
        del table, tiered, is_dp
        return False

    def checkpoint_barrier(self, graph) -> Optional[tf.Tensor]:
        """A tensor every rank evaluates before a save is final (mxrec's Saver), or None."""
        del graph
        return None

    def owned(self, table, keys: np.ndarray, rank: int, size: int) -> np.ndarray:
        """Which of a whole table's `keys` the rank `rank` of `size` keeps on a restore."""
        del table, rank, size
        return np.ones(len(keys), bool)


_ONE_PROCESS = OneProcess()


def current() -> OneProcess:
    """The behaviour in force (OneProcess, or the wing's on several ranks)."""
    return registry.provided(registry.WING) or _ONE_PROCESS

"""Host and SSD tiers: the device table as a cache over host memory and disk.

With `create_table(..., device_vocabulary_size=D, host_vocabulary_size=H)`
("DDR mode", and `ssd_vocabulary_size=S, ssd_data_path=...` for "SSD mode")
the device variable holds D rows and the host keeps the rows, optimizer slots
included, of up to H (+ S) more IDs. The host key stage decides per batch,
ahead of the step, which device rows change owner (victims: least recently
used, then least frequently counted, among rows no other lookup of the same
step uses) and which host slots the leaving and arriving IDs' values occupy,
and queues that swap plan in the engine. The step applies the plans in order,
one component (the embedding, then each optimizer slot) at a time:

    reused [R] (rows that change owner, the key stage's reused_rows)
      current  = gather(variable, reused)                 old owners' values
      values = MxrecTierSwap(reused, current, initial)    current -> host tier, new
                                                          owners' values <- host tier
                                                          (initial where it has none)
      variable[reused] = values                           before the lookup's gather

A float32 table on the CPU runs the three as one kernel on the variable's buffer
(MxrecTierSwapInPlace); a GPU table, and a table whose rows or slots rest in half
precision (storage_dtype, slot_dtype), run them as shown, the gathered rows cast to
float32 (exact) and the new values cast back (exact for values the tier held; new IDs'
initial values rounded to nearest, as a device-only table rounds them). The tier stores
each component in its own dtype: 2 bytes a value in host memory and on disk for a half
component.

The embedding swaps before the lookup's gather; the slots swap in the hash
optimizer, before its update. Plans are applied at step time and in plan
order, so a prefetched batch never needs its rows held back: a row that batch
t uses and plan t+1 takes is swapped out by step t+1, after step t trained it.

Example:
    >>> table = create_table(tf.int64, 16, "user", init, device_vocabulary_size=50_000,
    ...                      host_vocabulary_size=1_000_000)
    >>> emb = sparse_lookup(table, ids)        # as in device-only mode
    >>> values = export_values(sess, table)    # {"embedding": (ids [n], rows [n, 16]), ...}
"""

import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core.graph_state import graph_state
from mxrec.core.table import DeviceTable

EMBEDDING = "embedding"
# Per graph (mxrec.core.graph_state): {(table_key, component): the last swap's scatter}
# (swaps of one table and component run one after another, in plan order, within a
# step), and {table_key: training lookups of the table in the graph}.


def _check_count(table_name: str, label: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"create_table {table_name!r}: {label} must be an int >= 0, "
                         f"got {value!r}")
    return int(value)


def check_settings(table_name: str, host_vocabulary_size, ssd_vocabulary_size,
                   ssd_data_path) -> Tuple[int, int, str]:
    """Validates the tier settings of create_table; returns (host, ssd, ssd path).

    Raises:
        ValueError: a negative size, an SSD tier without a host tier, or an SSD tier
            without an existing ssd_data_path directory.
        NotImplementedError: several ssd_data_path directories.
    """
    host = _check_count(table_name, "host_vocabulary_size", host_vocabulary_size)
    ssd = _check_count(table_name, "ssd_vocabulary_size", ssd_vocabulary_size)
    if isinstance(ssd_data_path, (list, tuple)):
        if len(ssd_data_path) > 1:
            raise NotImplementedError(
                f"create_table {table_name!r}: several ssd_data_path directories (filled one "
                f"after another) are not available; give one, got {list(ssd_data_path)}")
        ssd_data_path = ssd_data_path[0] if ssd_data_path else ""
    path = os.fspath(ssd_data_path) if ssd_data_path else ""
    if ssd > 0:
        if host == 0:
            raise ValueError(f"create_table {table_name!r}: ssd_vocabulary_size > 0 needs "
                             "host_vocabulary_size > 0 (the SSD tier lies under the host tier)")
        if not path:
            path = os.getcwd()  # mx_rec's default ssd_data_path: (os.getcwd(),)
        if not os.path.isdir(path):
            raise ValueError(f"create_table {table_name!r}: ssd_data_path {path!r} is not an "
                             "existing directory")
    elif path and host == 0:
        raise ValueError(f"create_table {table_name!r}: ssd_data_path is set but "
                         "ssd_vocabulary_size is 0")
    return host, ssd, path


class TieredTable(DeviceTable):
    """A table whose device variable caches a host-memory (and SSD) tier.

    Its lookups swap the rows that change owner with the host tier before the
    gather, evaluation reads rows of the host tier in place, and the hash
    optimizers swap the slots of those rows too.
    """

    def __init__(self, *args, host_vocabulary_size: int, ssd_vocabulary_size: int = 0,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.host_vocabulary_size = host_vocabulary_size
        self.ssd_vocabulary_size = ssd_vocabulary_size

    def _refill(self, reused: tf.Tensor, by_id: Optional[tf.Tensor] = None
                ) -> tf.Operation:
        # The rows change owner: old owners go to the host tier, new ones come from it
        # (or, new IDs, from the initializer: drawn from their ID with init_by_id).
        return swap_embedding(self, reused, by_id)

    def _rows_off_the_device(self, ids: tf.Tensor, emb: tf.Tensor) -> tf.Tensor:
        return read_host_rows(self, ids, emb)

    def slot_refills(self, optimizer, variable, graph) -> List[tf.Operation]:
        if self.reused_rows(graph) is None:
            return []
        return swap_slots(optimizer, self, variable, graph)


def is_tiered(table) -> bool:
    return isinstance(table, TieredTable)


def _previous_swap(graph, table_key: str, component: str) -> List[tf.Operation]:
    previous = graph_state(graph).tier_swap_chain.get((table_key, component))
    return [] if previous is None else [previous]


def count_training_lookup(table) -> None:
    """Records one more training lookup of `table` in this graph's step.

    The batches of one step are planned one after another; none may take
    another's rows as swap victims, so the engine protects that many batches.
    """
    graph = tf.compat.v1.get_default_graph()
    counts = graph_state(graph).tier_lookups
    counts[table.table_key] = counts.get(table.table_key, 0) + 1
    loader.engine().set_swap_protect(table.table_key, counts[table.table_key])


# Tests set this to False to run the gather/swap/scatter path of GPU tables on the CPU.
SWAP_IN_PLACE = True


def swaps_in_place(table) -> bool:
    """Whether the swaps of `table` write its variables in place (a CPU table).

    A table on the CPU is swapped by one kernel on the variable's own buffer; a
    table on a GPU gathers the victims' rows, swaps them on the host and
    scatters the new values back (the rows cross the bus once each way).
    """
    return _in_place(table.variable)


def _in_place(variable) -> bool:
    # A half-precision variable (storage_dtype, slot_dtype) swaps through float32 tensors:
    # the tier's interface is float32, its storage the variable's type.
    if not SWAP_IN_PLACE or variable.dtype.base_dtype != tf.float32:
        return False
    return tf.DeviceSpec.from_string(variable.device or "").device_type in (None, "CPU")


def apply_swap(table_key: str, variable: tf.Variable, reused: tf.Tensor, component: str,
               fresh: tf.Tensor, after=()) -> tf.Operation:
    """One swap of the rows `reused` of `variable` (component `component` of the table
    `table_key`) with the host tier, after the ops `after`: the engine's next plan of that
    component. fresh: the rows of new IDs ([R, dim], or a scalar for a slot).

    The caller keeps the order (a component's plans one after another, in plan order):
    the Session path through this graph's swap chain (`_swap`), mxrec.keras in its layer.
    """
    if _in_place(variable):
        with tf.control_dependencies(list(after)), tf.device("/device:CPU:0"):
            return loader.op_library().mxrec_tier_swap_in_place(
                variable=variable.handle, rows=reused, fresh_values=fresh,
                table_key=table_key, component=component)
    with tf.control_dependencies(list(after)):
        # exact: every value of a half-precision variable is a float32 value
        current = tf.cast(tf.gather(variable, reused), tf.float32)
    with tf.device("/device:CPU:0"):
        values = loader.op_library().mxrec_tier_swap(
            rows=reused, current=current, fresh_values=fresh,
            table_key=table_key, component=component)
    values = tf.cast(values, variable.dtype.base_dtype)
    return variable.scatter_update(tf.IndexedSlices(values, reused))


def _swap(table, variable: tf.Variable, reused: tf.Tensor, component: str,
          fresh_rows) -> tf.Operation:
    """Swaps the rows `reused` of `variable` (one component of `table`), in plan order."""
    graph = tf.compat.v1.get_default_graph()
    # New IDs' rows (the initializer's rows, or a slot's scalar initial value);
    # the swap takes them where the host tier holds no value.
    fresh = fresh_rows(tf.size(reused))
    # After the previous lookup's whole swap, not only its MxrecTierSwap: this
    # plan may take back an ID that one swapped out, and this lookup's gather
    # may read a row that one refilled (an ID in both batches).
    after = _previous_swap(graph, table.table_key, component)
    if component != EMBEDDING:
        # Slots after the embedding's swaps of the step: the engine applies one
        # swap at a time per table, and the embedding's is on the way to the
        # lookup, the slots' only on the way to the optimizer's update.
        after = after + _previous_swap(graph, table.table_key, EMBEDDING)
    update = apply_swap(table.table_key, variable, reused, component, fresh, after)
    graph_state(graph).tier_swap_chain[(table.table_key, component)] = update
    return update


def swap_embedding(table, reused: tf.Tensor, by_id: Optional[tf.Tensor] = None
                   ) -> tf.Operation:
    """The embedding's swap for one lookup; run it before the lookup's gather.
    by_id: the arriving IDs' first values [R, dim] (init_by_id tables), or None."""
    count_training_lookup(table)

    def fresh_rows(count):
        if by_id is not None:
            return by_id
        return table.initial_rows(
            count, required_for="it has a host tier, so rows of new IDs are filled from its "
            "initializer as they arrive")

    return _swap(table, table.variable, reused, EMBEDDING, fresh_rows)


def swap_slots(optimizer, table, variable, graph) -> List[tf.Operation]:
    """The optimizer slots' swaps of every lookup of `table` in `graph`, in order."""
    reused_list = table._reused_rows.get(graph, [])  # pylint: disable=protected-access
    initial = optimizer._slot_initial_values()  # pylint: disable=protected-access
    ops = []
    for slot_name in sorted(optimizer.get_slot_names()):
        slot = optimizer.get_slot(variable, slot_name)
        if slot is None:
            continue
        if slot_name not in initial:
            raise ValueError(
                f"{type(optimizer).__name__}: slot {slot_name!r} of table {table.table_name!r} "
                "has no initial value (_slot_initial_values), which the host tier needs for "
                "new IDs")
        component = f"{optimizer.get_name()}/{slot_name}"
        loader.engine().tier_register(table.table_key, component)

        def fresh_rows(count, value=initial[slot_name]):
            del count  # the swap fills new IDs' rows with the scalar
            return tf.constant(value, tf.float32)

        for reused in reused_list:
            ops.append(_swap(table, slot, reused, component, fresh_rows))
    return ops


def read_host_rows(table, ids: tf.Tensor, emb: tf.Tensor) -> tf.Tensor:
    """Evaluation: emb [N, dim] with the rows of IDs in the host tier read in place."""
    with tf.device("/device:CPU:0"):
        values, found = loader.op_library().mxrec_tier_read(
            ids=tf.reshape(ids, [-1]), table_key=table.table_key, component=EMBEDDING)
    return tf.where(tf.expand_dims(found, 1), tf.cast(values, emb.dtype), emb)


def stats(table) -> Dict[str, int]:
    """Rows per tier and swap traffic of a table with a host tier.

    Keys: device_rows, tier_ids (IDs whose rows are off the device), host_rows and
    ssd_rows (where those rows physically are now), host_bytes, host_row_bytes (one ID's
    values in a host slot: the embedding and each registered optimizer slot, 4 bytes a value
    in float32 and 2 in bfloat16 or float16), ssd_file_bytes,
    swap_in_total / swap_out_total / fresh_total (embedding rows moved in from the
    tier, out to it, filled by the initializer), swap_in_last / swap_out_last (the
    last applied plan: one step, or the last lookup of a step with several),
    pending_plans, ssd_record_bytes (the bytes of one row's record in the SSD file),
    ssd_read_ahead_records / ssd_read_ahead_runs (SSD records of planned steps hinted to
    the kernel ahead of their use, and the runs of pages those hints asked for),
    ssd_spilled_records / ssd_write_runs / ssd_write_bytes / ssd_write_pages (rows
    spilled to the SSD file, the writes that wrote them, their bytes, and the distinct
    4 KiB pages they touched: what the page cache writes back to the disk).
    """
    engine = loader.engine()
    out = dict(engine.tier_stats(table.table_key))
    host = engine.stats(table.table_key)
    out["device_rows"] = host["rows_in_use"]
    out["tier_ids"] = host.get("tier_ids", 0)
    return out


def export_values(sess: tf.compat.v1.Session, table, slots: bool = True
                  ) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    """Every admitted ID's row, and optimizer slot rows, wherever they live.

    Call it at a step boundary with every planned batch trained (no batch
    prefetched and not yet stepped): the host decides residency ahead of the
    step, so with pending plans the rows are in motion.

    Returns:
        {"embedding": (ids [n] int64 sorted, values [n, dim]),
         "<optimizer>/<slot>": (ids, values), ...}

    Raises:
        RuntimeError: planned batches are still waiting for their step.
    """
    variables = {EMBEDDING: table.variable}
    if slots:
        for optimizer in table.optimizers:
            for slot_name in sorted(optimizer.get_slot_names()):
                slot = optimizer.get_slot(table.variable, slot_name)
                if slot is not None:
                    variables[f"{optimizer.get_name()}/{slot_name}"] = slot
    check_no_pending_plans(table, "export_values")
    return collect_values(table.table_key, sess.run(variables), is_tiered(table))


def check_no_pending_plans(table, where: str) -> None:
    """Raises RuntimeError when `table` has planned batches whose swaps no training step
    has applied yet (its rows are in motion between the device and the host tier)."""
    if not loader.engine().is_tiered(table.table_key):
        return
    pending = loader.engine().tier_stats(table.table_key)["pending_plans"]
    if pending:
        raise RuntimeError(
            f"{where}: table {table.table_name!r} has {pending} planned batches whose swaps "
            "have not been applied by a training step yet; train them first")


def collect_values(table_key: str, dense: Dict[str, np.ndarray], tiered: bool
                   ) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    """{component: (ids sorted, values)} of every admitted ID, from the device arrays of
    each component (`dense`: {"embedding": [rows, dim], "<optimizer>/<slot>": ...}) and,
    for a tiered table, the host tier's values of that component (export_values; mxrec.keras'
    Embedding.export_values)."""
    engine = loader.engine()
    ids, rows = engine.export_rows(table_key)
    out = {}
    for component, full in dense.items():
        all_ids = np.asarray(ids, np.int64)
        values = np.asarray(full)[np.asarray(rows, np.int64)]
        if tiered:
            host_ids, host_values = engine.tier_export(table_key, component)
            all_ids = np.concatenate([all_ids, host_ids])
            values = np.concatenate([values, host_values.astype(values.dtype)])
        order = np.argsort(all_ids, kind="stable")
        out[component] = (all_ids[order], values[order])
    return out


def tier_of(table, ids) -> Optional[np.ndarray]:
    """0 for IDs with a device row, 1 for IDs in the host or SSD tier, -1 otherwise."""
    engine = loader.engine()
    device_ids, _ = engine.export_rows(table.table_key)
    host_ids = engine.tier_export(table.table_key, EMBEDDING)[0] if is_tiered(table) else []
    ids = np.asarray(ids, np.int64)
    return np.where(np.isin(ids, device_ids), 0, np.where(np.isin(ids, host_ids), 1, -1))

"""Version merging: which versions a restore reads, and how they fold into one state.

A restore reads the last full save at or before the wanted step and every delta
after it, in step order, and folds their table files into one state per table
(`merge_table`): a full save replaces the state, a delta removes its removed IDs
and overwrites the records and rows of the IDs it holds.
"""

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from mxrec.saver.manifest import CheckpointError


def chain(versions: List[Tuple[str, int]], version: Optional[int], directory: str
          ) -> List[Tuple[str, int]]:
    """The full save and the deltas to apply, for `version` (a step) or the latest.

    Args:
        versions: (kind, step) of the directory's versions, by step.
        version: the step to restore; None for the latest.
        directory: for messages.
    """
    if version is not None:
        versions = [v for v in versions if v[1] <= version]
        if not any(step == version for _, step in versions):
            raise CheckpointError(f"no checkpoint at step {version} in {directory} "
                                  "(restore_model_version)")
    fulls = [step for kind, step in versions if kind == "full"]
    if not fulls:
        raise CheckpointError(f"no full checkpoint in {directory}"
                              + ("" if version is None else f" at or before step {version}"))
    base = fulls[-1]
    return [("full", base)] + [(k, s) for k, s in versions if k == "delta" and s > base]


def merge_table(table_state: Dict, arrays: Dict[str, np.ndarray], kind: str, name: str):
    """Folds one version's arrays of a table into the state being restored.

    records: ID -> (device row or -1, count, last seen, in host tier); values: ID ->
    {state: row} of IDs with a device row; tier_values: the same for IDs in the host tier
    (a state absent where the tier held no value for it).
    """
    if kind == "full":
        table_state.clear()
        table_state["records"] = {}
        table_state["values"] = {}
        table_state["tier_values"] = {}
    elif "records" not in table_state:
        raise CheckpointError(f"a delta holds table {name!r}, which its full save lacks")
    records = table_state["records"]
    values = table_state["values"]
    tier_values = table_state["tier_values"]
    for key in arrays["host/removed"].tolist():
        records.pop(key, None)
        values.pop(key, None)
        tier_values.pop(key, None)
    state_names = [k[len("state/"):] for k in arrays if k.startswith("state/")]
    keys = arrays["host/keys"].tolist()
    rows = arrays["host/rows"].tolist()
    counts = arrays["host/counts"].tolist()
    last_seen = arrays["host/last_seen"].tolist()
    in_host = (arrays["host/in_host"].tolist() if "host/in_host" in arrays
               else [0] * len(keys))
    tier_names = [k[len("tier/"):] for k in arrays if k.startswith("tier/")]
    device_index = 0
    tier_index = 0
    for key, row, count, seen, host in zip(keys, rows, counts, last_seen, in_host):
        records[key] = (row, count, seen, int(host))
        values.pop(key, None)
        tier_values.pop(key, None)
        if row >= 0:
            values[key] = {n: arrays[f"state/{n}"][device_index] for n in state_names}
            device_index += 1
        elif host:
            tier_values[key] = {n: arrays[f"tier/{n}"][tier_index] for n in tier_names
                                if arrays[f"tier_mask/{n}"][tier_index]}
            tier_index += 1
    table_state["free_rows"] = arrays["host/free_rows"]
    table_state["scalars"] = arrays["host/scalars"]
    table_state["access_threshold"] = arrays["host/access_threshold"]
    table_state["state_names"] = state_names
    for field in ("lru_rows", "lru_ages"):
        if f"host/{field}" in arrays:
            table_state[field] = arrays[f"host/{field}"]


def merge_ranks(table_state: Dict, files: List[Dict[str, np.ndarray]], kind: str, name: str):
    """Folds the files that the ranks of one version wrote for a table (each holds the IDs
    its rank owned) into one state of the whole table; rows stay those of each rank's own
    device table, so the result is only good for `reshard`."""
    newest = table_state.get("newest", -1)
    for index, arrays in enumerate(files):
        merge_table(table_state, arrays, kind if index == 0 else "delta", name)
        newest = max(newest, int(arrays["host/scalars"][1]))
    table_state["newest"] = newest


def reshard(table_state: Dict, keep: Callable[[np.ndarray], np.ndarray], tiered: bool,
            capacity: int, name: str) -> Dict:
    """The part of a whole table's state that one rank owns now (`keep(keys)` is a mask),
    with its rows given anew: a table with a host tier takes every admitted ID into the host
    tier (the device cache fills again as training reads them); a device-only table gives
    its admitted IDs rows 0, 1, ... in ID order.

    Raises:
        CheckpointError: a device-only shard needs more rows than `capacity`.
    """
    records = table_state["records"]
    keys = np.fromiter(records.keys(), np.int64, len(records))
    kept = keys[keep(keys)] if len(keys) else keys
    kept.sort()
    out_records, values, tier_values = {}, {}, {}
    next_row = 0
    for key in kept.tolist():
        row, count, seen, host = records[key]
        value = table_state["values"].get(key) if row >= 0 else None
        if row < 0 and host:
            value = table_state["tier_values"].get(key, {})
        admitted = row >= 0 or host
        if not admitted:
            out_records[key] = (-1, count, seen, 0)
        elif tiered:
            out_records[key] = (-1, count, seen, 1)
            tier_values[key] = value
        else:
            out_records[key] = (next_row, count, seen, 0)
            values[key] = value
            next_row += 1
    if next_row > capacity:
        raise CheckpointError(
            f"table {name!r}: this rank's share of the checkpoint has {next_row} admitted IDs "
            f"but device_vocabulary_size is {capacity}; raise device_vocabulary_size (per "
            "rank) or restore on more ranks")
    scalars = np.array(table_state["scalars"], np.int64)
    scalars[0] = next_row
    scalars[1] = table_state.get("newest", scalars[1])
    out = dict(table_state, records=out_records, values=values, tier_values=tier_values,
               free_rows=np.zeros(0, np.int32), scalars=scalars)
    out.pop("lru_rows", None)
    out.pop("lru_ages", None)
    if tiered:
        out["lru_rows"] = np.zeros(0, np.int32)
        out["lru_ages"] = np.zeros(0, np.uint32)
    return out

"""Version merging: which versions a restore reads, and how they fold into one state.

A restore reads the last full save at or before the wanted step and every delta
after it, in step order, and folds their table files into one state per table
(`merge_table`): a full save replaces the state, a delta removes its removed IDs
and overwrites the records and rows of the IDs it holds.
"""

from typing import Dict, List, Optional, Tuple

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

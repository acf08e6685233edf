"""Version merging: which versions a restore reads, and how they fold into one state.

A restore reads the last full save at or before the wanted step and every delta
after it, in step order (`read_chain`), and folds their table files into one state
per table (`merge_table`): a full save replaces the state, a delta removes its
removed IDs and overwrites the records and rows of the IDs it holds. A version
written by N ranks holds one file per rank and table; `whole_tables` folds them all
into the state of the whole table (what one process would hold), which WarmStart,
the serving export and a restore on another rank count start from.
"""

import contextlib
import gc
import itertools
import posixpath
import re
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from mxrec.saver import manifest as manifest_io
from mxrec.saver import schema
from mxrec.saver.manifest import CheckpointError

_VERSION_DIR = re.compile(r"^(full|delta)-(\d{12})$")
Version = Tuple[str, Dict, Dict[str, Dict[str, np.ndarray]]]  # kind, manifest, files


@contextlib.contextmanager
def paused_gc():
    """Python's cyclic garbage collector paused (if it was running): folding a table makes
    a few objects per ID, none of them in a cycle, and with the collector on, each
    collection it triggers walks every object made so far (half the time of a fold of
    600k IDs here)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def locate(path: str) -> Optional[Tuple[str, Optional[int]]]:
    """(directory, step) when `path` is a directory of mxrec Saver versions (step None: its
    latest) or one version of it (`<dir>/full-000000000100`); None for anything else (a TF
    checkpoint)."""
    if not isinstance(path, str) or not path:
        return None
    path = path.rstrip("/")
    match = _VERSION_DIR.match(posixpath.basename(path))
    if match and tf.io.gfile.exists(posixpath.join(path, "manifest.json")):
        return posixpath.dirname(path), int(match.group(2))
    if tf.io.gfile.isdir(path) and manifest_io.list_versions(path):
        return path, None
    return None


def read_chain(directory: str, version: Optional[int] = None,
               skip_tables: bool = False) -> List[Version]:
    """The versions a restore of `version` (a step; None: the latest) reads, in order, every
    file verified against its manifest and each delta's predecessor checked.

    skip_tables: read the manifests and the last version's dense.npz only (checks before
    the tables are read).

    Raises:
        CheckpointError: nothing to read, a broken chain, a bad or missing file.
    """
    out = []
    previous_step = None
    steps = chain(manifest_io.list_versions(directory), version, directory)
    for index, (kind, step) in enumerate(steps):
        only = None
        if skip_tables:
            only = ("dense.npz",) if index == len(steps) - 1 else ()
        manifest, arrays = manifest_io.read_version(directory, kind, step, only=only)
        if kind == "delta" and manifest["previous"] != previous_step:
            raise CheckpointError(
                f"delta checkpoint at step {step} follows step {manifest['previous']}, "
                f"which is missing from {directory}; cannot apply it")
        for name in manifest["tables"]:
            for file_name in manifest_io.table_files(manifest, name):
                if file_name not in manifest["files"]:
                    raise CheckpointError(
                        f"checkpoint {manifest_io.version_name(kind, step)} in {directory}: "
                        f"table {name!r} names file {file_name}, which its manifest does "
                        "not list; the version is damaged")
        out.append((kind, manifest, arrays))
        previous_step = step
    return out


@paused_gc()
def whole_tables(versions: List[Version]) -> Dict[str, Dict]:
    """Each table's state folded over the versions and over every rank's file of each."""
    state: Dict[str, Dict] = {}
    for kind, manifest, arrays in versions:
        for name in manifest["tables"]:
            merge_ranks(state.setdefault(name, {}),
                        [arrays[f] for f in manifest_io.table_files(manifest, name)], kind, name)
    return state


@paused_gc()
def admitted_values(table_state: Dict, dim: int, state_name: str = "embedding"
                    ) -> Tuple[np.ndarray, np.ndarray]:
    """(ids [K] int64 sorted, values [K, dim] float32) of one state (the embedding, or a
    slot) of every admitted ID of a whole table, wherever its row was (device or host tier).

    Raises:
        CheckpointError: an admitted ID has no value of that state.
    """
    keys = []
    rows = []
    for key in sorted(table_state["records"]):
        row, _, _, in_host = table_state["records"][key]
        if row < 0 and not in_host:
            continue  # counted, not admitted: no row
        value = (table_state["values"] if row >= 0 else table_state["tier_values"]).get(key, {})
        if state_name not in value:
            raise CheckpointError(f"checkpoint holds no {state_name!r} value of ID {key}")
        keys.append(key)
        rows.append(value[state_name])
    values = np.stack(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32)
    return np.asarray(keys, np.int64), values


def table_names(versions: List[Version]) -> List[str]:
    """The tables of a chain (what `whole_tables` would hold), sorted.

    Raises:
        CheckpointError: a delta holds a table that the full save it follows lacks.
    """
    if not versions:
        return []
    base = set(versions[0][1]["tables"])
    for _, manifest, _ in versions[1:]:
        for name in manifest["tables"]:
            if name not in base:
                raise CheckpointError(f"a delta holds table {name!r}, which its full save lacks")
    return sorted(base)


def admitted_arrays(versions: List[Version], name: str, dim: int,
                    state_name: str = "embedding") -> Tuple[np.ndarray, np.ndarray]:
    """`admitted_values(whole_tables(versions)[name], dim, state_name)` folded with NumPy:
    (ids [K] int64 sorted, values [K, dim] float32) of every ID admitted at the chain's end.

    Each rank file of each version is a run of events in fold order (its removed IDs, then
    its records, as `merge_table` applies them; a full version's first file starts afresh);
    an ID's last event decides: removed or counted only (no row), or admitted with the value
    its file holds (a device row's, or the host tier's where its mask is set). The serving
    export reads tables this way: `whole_tables` builds a dict per ID (about 20 s for 1.5
    million IDs here), which only a restore needs.

    Raises:
        CheckpointError: an admitted ID has no value of that state; a file's state holds
            fewer rows than its IDs with a device row (or its tier fewer than its IDs in the
            host tier); a delta holds a table its full save lacks.
    """
    return _last_events(_table_events(versions, name, state_name), dim, state_name)


class _EventLog:
    """The events of one table's rank files, in fold order, as parallel arrays: each
    event's ID, whether it leaves the ID admitted, and where its value lies among the
    values logged (-1: none)."""

    def __init__(self):
        self.keys: List[np.ndarray] = []
        self.admitted: List[np.ndarray] = []
        self.index: List[np.ndarray] = []
        self.values: List[np.ndarray] = []
        self._offset = 0

    def add_values(self, values: np.ndarray) -> np.ndarray:
        """Logs `values`; returns where each lies among the values logged."""
        spots = self._offset + np.arange(len(values))
        self.values.append(values)
        self._offset += len(values)
        return spots

    def add_events(self, keys: np.ndarray, admitted: np.ndarray, index: np.ndarray) -> None:
        self.keys.append(keys)
        self.admitted.append(admitted)
        self.index.append(index)


def _table_events(versions: List[Version], name: str, state_name: str
                  ) -> Optional[_EventLog]:
    """The events of table `name` over the chain (None: no version holds it); a full
    version's first file starts the log afresh."""
    log = None
    for kind, manifest, files in versions:
        if name not in manifest["tables"]:
            continue
        for number, file_name in enumerate(manifest_io.table_files(manifest, name)):
            if kind == "full" and number == 0:
                log = _EventLog()
            elif log is None:
                raise CheckpointError(f"a delta holds table {name!r}, which its full save lacks")
            where = (f"table {name!r}, file {file_name} of "
                     f"{manifest_io.version_name(kind, manifest['step'])}")
            _log_file(log, files[file_name], state_name, where)
    return log


def _log_file(log: _EventLog, arrays: Dict[str, np.ndarray], state_name: str,
              where: str) -> None:
    """Logs one rank file's events: its removed IDs, then its records, each admitted one
    with its value of `state_name` (a device row's, or the host tier's where its mask is
    set)."""
    removed = np.asarray(arrays[schema.host_key("removed")], np.int64).reshape(-1)
    keys = np.asarray(arrays[schema.host_key("keys")], np.int64).reshape(-1)
    rows = np.asarray(arrays[schema.host_key("rows")]).reshape(-1)
    in_host = (np.asarray(arrays[schema.host_key("in_host")]).reshape(-1) != 0
               if schema.host_key("in_host") in arrays
               else np.zeros(len(keys), bool))
    device = rows >= 0
    host = ~device & in_host
    index = np.full(len(keys), -1, np.int64)
    if schema.state_key(state_name) in arrays:
        state = arrays[schema.state_key(state_name)]
        count = int(device.sum())
        if len(state) < count:
            raise CheckpointError(f"{where}: {len(state)} rows of state "
                                  f"{state_name!r} for {count} IDs with a device row")
        index[device] = log.add_values(state[:count])
    if schema.tier_key(state_name) in arrays:
        tier = arrays[schema.tier_key(state_name)]
        mask = np.asarray(arrays[schema.tier_mask_key(state_name)]).reshape(-1) != 0
        count = int(host.sum())
        if len(tier) < count or len(mask) < count:
            raise CheckpointError(f"{where}: {len(tier)} tier values of state "
                                  f"{state_name!r} for {count} IDs in the host tier")
        index[host] = np.where(mask[:count], log.add_values(tier[:count]), -1)
    log.add_events(removed, np.zeros(len(removed), bool), np.full(len(removed), -1, np.int64))
    log.add_events(keys, device | host, index)


def _last_events(log: Optional[_EventLog], dim: int, state_name: str
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """(ids sorted, values) of the IDs whose last event in `log` admits them."""
    if log is None:
        return np.zeros([0], np.int64), np.zeros((0, dim), np.float32)
    keys = np.concatenate(log.keys)
    order = np.argsort(keys, kind="stable")  # each ID's events in fold order
    keys = keys[order]
    last = np.ones(len(keys), bool)
    last[:-1] = keys[1:] != keys[:-1]
    chosen = order[last]
    admitted = np.concatenate(log.admitted)[chosen]
    ids = keys[last][admitted]
    index = np.concatenate(log.index)[chosen][admitted]
    missing = np.flatnonzero(index < 0)
    if len(missing):
        raise CheckpointError(f"checkpoint holds no {state_name!r} value of ID "
                              f"{int(ids[missing[0]])}")
    if not len(ids):
        return ids, np.zeros((0, dim), np.float32)
    values = np.concatenate(log.values)[index].astype(np.float32)
    return ids, values


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


@paused_gc()
def merge_table(table_state: Dict, arrays: Dict[str, np.ndarray], kind: str, name: str):
    """Folds one version's arrays of a table into the state being restored.

    records: ID -> (device row or -1, count, last seen, in host tier); values: ID ->
    {state: row} of IDs with a device row; tier_values: the same for IDs in the host tier
    (a state absent where the tier held no value for it).
    """
    _begin(table_state, kind, name)
    _forget(table_state, arrays[schema.host_key("removed")].tolist())
    key_array, row_array = arrays[schema.host_key("keys")], arrays[schema.host_key("rows")]
    in_host = (arrays[schema.host_key("in_host")].astype(np.int64)
               if schema.host_key("in_host") in arrays
               else np.zeros(len(key_array), np.int64))
    device = row_array >= 0
    in_tier = ~device & (in_host != 0)
    # A delta: what it holds replaces the IDs' earlier values (those with a device row or a
    # host-tier row below are written over; the others lose what they had there).
    if table_state["values"]:
        _forget(table_state, key_array[~device].tolist(), parts=("values",))
    if table_state["tier_values"]:
        _forget(table_state, key_array[~in_tier].tolist(), parts=("tier_values",))
    # Built by zips over whole columns (no indexing per ID): the records, then the
    # values of the IDs with a device row (the state arrays' rows, in record order)
    # and of those in the host tier (the tier arrays' rows, the same way).
    table_state["records"].update(zip(key_array.tolist(), map(schema.Record._make, zip(
        row_array.tolist(), arrays[schema.host_key("counts")].tolist(),
        arrays[schema.host_key("last_seen")].tolist(), in_host.tolist()))))
    state_names = schema.names_with_prefix(arrays, "state")
    _fold_device_values(table_state["values"], arrays, key_array[device], state_names, name)
    _fold_tier_values(table_state["tier_values"], arrays, key_array[in_tier].tolist(), name)
    _keep_table_fields(table_state, arrays, state_names)


def _begin(table_state: Dict, kind: str, name: str) -> None:
    """A full version starts the table's state afresh; a delta needs one to fold into."""
    if kind == "full":
        table_state.clear()
        table_state["records"] = {}
        table_state["values"] = {}
        table_state["tier_values"] = {}
    elif "records" not in table_state:
        raise CheckpointError(f"a delta holds table {name!r}, which its full save lacks")


def _forget(table_state: Dict, keys: List[int],
            parts: Tuple[str, ...] = ("records", "values", "tier_values")) -> None:
    """Drops what `parts` of the state hold of `keys`."""
    for part in parts:
        held = table_state[part]
        for key in keys:
            held.pop(key, None)


def _fold_device_values(values: Dict, arrays: Dict[str, np.ndarray], keys: np.ndarray,
                        state_names: List[str], name: str) -> None:
    """The values of the IDs with a device row: the state arrays' rows, in record order."""
    columns = [list(arrays[schema.state_key(n)]) for n in state_names]
    _check_rows(name, "device", len(keys), {n: len(c) for n, c in zip(state_names, columns)})
    state_rows = zip(*columns) if columns else itertools.repeat(())
    values.update(zip(keys.tolist(), (dict(zip(state_names, row)) for row in state_rows)))


def _fold_tier_values(tier_values: Dict, arrays: Dict[str, np.ndarray], tier_keys: List[int],
                      name: str) -> None:
    """The values of the IDs in the host tier: each state the tier's mask says it holds."""
    if not tier_keys:
        return
    tier_names = schema.names_with_prefix(arrays, "tier")
    tier_columns = [(n, arrays[schema.tier_key(n)], arrays[schema.tier_mask_key(n)])
                    for n in tier_names]
    _check_rows(name, "host-tier", len(tier_keys),
                {n: min(len(c), len(m)) for n, c, m in tier_columns})
    for index, key in enumerate(tier_keys):
        tier_values[key] = {n: column[index] for n, column, mask in tier_columns
                            if mask[index]}


def _keep_table_fields(table_state: Dict, arrays: Dict[str, np.ndarray],
                       state_names: List[str]) -> None:
    """The version's table-wide fields (free rows, scalars, threshold, LRU order), which
    replace the earlier version's."""
    table_state["free_rows"] = arrays[schema.host_key("free_rows")]
    table_state["scalars"] = arrays[schema.SCALARS_KEY]
    table_state["access_threshold"] = arrays[schema.ACCESS_THRESHOLD_KEY]
    table_state["state_names"] = state_names
    for field in ("lru_rows", "lru_ages"):
        if schema.host_key(field) in arrays:
            table_state[field] = arrays[schema.host_key(field)]


def _check_rows(name: str, where: str, ids: int, lengths: Dict[str, int]) -> None:
    short = {n: length for n, length in lengths.items() if length < ids}
    if short:
        raise CheckpointError(f"table {name!r}: the checkpoint has {ids} IDs with a {where} "
                              f"row but only {short} rows of their values; the file is "
                              "damaged (restore an earlier version)")


def merge_ranks(table_state: Dict, files: List[Dict[str, np.ndarray]], kind: str, name: str):
    """Folds the files that the ranks of one version wrote for a table (each holds the IDs
    its rank owned) into one state of the whole table; rows stay those of each rank's own
    device table, so the result is only good for `reshard`."""
    newest = table_state.get("newest", -1)
    for index, arrays in enumerate(files):
        merge_table(table_state, arrays, kind if index == 0 else "delta", name)
        newest = max(newest, schema.scalar(arrays[schema.SCALARS_KEY], "newest_timestamp"))
    table_state["newest"] = newest


@paused_gc()
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
        row, count, seen, host = records[key]  # a schema.Record
        value = table_state["values"].get(key) if row >= 0 else None
        if row < 0 and host:
            value = table_state["tier_values"].get(key, {})
        admitted = row >= 0 or host
        if not admitted:
            out_records[key] = schema.Record(-1, count, seen, 0)
        elif tiered:
            out_records[key] = schema.Record(-1, count, seen, 1)
            tier_values[key] = value
        else:
            out_records[key] = schema.Record(next_row, count, seen, 0)
            values[key] = value
            next_row += 1
    if next_row > capacity:
        raise CheckpointError(
            f"table {name!r}: this rank's share of the checkpoint has {next_row} admitted IDs "
            f"but device_vocabulary_size is {capacity}; raise device_vocabulary_size (per "
            "rank) or restore on more ranks")
    scalars = schema.with_scalars(
        table_state["scalars"], next_row=next_row,
        newest_timestamp=table_state.get(
            "newest", schema.scalar(table_state["scalars"], "newest_timestamp")))
    out = dict(table_state, records=out_records, values=values, tier_values=tier_values,
               free_rows=np.zeros(0, np.int32), scalars=scalars)
    out.pop("lru_rows", None)
    out.pop("lru_ages", None)
    if tiered:
        out["lru_rows"] = np.zeros(0, np.int32)
        out["lru_ages"] = np.zeros(0, np.uint32)
    return out

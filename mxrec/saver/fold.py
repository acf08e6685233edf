"""A restore's fold of table files into one table state, as columns: no object per ID.

Each table file of a version chain is a run of events in fold order: its removed IDs, then
its records; the first file of a full version starts
afresh. An ID's last event decides its state: removed (gone), or the record of that file,
with its values where that file holds them (the device rows `state/<s>` of the IDs with a
row, the host tier's `tier/<s>` of those in the tier). `fold` finds every ID's last event
by one stable sort of the events' IDs; the result holds, per ID, its record and where its
values lie (which file, which row there), and `Folded.values` reads the values of a chunk
of IDs from the files (mapped by `stream.MappedNpz`, so only those rows are read).

`shard` keeps the IDs one rank owns and gives them rows anew (a restore on another rank
count, WarmStart).

Example:
    >>> folded = fold([(True, full_file), (False, delta_file)], "user")
    >>> folded.keys, folded.rows                      # every ID's record, as columns
    >>> folded.values(np.arange(1000), "embedding")   # (values [1000, dim], held [1000])
"""

import io
import posixpath
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from mxrec.core import storage_dtype
from mxrec.saver import manifest as manifest_io
from mxrec.saver import merge, schema, stream
from mxrec.saver.manifest import CheckpointError


class OpenVersion(NamedTuple):
    """A version of a chain, every file verified: its table files mapped
    (`stream.MappedNpz`) and, for the chain's last version, its dense variables."""

    kind: str
    manifest: Dict
    files: Dict[str, stream.MappedNpz]
    dense: Optional[Dict[str, np.ndarray]]


def open_chain(directory: str, version: Optional[int], copies: stream.LocalCopies
               ) -> List[OpenVersion]:
    """The versions a restore of `version` (a step; None: the latest) reads, in order: each
    delta's predecessor checked, then every file of every version checked against its
    manifest (size, SHA-256, read a block at a time) before any is mapped.

    Raises:
        CheckpointError: nothing to read, a broken chain, a bad or missing file.
    """
    steps = merge.chain(manifest_io.list_versions(directory), version, directory)
    manifests = []
    previous = None
    for kind, step in steps:
        manifest = manifest_io.read_manifest(directory, kind, step)
        merge.check_link(directory, kind, step, manifest, previous)
        manifests.append(manifest)
        previous = step
    for (kind, step), manifest in zip(steps, manifests):
        folder = posixpath.join(directory, manifest_io.version_name(kind, step))
        for file_name, expect in sorted(manifest["files"].items()):
            stream.verify(posixpath.join(folder, file_name), expect)
    out = []
    for index, ((kind, step), manifest) in enumerate(zip(steps, manifests)):
        folder = posixpath.join(directory, manifest_io.version_name(kind, step))
        files = {name: stream.MappedNpz(copies.local(posixpath.join(folder, name)))
                 for name in manifest["files"] if name != "dense.npz"}
        dense = None
        if index == len(steps) - 1:
            with tf.io.gfile.GFile(posixpath.join(folder, "dense.npz"), "rb") as f:
                with np.load(io.BytesIO(f.read())) as npz:
                    dense = {key: npz[key] for key in npz.files}
        out.append(OpenVersion(kind, manifest, files, dense))
    return out


class _File(NamedTuple):
    """One table file's columns, and where each record's values lie in it."""

    arrays: object  # MappedNpz or {name: array}
    keys: np.ndarray
    where: np.ndarray  # per record: its row in state/<s> (device) or tier/<s>; -1: none
    from_tier: np.ndarray  # per record: its values are in tier/<s> (the host tier)


class Folded:
    """A table's state at a chain's end, as columns (see the module's docstring).

    Attributes:
        keys, rows, counts, last_seen, in_host: every ID's record.
        free_rows, scalars, access_threshold, lru_rows, lru_ages (None when the files
            hold none), state_names: the table-wide fields of the last file folded.
        newest: the newest timestamp over every file folded.
    """

    def __init__(self, files: List[_File], source: np.ndarray, record: np.ndarray, name: str):
        self.name = name
        self._files = files
        self._source = source  # per ID: its file (None: one file, the ID at its record)
        self._record = record  # per ID: its record in that file
        self.keys = np.zeros(len(source), np.int64)
        self.rows = np.zeros(len(source), np.int32)
        self.counts = np.zeros(len(source), np.float32)
        self.last_seen = np.zeros(len(source), np.int64)
        self.in_host = np.zeros(len(source), np.uint8)
        for f, file in enumerate(files):
            mine = np.flatnonzero(source == f)
            if not len(mine):
                continue
            at = record[mine]
            arrays = file.arrays
            self.keys[mine] = file.keys[at]
            self.rows[mine] = np.asarray(arrays[schema.host_key("rows")])[at]
            self.counts[mine] = np.asarray(arrays[schema.host_key("counts")])[at]
            self.last_seen[mine] = np.asarray(arrays[schema.host_key("last_seen")])[at]
            if schema.host_key("in_host") in arrays:
                self.in_host[mine] = np.asarray(arrays[schema.host_key("in_host")])[at]
        self._table_wide(files)

    @classmethod
    def of_file(cls, file: _File, name: str) -> "Folded":
        """The fold of one file: every record an ID, in the file's order, the columns
        those of the file (mapped, not copied)."""
        out = cls.__new__(cls)
        out.name, out._files, out._source, out._record = name, [file], None, None
        arrays = file.arrays
        out.keys = file.keys
        out.rows = np.asarray(arrays[schema.host_key("rows")], np.int32).reshape(-1)
        out.counts = np.asarray(arrays[schema.host_key("counts")], np.float32).reshape(-1)
        out.last_seen = np.asarray(arrays[schema.host_key("last_seen")], np.int64).reshape(-1)
        # No file column: zeros the kernel backs with no memory until written.
        out.in_host = (np.asarray(arrays[schema.host_key("in_host")], np.uint8).reshape(-1)
                       if schema.host_key("in_host") in arrays
                       else np.zeros(len(out.keys), np.uint8))
        out._table_wide([file])
        return out

    def _table_wide(self, files: List[_File]) -> None:
        last = files[-1].arrays
        self.free_rows = np.asarray(last[schema.host_key("free_rows")])
        self.scalars = np.asarray(last[schema.SCALARS_KEY])
        self.access_threshold = float(np.asarray(last[schema.ACCESS_THRESHOLD_KEY]))
        self.lru_rows = (np.asarray(last[schema.host_key("lru_rows")])
                         if schema.host_key("lru_rows") in last else None)
        self.lru_ages = (np.asarray(last[schema.host_key("lru_ages")])
                         if schema.host_key("lru_ages") in last else None)
        self.state_names = schema.names_with_prefix(last, "state")
        self.newest = max(schema.scalar(np.asarray(f.arrays[schema.SCALARS_KEY]),
                                        "newest_timestamp") for f in files)

    def __len__(self) -> int:
        return len(self.keys)

    def tier_state_names(self) -> List[str]:
        """The states (embedding, slots) the host tier holds values of: those of the files'
        host tiers, and the device states of IDs that `shard` moved into the tier."""
        names = set()
        for file in self._files:
            names.update(schema.names_with_prefix(file.arrays, "tier"))
        if self._source is None:
            # One file: an ID in the tier with a device row too would be "moved".
            moved = any(((np.asarray(self.in_host[b:e]) != 0)
                         & (np.asarray(self.rows[b:e]) >= 0)).any()
                        for b, e in stream.chunks_of(len(self), 1 << 20))
            if moved:
                names.update(schema.names_with_prefix(self._files[0].arrays, "state"))
            return sorted(names)
        host = self.in_host != 0
        moved = host & ~self._from_tier_of(np.arange(len(self)))
        if moved.any():
            for f in np.unique(self._source[moved]):
                names.update(schema.names_with_prefix(self._files[f].arrays, "state"))
        return sorted(names)

    def _in_file(self, f: int, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(indexes into `positions` of the IDs whose last event is file f, their records
        there)."""
        if self._source is None:
            return np.arange(len(positions)), positions
        mine = np.flatnonzero(self._source[positions] == f)
        return mine, self._record[positions[mine]]

    def _from_tier_of(self, positions: np.ndarray) -> np.ndarray:
        if self._source is None:
            return self._files[0].from_tier[positions]
        out = np.zeros(len(positions), bool)
        for f, file in enumerate(self._files):
            mine = self._source[positions] == f
            if mine.any():
                out[mine] = file.from_tier[self._record[positions[mine]]]
        return out

    def values(self, positions: np.ndarray, state: str, dim: int
               ) -> Tuple[np.ndarray, np.ndarray]:
        """(values [n, dim] float32, held [n] bool) of `state` for the IDs at `positions`:
        each ID's values where its last event's file holds them (zeros, not held, where
        that file has none of that state: the tier's mask, or a state it lacks)."""
        positions = np.asarray(positions, np.int64)
        out = np.zeros((len(positions), dim), np.float32)
        held = np.zeros(len(positions), bool)
        for f, file in enumerate(self._files):
            mine, at = self._in_file(f, positions)
            if not len(mine):
                continue
            where = file.where[at]
            tier = file.from_tier[at]
            for in_tier, key in ((False, schema.state_key(state)), (True, schema.tier_key(state))):
                chosen = (tier == in_tier) & (where >= 0)
                part = mine[chosen]
                if not len(part) or key not in file.arrays:
                    continue
                index = where[chosen]
                order = np.argsort(index, kind="stable")  # the file read in order
                rows = storage_dtype.from_file(file.arrays[key][index[order]])
                out[part[order]] = rows
                has = np.ones(len(part), bool)
                if in_tier:
                    has = np.asarray(file.arrays[schema.tier_mask_key(state)][index]) != 0
                    out[part[~has]] = 0.0
                held[part] = has
        return out, held

    def take(self, keep: np.ndarray, rows: np.ndarray, in_host: np.ndarray) -> "Folded":
        """The IDs where `keep` is set, with the rows and tier flags given."""
        out = Folded.__new__(Folded)
        out.__dict__.update(self.__dict__)
        source, record = self._source, self._record
        if source is None:
            source, record = np.zeros(len(self), np.int32), np.arange(len(self))
        out._source, out._record = source[keep], record[keep]
        out.keys, out.counts = self.keys[keep], self.counts[keep]
        out.last_seen = self.last_seen[keep]
        out.rows, out.in_host = rows, in_host
        return out


class _Places:
    """Where each record of a file has its values (its row in `state/<s>` for a device
    row, in `tier/<s>` for the host tier; -1: none), computed for the records asked from
    counts per block of records, so that no array per record is held: a file's records
    are read in order by a restore of the same layout (`Folded` of one file).

    Indexing with positions in order reads each block of records once; any order is
    right, only slower.
    """

    BLOCK = 1 << 16

    def __init__(self, rows: np.ndarray, in_host: Optional[np.ndarray]):
        self._rows, self._in_host = rows, in_host
        blocks = -(-len(rows) // self.BLOCK)
        self.device_before = np.zeros(blocks + 1, np.int64)
        self.host_before = np.zeros(blocks + 1, np.int64)
        for b in range(blocks):
            device, host = self._kinds(b)
            self.device_before[b + 1] = self.device_before[b] + int(device.sum())
            self.host_before[b + 1] = self.host_before[b] + int(host.sum())

    def _kinds(self, block: int) -> Tuple[np.ndarray, np.ndarray]:
        span = slice(block * self.BLOCK, (block + 1) * self.BLOCK)
        device = np.asarray(self._rows[span]) >= 0
        if self._in_host is None:
            return device, np.zeros(len(device), bool)
        return device, ~device & (np.asarray(self._in_host[span]) != 0)

    def devices(self) -> int:
        return int(self.device_before[-1])

    def hosts(self) -> int:
        return int(self.host_before[-1])

    def __getitem__(self, at) -> np.ndarray:
        at = np.asarray(at, np.int64).reshape(-1)
        out = np.full(len(at), -1, np.int64)
        if not len(at):
            return out
        blocks = at // self.BLOCK
        order = np.argsort(blocks, kind="stable")
        starts = np.flatnonzero(np.r_[True, blocks[order][1:] != blocks[order][:-1]])
        for first, last in zip(starts, np.r_[starts[1:], len(order)]):
            mine = order[first:last]
            b = int(blocks[mine[0]])
            device, host = self._kinds(b)
            offset = at[mine] - b * self.BLOCK
            in_device = np.cumsum(device) - device
            in_host = np.cumsum(host) - host
            out[mine] = np.where(device[offset], self.device_before[b] + in_device[offset],
                                 np.where(host[offset], self.host_before[b] + in_host[offset],
                                          -1))
        return out


class _FromTier:
    """Per record of a file: its values are in `tier/<s>` (no device row, in the host
    tier), read from the file's columns for the records asked."""

    def __init__(self, rows: np.ndarray, in_host: Optional[np.ndarray]):
        self._rows, self._in_host = rows, in_host

    def __getitem__(self, at) -> np.ndarray:
        at = np.asarray(at, np.int64)
        if self._in_host is None:
            return np.zeros(at.shape, bool)
        return (np.asarray(self._rows[at]) < 0) & (np.asarray(self._in_host[at]) != 0)


def _check_value_rows(arrays, devices: int, hosts: int, where_text: str) -> None:
    for prefix, count, what in (("state", devices, "with a device row"),
                                ("tier", hosts, "in the host tier")):
        for state in schema.names_with_prefix(arrays, prefix):
            held = len(arrays[f"{prefix}/{state}"])
            if prefix == "tier":
                held = min(held, len(arrays[schema.tier_mask_key(state)]))
            if held < count:
                raise CheckpointError(f"{where_text}: the checkpoint has {count} IDs {what} "
                                      f"but only {held} rows of their {state!r} values; the "
                                      "file is damaged (restore an earlier version)")


def _file_places(arrays, where_text: str) -> _File:
    """A file's columns as they are (mapped) with `_Places`: for a fold of that one file."""
    keys = np.asarray(arrays[schema.host_key("keys")], np.int64).reshape(-1)
    rows = np.asarray(arrays[schema.host_key("rows")]).reshape(-1)
    in_host = (np.asarray(arrays[schema.host_key("in_host")]).reshape(-1)
               if schema.host_key("in_host") in arrays else None)
    places = _Places(rows, in_host)
    _check_value_rows(arrays, places.devices(), places.hosts(), where_text)
    return _File(arrays, keys, places, _FromTier(rows, in_host))


def _file_columns(arrays, where_text: str) -> _File:
    """A table file's keys and where each record's values lie (checked against the
    arrays' lengths)."""
    keys = np.asarray(arrays[schema.host_key("keys")], np.int64).reshape(-1)
    rows = np.asarray(arrays[schema.host_key("rows")]).reshape(-1)
    in_host = (np.asarray(arrays[schema.host_key("in_host")]).reshape(-1) != 0
               if schema.host_key("in_host") in arrays else np.zeros(len(keys), bool))
    device = rows >= 0
    host = ~device & in_host
    where = np.full(len(keys), -1, np.int64)
    where[device] = np.arange(int(device.sum()))
    where[host] = np.arange(int(host.sum()))
    _check_value_rows(arrays, int(device.sum()), int(host.sum()), where_text)
    return _File(arrays, keys, where, host)


def fold(files: Sequence[Tuple[bool, object]], name: str,
         where: Optional[Sequence[str]] = None) -> Folded:
    """Folds table files in order; each is (starts_afresh, arrays): the first file of a
    full version starts afresh.

    Raises:
        CheckpointError: the first file does not start afresh (a delta without its full
            save), or a file holds fewer rows of values than its records need.
    """
    start = max((i for i, (afresh, _) in enumerate(files) if afresh), default=None)
    if start is None:
        raise CheckpointError(f"a delta holds table {name!r}, which its full save lacks")
    where = list(where) if where is not None else [f"table {name!r}"] * len(files)
    if start == len(files) - 1:
        # One full file: every record is its ID's last event, in the file's order. The
        # columns stay mapped from the file and nothing per ID is built.
        return Folded.of_file(_file_places(files[start][1], where[start]), name)
    columns = [_file_columns(arrays, where[i]) for i, (_, arrays) in
               enumerate(files) if i >= start]
    keys, file_of, record_of = [], [], []
    for f, (column, (_, arrays)) in enumerate(zip(columns, files[start:])):
        removed = np.asarray(arrays[schema.host_key("removed")], np.int64).reshape(-1)
        keys += [removed, column.keys]
        file_of += [np.full(len(removed) + len(column.keys), f, np.int32)]
        record_of += [np.full(len(removed), -1, np.int64), np.arange(len(column.keys))]
    keys = np.concatenate(keys)
    order = np.argsort(keys, kind="stable")  # each ID's events in fold order
    sorted_keys = keys[order]
    del keys
    last = np.ones(len(order), bool)
    last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
    chosen = order[last]
    del order, sorted_keys, last
    record = np.concatenate(record_of)[chosen]
    source = np.concatenate(file_of)[chosen]
    alive = record >= 0  # an ID whose last event is a removal is gone
    return Folded(columns, source[alive], record[alive], name)


def table_files(versions: Sequence[OpenVersion], name: str, rank: Optional[int] = None
                ) -> Tuple[List[Tuple[bool, object]], List[str]]:
    """The files of table `name` over a chain, in fold order, as `fold` takes them (the
    first file of a full version starts afresh), and where each is (for messages): every
    rank's, or only `rank`'s (a restore on as many ranks as saved it)."""
    files, where = [], []
    for version in versions:
        if name not in version.manifest["tables"]:
            continue
        names = manifest_io.table_files(version.manifest, name)
        if rank is not None:
            names = names[rank:rank + 1]
        for number, file_name in enumerate(names):
            files.append((version.kind == "full" and number == 0, version.files[file_name]))
            where.append(f"table {name!r}, file {file_name} of "
                         f"{manifest_io.version_name(version.kind, version.manifest['step'])}")
    return files, where


def table_names(versions: Sequence[OpenVersion]) -> List[str]:
    """The tables of a chain, sorted.

    Raises:
        CheckpointError: a delta holds a table that the full save it follows lacks.
    """
    base = set(versions[0].manifest["tables"]) if versions else set()
    for version in versions[1:]:
        for name in version.manifest["tables"]:
            if name not in base:
                raise CheckpointError(f"a delta holds table {name!r}, which its full save lacks")
    return sorted(base)


def whole_table(versions: Sequence[OpenVersion], name: str) -> Folded:
    """The whole table `name` at the chain's end: every rank's files folded (each rank's
    device rows stay its own: good for `shard` and `admitted`, not for a restore as is)."""
    files, where = table_files(versions, name)
    if not files:
        raise CheckpointError(f"table {name!r} is not in the checkpoint")
    return fold(files, name, where)


def admitted(folded: Folded, dim: int, state: str = "embedding", rows: int = 1 << 16
             ) -> Tuple[np.ndarray, np.ndarray]:
    """(ids [K] int64 sorted, values [K, dim] float32) of one state of every admitted ID
    (a device row or the host tier), read a chunk of `rows` IDs at a time.

    Raises:
        CheckpointError: an admitted ID has no value of that state, or is held twice.
    """
    positions = np.flatnonzero((folded.rows >= 0) | (folded.in_host != 0))
    positions = positions[np.argsort(folded.keys[positions], kind="stable")]
    keys = folded.keys[positions]
    # One full file is read in place, a record an ID as a save writes it: a repeat is a
    # damaged file (a chain's fold keeps an ID's last record instead).
    repeated = np.flatnonzero(keys[1:] == keys[:-1])
    if len(repeated):
        raise CheckpointError(f"table {folded.name!r}: ID {int(keys[repeated[0]])} appears "
                              "twice in a table file, which a save never writes")
    values = np.zeros((len(positions), dim), np.float32)
    for begin in range(0, len(positions), rows):
        part = positions[begin:begin + rows]
        values[begin:begin + len(part)], held = folded.values(part, state, dim)
        if not held.all():
            raise CheckpointError(f"checkpoint holds no {state!r} value of ID "
                                  f"{int(folded.keys[part[np.argmin(held)]])}")
    return keys, values


def shard(folded: Folded, keep: Callable[[np.ndarray], np.ndarray], tiered: bool,
          capacity: int) -> Folded:
    """The IDs one rank owns (`keep(keys)` is a mask), rows given anew: a tiered table
    takes every admitted ID into the host tier (the device cache fills again as training
    reads them); a device-only table gives its admitted IDs rows 0, 1, ... in ID order.

    Raises:
        CheckpointError: a device-only shard needs more rows than `capacity`.
    """
    mask = keep(folded.keys) if len(folded) else np.zeros(0, bool)
    kept = np.flatnonzero(mask)
    kept = kept[np.argsort(folded.keys[kept], kind="stable")]
    admitted = (folded.rows[kept] >= 0) | (folded.in_host[kept] != 0)
    rows = np.full(len(kept), -1, np.int32)
    in_host = np.zeros(len(kept), np.uint8)
    if tiered:
        in_host[admitted] = 1
        next_row = 0
    else:
        next_row = int(admitted.sum())
        rows[admitted] = np.arange(next_row, dtype=np.int32)
    if next_row > capacity:
        raise CheckpointError(
            f"table {folded.name!r}: this rank's share of the checkpoint has {next_row} "
            f"admitted IDs but device_vocabulary_size is {capacity}; raise "
            "device_vocabulary_size (per rank) or restore on more ranks")
    out = folded.take(kept, rows, in_host)
    out.scalars = schema.with_scalars(folded.scalars, next_row=next_row,
                                      newest_timestamp=folded.newest)
    out.free_rows = np.zeros(0, np.int32)
    out.lru_rows = np.zeros(0, np.int32) if tiered else None
    out.lru_ages = np.zeros(0, np.uint32) if tiered else None
    return out


def chunk_positions(column: np.ndarray, rows: int, test: Callable = lambda c: c >= 0
                    ) -> Iterator[np.ndarray]:
    """The positions where `test(column)` holds, in pieces of at most `rows`, the column
    scanned a block at a time (no array as long as the column is built)."""
    rows = max(rows, 1)
    found = (np.flatnonzero(test(np.asarray(column[begin:end]))) + begin
             for begin, end in stream.chunks_of(len(column), max(rows, 1 << 16)))
    yield from stream.rechunked(found, rows)


def any_of(column: np.ndarray, test: Callable) -> bool:
    """Whether `test(column)` holds anywhere, the column scanned a block at a time."""
    return any(bool(test(np.asarray(column[b:e])).any())
               for b, e in stream.chunks_of(len(column), 1 << 20))


class _Ordinals:
    """The positions of the nonzero entries of a column by their ordinal (the k-th
    nonzero), for reads in order: counts per block, no array of positions."""

    BLOCK = 1 << 16

    def __init__(self, column: np.ndarray):
        self._column = column
        blocks = -(-len(column) // self.BLOCK)
        self._before = np.zeros(blocks + 1, np.int64)
        for b in range(blocks):
            part = np.asarray(column[b * self.BLOCK:(b + 1) * self.BLOCK])
            self._before[b + 1] = self._before[b] + int(np.count_nonzero(part))

    def take(self, begin: int, n: int) -> np.ndarray:
        """The positions of nonzero entries begin, ..., begin + n - 1."""
        out = []
        b = int(np.searchsorted(self._before, begin, side="right")) - 1
        while n > 0 and b < len(self._before) - 1:
            part = np.asarray(self._column[b * self.BLOCK:(b + 1) * self.BLOCK])
            found = np.flatnonzero(part)[begin - self._before[b]:] + b * self.BLOCK
            found = found[:n]
            out.append(found)
            n -= len(found)
            begin += len(found)
            b += 1
        return np.concatenate(out) if out else np.zeros(0, np.int64)


# IDs whose values a restore's tier reader reads at a time within a chunk.
_READ_BLOCK = 1 << 14


def tier_reader(folded: Folded, names: List[str], dim: int) -> Callable:
    """The engine's import reader of the host tier's values: (begin, n) -> (present [n]
    uint32, values [n, len(names), dim] float32) of the in_host IDs begin..begin+n-1."""
    positions_of = _Ordinals(folded.in_host)

    def read(begin: int, n: int):
        positions = positions_of.take(begin, n)
        present = np.zeros(len(positions), np.uint32)
        values = np.zeros((len(positions), len(names), dim), np.float32)
        # The engine reads the chunk in `values` itself; each state's values are read into it
        # a block at a time, so that the temporaries of a read are a block's, not a chunk's.
        for b, e in stream.chunks_of(len(positions), _READ_BLOCK):
            for c, state in enumerate(names):
                values[b:e, c], held = folded.values(positions[b:e], state, dim)
                present[b:e] |= held.astype(np.uint32) << np.uint32(c)
        return present, values

    return read


__all__ = ["OpenVersion", "open_chain", "Folded", "fold", "table_files", "table_names",
           "whole_table", "admitted", "shard", "chunk_positions", "any_of", "tier_reader"]

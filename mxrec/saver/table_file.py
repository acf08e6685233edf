"""One table's part of a save and of a restore, in chunks of rows (`stream`).

A save (`Prepared`): the engine spools the table's records (and a host tier's values)
into local files a chunk of IDs at a time, under the table's lock, so they are the step
boundary's; the file is then written member by member from those files, the device rows
read from the variables a chunk at a time. A restore (`load`):
the fold's records go into the engine (the host tier's values read a chunk at a time from
the files), then the device rows are written into the variables a chunk at a time.

The layout of the file is `mxrec.saver.schema`'s, the same bytes `np.savez` would write.
"""

import os
import shutil
from typing import Dict, Iterator, List

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import storage_dtype
from mxrec.saver import finite, fold, schema, stream
from mxrec.saver.manifest import CheckpointError


class Prepared:
    """A table's export, ready to be written (`write`) or checked (`faults`).

    The engine streams the table's records (and a tiered table's host-tier values) into
    spool files a chunk of IDs at a time, under the table's lock, so that they are the
    step boundary's; the columns are then mapped from those files (`np.memmap`), so
    nothing of the export held in memory grows with the table: the page cache holds what
    is read, and the kernel reclaims it.

    Args:
        io_: the table's reader of rows (`checkpoint._TableIO` or `_DynamicTableIO`).
        since: the epoch a delta starts after; 0 for a full save.
        spool: a local folder for the spool files; removed by `close`.
        rows_per_chunk: rows read (and written) at a time.
    """

    def __init__(self, io_, since: int, spool: str, rows_per_chunk: int):
        self.io_ = io_
        self.rows_per_chunk = rows_per_chunk
        self.spool = spool
        os.makedirs(self.spool, exist_ok=True)
        self.tiered = getattr(io_.table, "host_vocabulary_size", 0) > 0
        self.host = loader.engine().export_state(
            io_.table.table_key, since, delta_chain=True, spool=self.spool,
            chunk_rows=rows_per_chunk)
        self.count = int(self.host["records"])
        # The records without a device row come first; those with one follow in row order.
        self.rowless = int(self.host["rowless"])
        columns = [("keys", np.int64), ("rows", np.int32), ("counts", np.float32),
                   ("last_seen", np.int64)]
        if self.tiered:
            columns.append(("in_host", np.uint8))
        self.columns = {name: self._spooled(f"{name}.bin", dtype, (self.count,))
                        for name, dtype in columns}
        self.device_rows = self.columns["rows"][self.rowless:]

    def close(self) -> None:
        """Removes the spool."""
        shutil.rmtree(self.spool, ignore_errors=True)

    @property
    def epoch(self) -> int:
        return int(self.host["epoch"])

    # ------------------------------------------------------------ the file's arrays

    def _device_chunks(self, session, state: str) -> Iterator[np.ndarray]:
        rows = self.device_rows
        for begin, end in stream.chunks_of(len(rows), self.rows_per_chunk):
            part = np.asarray(rows[begin:end], np.int32)
            yield storage_dtype.to_file(_read_state(self.io_, session, state, part),
                                        self._dtype(state))

    def _dtype(self, state: str):
        """The dtype `state`'s device rows rest in (mxrec.core.storage_dtype)."""
        variable = getattr(self.io_, "variables", {}).get(state)
        return storage_dtype.variable_dtype(variable) or tf.float32

    def _tier_count(self) -> int:
        return int(self.host.get("tier_spooled", 0))

    def _spooled(self, name: str, dtype, shape) -> np.ndarray:
        count = int(np.prod(shape))
        if count == 0:
            return np.zeros(shape, dtype)
        return np.memmap(os.path.join(self.spool, name), dtype=dtype, mode="r", shape=shape)

    def _tier_chunks(self, state: str, mask: bool, release: bool = False
                     ) -> Iterator[np.ndarray]:
        """A state's host-tier values (or its mask) from the spool, a chunk at a time; the
        values in the file form of the dtype the state rests in (the tier's float32 values
        of a half-precision state are exact in it). `release`: each chunk's bytes are freed
        in the spool file once consumed (the file is read once more by nothing), so that the
        spool and the checkpoint file together take the disk of about one copy of the tier,
        not two."""
        dtype = self._dtype(state)
        count, dim = self._tier_count(), self.io_.table.dim
        components = list(self.host["tier_components"])
        present = self._spooled("present.bin", np.uint32, (count,))
        c = components.index(state) if state in components else None
        values = (self._spooled(f"component-{c}.bin", np.float32, (count, dim))
                  if c is not None else None)
        row_bytes = dim * np.dtype(np.float32).itemsize
        for begin, end in stream.chunks_of(count, self.rows_per_chunk):
            if mask:
                yield (np.zeros(end - begin, np.uint8) if c is None else
                       ((np.asarray(present[begin:end]) >> np.uint32(c)) & 1).astype(np.uint8))
            elif values is None:  # never swapped out: restarts from its initial value
                yield np.zeros((end - begin, dim), storage_dtype.file_dtype(dtype))
            else:
                yield storage_dtype.to_file(np.asarray(values[begin:end]), dtype)
                if release:
                    stream.release_range(os.path.join(self.spool, f"component-{c}.bin"),
                                         begin * row_bytes, (end - begin) * row_bytes)

    def _tier_ids(self) -> Iterator[np.ndarray]:
        """The IDs of the host tier's values, in their order, a chunk at a time."""
        keys, in_host = self.columns["keys"], self.columns["in_host"]
        for begin, end in stream.chunks_of(self.count, self.rows_per_chunk):
            yield np.asarray(keys[begin:end])[np.asarray(in_host[begin:end]) != 0]

    def members(self, session, release: bool = False) -> List[stream.Member]:
        """The file's arrays in the order `np.savez` of the whole dict wrote them;
        `release`: the spool's tier values are freed as they are written (`_tier_chunks`)."""
        host, dim, columns = self.host, self.io_.table.dim, self.columns
        out = [stream.whole(schema.host_key(k), columns[k] if k in columns else host[k],
                            self.rows_per_chunk) for k in schema.HOST_ARRAYS]
        out.append(stream.whole(schema.SCALARS_KEY, schema.pack_scalars(host)))
        out.append(stream.whole(schema.ACCESS_THRESHOLD_KEY,
                                np.array(host["access_threshold"], np.float64)))
        for state in self.io_.state_names():
            out.append(stream.Member(schema.state_key(state),
                                     storage_dtype.file_dtype(self._dtype(state)),
                                     (len(self.device_rows), dim),
                                     lambda s=state: self._device_chunks(session, s)))
        if not self.tiered:
            return out
        out.append(stream.whole(schema.host_key("in_host"), columns["in_host"],
                                self.rows_per_chunk))
        out.append(stream.whole(schema.host_key("lru_rows"), host["lru_rows"]))
        out.append(stream.whole(schema.host_key("lru_ages"), host["lru_ages"]))
        count = self._tier_count()
        for state in self.io_.state_names():
            out.append(stream.Member(schema.tier_key(state),
                                     storage_dtype.file_dtype(self._dtype(state)), (count, dim),
                                     lambda s=state: self._tier_chunks(s, False, release)))
            out.append(stream.Member(schema.tier_mask_key(state), np.uint8, (count,),
                                     lambda s=state: self._tier_chunks(s, mask=True)))
        return out

    def write(self, session, path: str) -> Dict:
        """Writes the file at `path`; returns its manifest entry."""
        return stream.write_npz(path, self.members(session, release=True))

    def faults(self, session) -> List[finite.Fault]:
        """The non-finite values the file would hold (device rows keyed by the admitted IDs,
        host-tier rows by the tier's IDs), read a chunk at a time."""
        name = self.io_.table.table_name
        device_ids = self.columns["keys"][self.rowless:]
        found: List[finite.Fault] = []
        for state in self.io_.state_names():
            ids = (np.asarray(device_ids[b:e]) for b, e in
                   stream.chunks_of(len(device_ids), self.rows_per_chunk))
            # as values: a bfloat16 state's file form is its bits (uint16)
            values = (storage_dtype.from_file(c) for c in self._device_chunks(session, state))
            found += _merged(name, state, ids, values)
            if self.tiered:
                ids = stream.rechunked(self._tier_ids(), self.rows_per_chunk)
                tier = (storage_dtype.from_file(c) for c in self._tier_chunks(state, mask=False))
                found += _merged(name, f"host/SSD tier {state}", ids, tier)
        return found


def _read_state(io_, session, state: str, rows: np.ndarray) -> np.ndarray:
    """One state's rows through the reader's `read_state`, or its `read_rows` (a reader that
    reads every state at once: mxrec.keras')."""
    read_state = getattr(io_, "read_state", None)
    if read_state is not None:
        return read_state(session, state, rows)
    return io_.read_rows(session, rows)[state]


def _merged(table: str, state: str, ids: Iterator[np.ndarray],
            chunks: Iterator[np.ndarray]) -> List[finite.Fault]:
    """One fault of a state checked a chunk at a time (`ids` and `chunks` in step): the
    counts summed, the first example kept."""
    total, example = 0, None
    for part, chunk in zip(ids, chunks):
        for fault in finite.table_faults(table, state, part, chunk):
            total += fault.count
            example = example or fault
    if example is None:
        return []
    return [example._replace(count=total)]


def load(session, io_, folded: fold.Folded, rows_per_chunk: int,
         missing_states: str = "error") -> None:
    """Imports a folded table into its host table, then writes its device rows.

    missing_states: what a state of the table (an optimizer slot) that the checkpoint lacks
        gets: "error" (CheckpointError), or "keep" (the rows keep their current values).
    """
    name, dim = io_.table.table_name, io_.table.dim
    missing = [n for n in io_.state_names() if n not in folded.state_names]
    if missing and missing_states == "error" and fold.any_of(folded.rows, lambda c: c >= 0):
        raise CheckpointError(f"table {name!r}: the checkpoint has no {missing}; "
                              "was it saved with another optimizer?")
    _import_records(io_, folded, rows_per_chunk)
    for positions in fold.chunk_positions(folded.rows, rows_per_chunk):
        rows = folded.rows[positions]
        written = {}
        for state in io_.state_names():
            if state in missing:
                continue
            written[state], held = folded.values(positions, state, dim)
            if not held.all():
                raise CheckpointError(f"checkpoint holds no {state!r} value of ID "
                                      f"{int(folded.keys[positions[np.argmin(held)]])}")
        if missing and io_.variables_in_graph:
            current = io_.read_rows(session, rows)
            written.update({state: current[state] for state in missing})
        io_.write_rows(session, rows, written)


def _import_records(io_, folded: fold.Folded, rows_per_chunk: int) -> None:
    """The engine's import of the records (and the host tier's values, in chunks)."""
    tier_args = {}
    if fold.any_of(folded.in_host, lambda c: c != 0) or folded.lru_rows is not None:
        names = folded.tier_state_names()
        tier_args = dict(
            in_host=folded.in_host,
            lru_rows=folded.lru_rows if folded.lru_rows is not None else np.zeros(0, np.int32),
            lru_ages=folded.lru_ages if folded.lru_ages is not None else np.zeros(0, np.uint32),
            tier_components=names,
            tier_reader=fold.tier_reader(folded, names, io_.table.dim),
            chunk_rows=rows_per_chunk)
    scalars = folded.scalars
    loader.engine().import_state(
        io_.table.table_key, keys=folded.keys, rows=folded.rows, counts=folded.counts,
        last_seen=folded.last_seen, free_rows=folded.free_rows,
        next_row=schema.scalar(scalars, "next_row"),
        newest_timestamp=schema.scalar(scalars, "newest_timestamp"),
        counting_frozen=bool(schema.scalar(scalars, "counting_frozen")),
        access_threshold=folded.access_threshold, **tier_args)

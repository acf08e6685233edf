"""Full and delta checkpoints of mxrec models, atomic and verified.

Layout of a checkpoint directory (any filesystem tf.io.gfile knows):

    <dir>/full-000000001000/            a full save at step 1000
        manifest.json                   written last: step, kind, chain, files, sha256s
        dense.npz                       every dense variable (and optimizer non-slot state)
        table-000.npz ...               one per mxrec table: host arrays, rows, slot rows
    <dir>/delta-000000001100/           a delta: IDs changed or removed since the last save
        ...
    <dir>/.tmp-...                      a save in progress; never read

A full save holds every tracked ID of every table (row, admission count,
last-seen time), the device rows of admitted IDs and their optimizer slots,
and all dense variables. A delta holds the same for the IDs changed since the
previous save (full or delta), the IDs removed since then, and all dense
variables. A save is written into a `.tmp-` folder and made visible by one
rename, so a process killed mid-save leaves the earlier versions as they
were. Restore loads a full save and applies its deltas in order, after
checking every file's size and SHA-256 against the manifest and that each
delta's predecessor exists. With `check_finite`, a save whose values (any array it
would write) hold a NaN or an infinity is refused before anything is written
(`NonFiniteError`, `mxrec.saver.finite`).

Tables with a host (and SSD) tier (host_vocabulary_size > 0): every ID's row is
saved wherever it lives. A table file then also holds `host/in_host` (1 where
the ID's row is in host memory or on disk; its `host/rows` entry is -1),
`host/lru_rows` / `host/lru_ages` (the device cache's rows, least recently used
first, and their ages in batches, so that swap victims are chosen as if training
never stopped), and per state (embedding, each optimizer slot) `tier/<state>`
(values of the in_host IDs, in their order in `host/keys`) with `tier_mask/<state>`
(0 where the tier held no value: it restarts from the initializer). `state/<state>`
still holds the device rows only. A delta holds the IDs trained or moved between
tiers since the previous save. Restore puts every ID back in the tier it was
saved in (the host tier's rows into host memory, spilling to a fresh SSD file
beyond host_vocabulary_size), with the same device rows and cache order.
Batches planned by the key stage and not yet trained (the graph modifier's
prefetched batches) have moved IDs between the device cache and the host tier
in the host state but not yet their values: a save then records where the
values are (residency as before those plans; their counts and new IDs are
undone, as for device-only tables: a save is the state at the step boundary).
Restore before the iterator initializer runs: a restore drops the batches planned
against the state it replaces.

Several ranks: each rank writes `table-XXX-rankRRRRR.npz` with the IDs it owns, rank 0
writes `dense.npz` and, after every rank's files are in, the manifest (`"ranks": N`, each
table's `"files"` per rank). Restored on N ranks, each takes back its file; on another
count, every rank folds all files and keeps the IDs it owns there (`fold.shard`; a
table replicated on every rank, is_dp=True, keeps them all). WarmStart, the serving export and
`sparse.export` read such a directory as it is: every rank's files fold into the whole table
(`fold.whole_table`).

Tables are written and read a chunk of rows at a time (`checkpoint_memory_mb`): a save
streams each file (`mxrec.saver.table_file`, `mxrec.saver.stream`), a restore maps the
verified files and reads one full file in place, or folds a chain as columns
(`mxrec.saver.fold`).

This module holds the Saver (reading and writing rows) and save_persistables; the
directory's files are `mxrec.saver.manifest`, which versions a restore reads is
`mxrec.saver.merge.chain`. The timer that saves, `IncrementalCheckpointHook`, is a hook
(`mxrec.hooks.incremental_checkpoint`).

Example:
    >>> saver = Saver("/data/ckpt")
    >>> saver.save(sess, step=100)                  # full
    >>> saver.save(sess, step=110, kind="delta")    # only what changed since step 100
    >>> Saver("/data/ckpt").restore(sess)            # full@100 + delta@110
"""

import functools
import os
import posixpath
import tempfile
import time
import warnings
from concurrent import futures
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from mxrec._lib import loader
from mxrec.core import dynamic, storage_dtype, wing
from mxrec.core.graph_state import graph_state
from mxrec.core.table import graph_tables
from mxrec.saver import finite, fold, schema, stream, table_file
from mxrec.saver import manifest as manifest_io
from mxrec.saver.finite import NonFiniteError  # noqa: F401 (re-exported)
from mxrec.saver.manifest import (  # noqa: F401 (CheckpointError, FORMAT_VERSION: re-exported)
    FORMAT_VERSION,
    CheckpointError,
    npz_bytes,
    version_name,
)
from mxrec.util import durable, ranks
from mxrec.util.config import get_config_initializer


def load_variable(session, variable, value):
    """Writes a whole variable through its initializer's feed: no new op, so it works on a
    finalized graph."""
    initializer = variable.initializer
    session.run(initializer, {initializer.inputs[1]: value})


class _TableIO:
    """Reads and writes one table's rows and slot rows (device variables).

    It builds its gather and scatter ops when the graph still takes ops; on a
    finalized graph it reads whole variables through their own read ops and
    writes them through their initializers' feeds instead.
    """

    variables_in_graph = True

    def __init__(self, table):
        self.table = table
        self.slots: Dict[str, tf.Variable] = {}
        for optimizer in table.optimizers:
            for slot_name in optimizer.get_slot_names():
                slot = optimizer.get_slot(table.variable, slot_name)
                if slot is not None:
                    self.slots[f"{optimizer.get_name()}/{slot_name}"] = slot
        self.variables = {"embedding": table.variable, **self.slots}
        self.rows = None
        if not table.variable.graph.finalized:
            self._build_ops()

    def _build_ops(self):
        with tf.name_scope(f"mxrec_checkpoint/{self.table.table_name}"):
            self.rows = tf.compat.v1.placeholder(tf.int32, [None], name="rows")
            self.read = {name: tf.gather(var, self.rows) for name, var in self.variables.items()}
            self.values = {name: tf.compat.v1.placeholder(var.dtype.base_dtype,
                                                          [None, self.table.dim])
                           for name, var in self.variables.items()}
            self.write = tf.group(*[
                var.scatter_update(tf.IndexedSlices(self.values[name], self.rows))
                for name, var in self.variables.items()])

    def state_names(self) -> List[str]:
        return ["embedding", *self.slots]

    def read_rows(self, session, rows: np.ndarray) -> Dict[str, np.ndarray]:
        if self.rows is None:
            full = session.run(self.variables)
            return {name: value[rows] for name, value in full.items()}
        return session.run(self.read, {self.rows: rows})

    def read_state(self, session, name: str, rows: np.ndarray) -> np.ndarray:
        """The rows `rows` of one state (the embedding or a slot)."""
        if self.rows is None:  # a finalized graph: the whole variable, through its read op
            return session.run(self.variables[name])[rows]
        return session.run(self.read[name], {self.rows: rows})

    def write_rows(self, session, rows: np.ndarray, values: Dict[str, np.ndarray]):
        if self.rows is None:
            full = session.run(self.variables)
            for name, variable in self.variables.items():
                full[name][rows] = values[name]
                load_variable(session, variable, full[name])
            return
        feed = {self.rows: rows}
        feed.update({self.values[name]: value for name, value in values.items()})
        session.run(self.write, feed)


class _DynamicTableIO:
    """The same for a table of init(use_dynamic_expansion=True), whose rows and slots
    live in the engine's dynamic store at the rows' addresses."""

    variables_in_graph = False

    def __init__(self, table):
        self.table = table
        self.slots: Dict[str, float] = {}  # store slot -> initial value
        for optimizer in table.optimizers:
            for slot in optimizer.get_slot_names():
                self.slots[optimizer.store_slot(slot)] = optimizer.slot_initial_value(slot)

    def state_names(self) -> List[str]:
        return ["embedding", *self.slots]

    def read_rows(self, session, rows: np.ndarray) -> Dict[str, np.ndarray]:
        del session
        engine = loader.engine()
        existing = set(engine.dynamic_store_stats(self.table.table_key)["slot_names"])
        addresses = rows.astype(np.int64)
        values = {"embedding": engine.dynamic_store_read(self.table.table_key, addresses, "")}
        for slot, initial in self.slots.items():
            if slot in existing:
                values[slot] = engine.dynamic_store_read(self.table.table_key, addresses, slot)
            else:  # the optimizer has not run yet: every row is at its initial value
                values[slot] = np.full((len(rows), self.table.dim), initial, np.float32)
        return values

    def read_state(self, session, name: str, rows: np.ndarray) -> np.ndarray:
        """The rows `rows` of one state (the embedding or a store slot)."""
        return self.read_rows(session, rows)[name]

    def write_rows(self, session, rows: np.ndarray, values: Dict[str, np.ndarray]):
        del session
        dynamic.write_rows(self.table, rows, values["embedding"])
        for slot, initial in self.slots.items():
            if slot in values:  # else the store gives the rows the slot's initial value
                dynamic.write_rows(self.table, rows, values[slot], slot=slot, initial=initial)


class Saver:
    """Writes and reads full and delta checkpoints of the tables of the current init().

    The tables are those built in the default graph at construction; a table of the
    init() built only in another graph is named in a warning (UserWarning and log),
    since the checkpoints of this Saver cannot hold it. On a finalized graph the Saver
    adds no ops: it reads and writes whole variables through their own ops.

    Args:
        directory: where versions live.
        max_to_keep: full versions kept (with their deltas); older ones are deleted
            after a successful full save (by rank 0 on several ranks). None keeps all.
        check_finite: the default of `save`'s check_finite: refuse (NonFiniteError) to
            save a model holding a NaN or an infinity.
        checkpoint_memory_mb: the memory (MiB) a save or restore may add for the tables'
            rows: they go through each table a chunk of rows at a time, tier by tier
            (device rows, host tier, SSD file), however large the table. Beyond it, a
            table's records are held as columns (docs/CHECKPOINTS.md).
            A value below what one chunk of a table needs is refused (ValueError).

    Constructing a Saver (rank 0) removes the `.tmp-` folders that saves killed mid-way
    left in `directory` (`manifest.remove_stale_temporaries`: only those whose writer is
    gone; a save in progress in another process is left alone).

    A save holds the tables as at the step boundary: batches the graph modifier
    planned ahead of their step are not in it (the engine undoes them in the
    snapshot), and their IDs count as changed for the next delta.
    """

    # A subclass that builds its own state (mxrec.keras' KerasSaver) saves unchecked by default,
    # within the default memory budget.
    check_finite = False
    memory_mb = stream.DEFAULT_MEMORY_MB

    def __init__(self, directory: str, max_to_keep: Optional[int] = 5,
                 check_finite: bool = False,
                 checkpoint_memory_mb: int = stream.DEFAULT_MEMORY_MB):
        runtime = get_config_initializer()
        self.memory_mb = stream.check_memory_mb("Saver", checkpoint_memory_mb)
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"Saver: max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.check_finite = check_flag("Saver", check_finite)
        self.directory = directory
        self.max_to_keep = max_to_keep
        graph = tf.compat.v1.get_default_graph()
        self._tables = []
        in_graph = graph_tables(graph)
        for name in sorted(runtime.tables):
            table = in_graph.get(name)
            if table is None or table.table_key != runtime.table_key(name):
                continue
            self._tables.append(table_io(table))
        for io_ in self._tables:
            stream.check_fits("Saver", self.memory_mb, io_.table.table_name, io_.table.dim,
                              len(io_.state_names()))
        elsewhere = sorted(set(runtime.tables) - {io_.table.table_name for io_ in self._tables})
        if elsewhere:
            message = (f"mxrec Saver({directory!r}): table(s) {elsewhere} of this init() were "
                       "built in another graph, not in this one; the checkpoints this Saver "
                       "writes do not hold them and its restores leave them as they are. Build "
                       "the Saver in the graph that has every table")
            logging.warning(message)
            warnings.warn(message, UserWarning, stacklevel=2)
        variable_tables = [t for t in self._tables if t.variables_in_graph]
        sparse = {t.table.variable.ref() for t in variable_tables}
        sparse |= {slot.ref() for t in variable_tables for slot in t.slots.values()}
        # Several ranks: GLOBAL_VARIABLES also holds the tables' saveables (sharded_state).
        self._dense = [v for v in tf.compat.v1.global_variables()
                       if isinstance(v, tf.Variable) and v.ref() not in sparse]
        self._dense_feeds = None
        if not graph.finalized:
            with tf.name_scope("mxrec_checkpoint/dense"):
                self._dense_feeds = [tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape)
                                     for v in self._dense]
                self._dense_assign = tf.group(*[v.assign(feed) for v, feed in
                                                zip(self._dense, self._dense_feeds)])
        self._last_epochs: Optional[Dict[str, int]] = None
        self._last_step: Optional[int] = None
        self._last_full: Optional[int] = None
        # Several ranks: each saves the shard it owns of every table into one version.
        self._rank, self._size = ranks.get_rank_id(), ranks.get_rank_size()
        self._barrier = wing.current().checkpoint_barrier(graph)
        # The first save on several ranks checks that every rank sees the folder rank 0
        # writes (mxrec.util.shared_dirs): the first moment a collective runs with it known.
        self._folder_checked = False
        if self._rank == 0:  # folders of saves (and deletions) killed mid-way
            for name in manifest_io.remove_stale_temporaries(directory):
                logging.info("mxrec checkpoint: removed %s/%s, left by a save that died",
                             directory, name)

    def _sum_over_ranks(self, session, value: int) -> int:
        """The sum of `value` over the ranks, once every rank has called it (with its own).

        The ranks' barrier sums one int32 per rank, a constant 1: each rank feeds 1 + its
        value instead, so the sum is the rank count plus the values' sum.
        """
        total = int(session.run(self._barrier, {_barrier_input(self._barrier): 1 + value}))
        if total < self._size:
            raise CheckpointError(f"mxrec Saver: the ranks' barrier counted {total} of "
                                  f"{self._size} ranks")
        return total - self._size

    def _ranks_at_fault(self, session, at_fault: bool) -> int:
        """How many ranks (this one included) found a fault; every rank calls it together."""
        if self._size == 1:
            return int(at_fault)
        return self._sum_over_ranks(session, int(at_fault))

    @property
    def last_step(self) -> Optional[int]:
        """The step of this Saver's last save or restore; None before either."""
        return self._last_step

    # ----------------------------------------------------------------- saving

    def save(self, session, step: int, kind: str = "full",
             check_finite: Optional[bool] = None) -> str:
        """Writes a version; returns its path. kind: "full" or "delta".

        A delta needs an earlier save by this Saver (or a restore) to be based on.

        Args:
            check_finite: check, before anything is written, that every value the version
                would hold (dense variables; the rows and optimizer slots of the table IDs
                it holds, in every tier) is finite. None: the Saver's `check_finite`. Pass
                the same on every rank.

        Raises:
            NonFiniteError: with the check on, a value is NaN or infinite (on several ranks
                every rank raises). Nothing is written and the next delta holds what it
                would have held without this call.
            NotSharedError: several ranks' first save, when a rank does not see the folder
                rank 0 made in `directory` (not one shared filesystem; every rank raises,
                nothing is saved).
        """
        if kind not in ("full", "delta"):
            raise ValueError(f"Saver.save: kind must be 'full' or 'delta', got {kind!r}")
        if kind == "delta" and self._last_epochs is None:
            raise CheckpointError("Saver.save(kind='delta') needs a full save (or a restore) "
                                  "first: a delta holds only what changed since the last save")
        check = self.check_finite if check_finite is None else check_flag("Saver.save",
                                                                           check_finite)
        step = int(step)
        prepared = []
        try:
            return self._save_prepared(session, step, kind, check, prepared)
        finally:
            for table in prepared:
                table.close()

    def _save_prepared(self, session, step: int, kind: str, check: bool,
                       prepared: List[table_file.Prepared]) -> str:
        """save()'s work; `prepared` gets each table's export (their spools removed by the
        caller)."""
        files, digests, tables_meta, epochs, faults = self._build_files(session, kind, check,
                                                                        prepared)
        if check:
            # Before anything is written; the epochs the export closed are not kept, so the
            # next delta still holds every ID changed since the last save that was written.
            self._refuse_non_finite(session, faults, step, kind)
        manifest = {
            "format": FORMAT_VERSION,
            "kind": kind,
            "step": step,
            "base": step if kind == "full" else self._last_full,
            "previous": None if kind == "full" else self._last_step,
            "time": time.time(),
            "tables": tables_meta,
            "files": digests,
        }
        if self._size == 1:
            path = self._write_atomically(version_name(kind, step), files, manifest)
        else:
            path = manifest_io.write_version_sharded(
                self.directory, version_name(kind, step), files, manifest, self._rank,
                self._size, functools.partial(self._sum_over_ranks, session),
                check_shared=not self._folder_checked)
            self._folder_checked = True
        self._saved(kind, step, epochs)
        logging.info("mxrec checkpoint: wrote %s", path)
        return path

    def _build_files(self, session, kind: str, check: bool,
                     prepared: List[table_file.Prepared]):
        """(files: bytes or writers, their digests where known, the manifest's tables, each
        table's epoch, non-finite faults when `check`) of a save, nothing written yet."""
        # Each table's export (its engine state, its host tier spooled, the finiteness
        # check) runs on a thread of its own: the engine's export and the session's reads
        # run without the GIL, so tables overlap. The engine's state is at the step
        # boundary whichever table is first. The files are written later, a chunk at a
        # time (table_file.Prepared.write).
        jobs = [functools.partial(self._table_file, session, index, io_, kind, check, prepared)
                for index, io_ in enumerate(self._tables)]
        jobs.append(functools.partial(self._dense_file, session, check))
        built = _run_jobs(jobs, parallel=session is not None)
        files: Dict[str, bytes] = {}
        digests: Dict[str, Dict] = {}
        tables_meta = {}
        epochs = {}
        faults: List[finite.Fault] = []
        for io_, (file_name, data, meta, epoch, table_faults) in zip(self._tables, built[:-1]):
            files[file_name] = data
            tables_meta[io_.table.table_name] = meta
            epochs[io_.table.table_name] = epoch
            faults += table_faults
        if self._rank == 0:  # dense variables are the same on every rank
            files["dense.npz"], digests["dense.npz"], dense_faults = built[-1]
            faults += dense_faults
        return files, digests, tables_meta, epochs, faults

    def _saved(self, kind: str, step: int, epochs: Dict[str, int]) -> None:
        """The Saver's state after a version is written: the next delta starts from it."""
        self._last_epochs = epochs
        self._last_step = step
        # Removals this version holds are done with.
        engine = loader.engine()
        for io_ in self._tables:
            engine.prune_removed_log(io_.table.table_key, epochs[io_.table.table_name])
        if kind == "full":
            self._last_full = step
            if self._rank == 0:  # one process deletes, once every rank's files are in place
                self._delete_old_versions()

    def _refuse_non_finite(self, session, faults: List[finite.Fault], step: int,
                           kind: str) -> None:
        """Raises NonFiniteError on every rank when any rank found `faults`."""
        at_fault = self._ranks_at_fault(session, bool(faults))
        if not at_fault:
            return
        refusing = f"Saver.save: step {step} ({kind}) into {self.directory}"
        if self._size > 1:
            refusing += f" (rank {self._rank}; {at_fault} of {self._size} ranks found faults)"
        if not faults:
            raise NonFiniteError(f"{refusing}: refused, nothing written: another rank found "
                                 "non-finite values (its error names them)")
        logging.error("mxrec checkpoint: %s: not finite: %s", refusing, finite.describe(faults))
        finite.raise_if_any(faults, refusing)

    def _table_file(self, session, index: int, io_, kind: str, check: bool,
                    prepared: List[table_file.Prepared]):
        """(file name, its writer, manifest entry, epoch, non-finite faults when `check`) of
        one table's part of a save; the export is appended to `prepared`."""
        table = io_.table
        since = 0 if kind == "full" else self._last_epochs.get(table.table_name, 0)
        rows = stream.chunk_rows(self.memory_mb, table.dim, len(io_.state_names()))
        export = table_file.Prepared(io_, since, self._spool_folder(index), rows)
        prepared.append(export)
        host = export.host
        file_name = (f"table-{index:03d}.npz" if self._size == 1
                     else f"table-{index:03d}-rank{self._rank:05d}.npz")
        meta = {"file": file_name, "dim": table.dim, "ids": export.count,
                "removed": int(len(host["removed"])), "state": io_.state_names()}
        faults = export.faults(session) if check else []
        return (file_name, functools.partial(export.write, session), meta, export.epoch,
                faults)

    def _spool_folder(self, index: int) -> str:
        """A local folder for a tiered table's host-tier values during a save: a temporary
        of the checkpoint directory (a stale one is removed as any other), or of the
        system's temporary folder where the directory is not local."""
        local = durable.local_path(self.directory)
        if local is None:
            return tempfile.mkdtemp(prefix=f"mxrec-spool-{index:03d}-")
        os.makedirs(local, exist_ok=True)
        return os.path.join(local, manifest_io.temporary_name(f"spool-{index:03d}"))

    def _dense_file(self, session, check: bool = False
                    ) -> Optional[Tuple[bytes, Dict, List[finite.Fault]]]:
        """dense.npz, its digest and (when `check`) its non-finite faults on rank 0; None
        on the others (the dense variables are the same on every rank)."""
        if self._rank != 0:
            return None
        dense = self._read_dense(session)
        faults = [fault for name in sorted(dense) if check
                  for fault in finite.dense_faults(name, dense[name])]
        data = npz_bytes(dense)
        return data, manifest_io.file_entry(data), faults

    def _write_atomically(self, name: str, files: Dict[str, bytes], manifest: Dict) -> str:
        return manifest_io.write_version(self.directory, name, files, manifest)

    def _delete_old_versions(self):
        manifest_io.delete_old_versions(self.directory, self.max_to_keep)

    # ---------------------------------------------------------------- reading

    def versions(self) -> List[Tuple[str, int]]:
        """(kind, step) of every complete version, by step."""
        return manifest_io.list_versions(self.directory)

    def _read_version(self, kind: str, step: int):
        return manifest_io.read_version(self.directory, kind, step)

    def restore(self, session, version: Optional[int] = None) -> int:
        """Loads the latest version, or the one saved at step `version`; returns its step.

        Every file of the chain is checked (size, SHA-256) before anything is loaded; the
        tables are then read a chunk of rows at a time (`checkpoint_memory_mb`).

        Raises:
            CheckpointError: nothing to restore, a broken chain, or a bad file, named.
        """
        copies = stream.LocalCopies()
        try:
            versions = fold.open_chain(self.directory, version, copies)
            same_ranks = all(v.manifest.get("ranks", 1) == self._size for v in versions)
            tables = {}
            for io_ in self._tables:
                tables[io_.table.table_name] = self._folded(io_, versions, same_ranks)
            self._load_into_graph(session, tables, versions[-1].dense)
        finally:
            copies.close()
        epochs = {}
        engine = loader.engine()
        for io_ in self._tables:
            # Close an epoch, so that the next delta holds only later changes (and the
            # removals of restored IDs): an export of no ID (none changed after the last
            # epoch there can be) closes it without copying the table.
            epochs[io_.table.table_name] = int(engine.export_state(
                io_.table.table_key, _NO_EPOCH, delta_chain=True)["epoch"])
        chain = [(v.kind, v.manifest["step"]) for v in versions]
        self._last_epochs = epochs
        self._last_step = versions[-1].manifest["step"]
        self._last_full = chain[0][1]
        logging.info("mxrec checkpoint: restored step %d from %s", self._last_step, chain)
        return self._last_step

    def _folded(self, io_, versions: List["fold.OpenVersion"], same_ranks: bool
                ) -> "fold.Folded":
        return folded_table(io_.table, versions, self._rank, self._size, same_ranks,
                            self.directory)

    def serving_delta(self, step: int) -> Dict[str, Dict[str, np.ndarray]]:
        """The delta saved at `step` in the form `mxrec.export.saved_model.apply_delta` takes:
        {table: {"ids", "embeddings", "removed"}} (admitted IDs changed since the save
        before it, and the IDs removed since then); a delta written by N ranks gives the
        whole table's (each rank's file holds the IDs it owned)."""
        return serving_delta(self.directory, step)

    def _load_into_graph(self, session, tables: Dict[str, "fold.Folded"], dense):
        for io_ in self._tables:
            rows = stream.chunk_rows(self.memory_mb, io_.table.dim, len(io_.state_names()))
            table_file.load(session, io_, tables[io_.table.table_name], rows)
        self._load_dense(session, dense)

    def _read_dense(self, session) -> Dict[str, np.ndarray]:
        """{name in dense.npz: value} of the dense variables (a subclass's own variables:
        mxrec.keras)."""
        return {v.op.name: value for v, value in zip(self._dense, session.run(self._dense))}

    def _load_dense(self, session, dense: Dict[str, np.ndarray]) -> None:
        missing = [v.op.name for v in self._dense if v.op.name not in dense]
        if missing:
            raise CheckpointError(f"dense variable {missing[0]!r} is not in the checkpoint in "
                                  f"{self.directory}")
        if self._dense_feeds is None:  # built on a finalized graph
            for variable in self._dense:
                load_variable(session, variable, dense[variable.op.name])
            return
        session.run(self._dense_assign, {placeholder: dense[variable.op.name] for
                                         variable, placeholder in zip(self._dense,
                                                                      self._dense_feeds)})


# An epoch no save reaches: an export since it holds no ID and only closes an epoch.
_NO_EPOCH = 2**32 - 1


def folded_table(table, versions: List["fold.OpenVersion"], rank: int, size: int,
                 own_files: bool, directory: str) -> "fold.Folded":
    """A table's state at a chain's end for `rank` of `size`: that rank's own files
    (`own_files`: as many ranks saved it), or every rank's files with the IDs the rank owns
    now, rows given anew (`fold.shard`: a tiered table takes its IDs into the host tier, a
    dynamic table's store grows to any count).

    Raises:
        CheckpointError: the table is not in the chain, or its files are damaged.
    """
    name = table.table_name
    files, where = fold.table_files(versions, name, rank if own_files else None)
    if not files:
        raise CheckpointError(f"table {name!r} is not in the checkpoint in {directory}")
    folded = fold.fold(files, name, where)
    if own_files:
        return folded
    capacity = (dynamic.HOST_CAPACITY if isinstance(table, dynamic.DynamicTable)
                else table.device_vocabulary_size)
    return fold.shard(folded, lambda keys: wing.current().owned(table, keys, rank, size),
                      tiered=getattr(table, "host_vocabulary_size", 0) > 0, capacity=capacity)


def check_flag(where: str, value) -> bool:
    """`value` as a bool, or TypeError naming `where` unless it is True or False."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: check_finite must be True or False, got {value!r}")
    return bool(value)


def _barrier_input(barrier: tf.Tensor) -> tf.Tensor:
    """The scalar the ranks' barrier sums (its all-reduce's source), fed to vote with it."""
    op = barrier.op
    while op.inputs:  # the all-reduce (and a stop_gradient over it) take one input
        op = op.inputs[0].op
    source = op.outputs[0]
    if source.dtype != tf.int32 or source.shape.rank != 0:
        raise CheckpointError(f"mxrec Saver: the ranks' barrier sums {source!r}, not an int32 "
                              "scalar: the ranks cannot agree on a save's finiteness")
    return source


def table_io(table):
    """The reader and writer of a table's rows and slot rows (device variables, or the
    dynamic store)."""
    return _DynamicTableIO(table) if isinstance(table, dynamic.DynamicTable) else _TableIO(table)


def serving_delta(directory: str, step: int) -> Dict[str, Dict[str, np.ndarray]]:
    """`Saver.serving_delta` of the delta saved at `step` in `directory`: its files verified,
    then mapped (only the embeddings are read, not the slots)."""
    copies = stream.LocalCopies()
    try:
        return _serving_delta(directory, int(step), copies)
    finally:
        copies.close()


def _serving_delta(directory: str, step: int, copies: stream.LocalCopies
                   ) -> Dict[str, Dict[str, np.ndarray]]:
    manifest = manifest_io.read_manifest(directory, "delta", step)
    folder = posixpath.join(directory, version_name("delta", step))
    for file_name, expect in sorted(manifest["files"].items()):
        stream.verify(posixpath.join(folder, file_name), expect)
    delta = {}
    for name in manifest["tables"]:
        ids, embeddings, removed = [], [], []
        for file_name in manifest_io.table_files(manifest, name):
            table_arrays = stream.MappedNpz(copies.local(posixpath.join(folder, file_name)))
            admitted = table_arrays[schema.host_key("rows")] >= 0
            ids.append(table_arrays[schema.host_key("keys")][admitted])
            embeddings.append(storage_dtype.from_file(
                table_arrays[schema.state_key("embedding")]))
            if schema.host_key("in_host") in table_arrays:  # host-tier rows are rows too
                in_host = table_arrays[schema.host_key("in_host")].astype(bool)
                ids.append(table_arrays[schema.host_key("keys")][in_host])
                embeddings.append(storage_dtype.from_file(
                    table_arrays[schema.tier_key("embedding")]))
            removed.append(table_arrays[schema.host_key("removed")])
        # Each ID once: the ranks of a replicated table (is_dp=True) all wrote it.
        ids, first = np.unique(np.concatenate(ids), return_index=True)
        # An ID removed and admitted again since the last save is a change.
        delta[name] = {"ids": ids, "embeddings": np.concatenate(embeddings)[first],
                       "removed": np.setdiff1d(np.concatenate(removed), ids)}
    return delta


# Threads that build a save's files (tables and dense.npz) at once.
SAVE_THREADS = 4


def _run_jobs(jobs: List, parallel: bool) -> List:
    """[job() for job in jobs], on up to SAVE_THREADS threads when `parallel` (graph
    sessions are thread-safe; eager reads stay on the caller's thread). The first
    failure, in job order, is raised."""
    threads = min(len(jobs), SAVE_THREADS)
    if not parallel or threads <= 1:
        return [job() for job in jobs]
    with futures.ThreadPoolExecutor(max_workers=threads,
                                    thread_name_prefix="mxrec_save") as pool:
        pending = [pool.submit(job) for job in jobs]
        return [future.result() for future in pending]


def save_persistables(session, dirname: str, mode: int = 0, step: Optional[int] = None,
                      saver: Optional[Saver] = None, check_finite: Optional[bool] = None) -> str:
    """PaddlePaddle-style save: mode 0 = full, 1 = base (a full save that starts a new
    delta chain), 2 = delta since the last save.

    Without `saver`, one Saver per (session graph, init(), directory) is made at the first
    call and reused, so deltas follow the previous save and no call after the first adds
    ops; the graph may be finalized.

    Args:
        step: the version's step; the graph's global step when None.
        check_finite: refuse (NonFiniteError) a model holding a NaN or an infinity;
            None: the Saver's setting (off for the Saver made here).
    """
    if mode not in (0, 1, 2):
        raise ValueError(f"save_persistables: mode must be 0 (full), 1 (base) or 2 (delta), "
                         f"got {mode!r}")
    graph = session.graph
    if saver is None:
        savers = graph_state(graph).default_savers
        key = (get_config_initializer().prefix, dirname)
        saver = savers.get(key)
        if saver is None:
            with graph.as_default():
                saver = savers[key] = Saver(dirname)
    if step is None:
        global_step = tf.compat.v1.train.get_global_step(graph)
        if global_step is None:
            raise ValueError("save_persistables: the graph has no global step; pass step=")
        step = tf.compat.v1.train.global_step(session, global_step)
    return saver.save(session, step, kind="delta" if mode == 2 else "full",
                      check_finite=check_finite)

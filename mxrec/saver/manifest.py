"""A checkpoint directory's versions and their files: listing, atomic writes, verified reads.

    <dir>/full-000000001000/     a version: kind and step in its name
        manifest.json            written last: step, kind, chain, files with sizes and sha256s
        dense.npz, table-000.npz ...
    <dir>/.tmp-...               a save in progress, or a version being deleted; never read

A version is written into a `.tmp-` folder and made visible by one rename, so
a process killed mid-save leaves the earlier versions as they were; such a
folder is removed by the next `Saver` on that directory (`remove_stale_temporaries`).
Reading a version checks every file's size and SHA-256 against its manifest.

Each temporary names its writer: the host, the process id and the process's start time
(so that a process id the system reused is not mistaken for the writer), in its name
(`.tmp-full-000000001000@host-4242-8812345-1f2e3d4c`) or, for the folder that every rank
of a save writes into (`.tmp-<version>-ranks[-k]`, whose name the ranks agree on by the
number k rank 0 passes through their barrier), in a `writer.json` written first.
`remove_stale_temporaries` removes a temporary only when its writer ran on this host and
is gone; it keeps (and logs) those of live writers and of other hosts, whose liveness it
cannot see. A temporary without a writer (written by an mxrec
before this scheme, or a sharded one in the instant before its `writer.json`) is removed
only when nothing in it changed for `UNNAMED_TEMPORARY_AGE_S`: no save takes that long, and
a live writer of an earlier mxrec keeps writing into its folder.

Retention (`delete_old_versions`) is run by one process (rank 0 on several ranks,
once the version is complete on every rank). It hides each old version by one
rename into a `.tmp-deleted-` folder before removing it, newest first, so a delta
goes no later than the full save it builds on and a reader never sees a half-deleted
version or a delta without its full save; a version already gone is skipped. The
listing leaves out deltas that no full save precedes (what a deletion killed by the
older, oldest-first order could leave).
"""

import hashlib
import io
import json
import os
import posixpath
import re
import socket
import time
import uuid
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

import numpy as np
import tensorflow as tf
from absl import logging

from mxrec.util import durable, shared_dirs

FORMAT_VERSION = 1
_VERSION_RE = re.compile(r"^(full|delta)-(\d{12})$")
_TMP_PREFIX = ".tmp-"
_WRITER_SEP = "@"
WRITER_FILE = "writer.json"
# How long a temporary without a writer stays untouched before it counts as abandoned.
UNNAMED_TEMPORARY_AGE_S = 24 * 3600


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted, or does not fit the model."""


def version_name(kind: str, step: int) -> str:
    return f"{kind}-{step:012d}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_entry(data: bytes) -> Dict:
    """A file's entry in a manifest: its size and SHA-256."""
    return {"bytes": len(data), "sha256": sha256(data)}


def npz_bytes(arrays: Dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


# A file of a version: its bytes, or a writer that writes it at the path it is given and
# returns its manifest entry (a table file streamed in chunks: `mxrec.saver.stream`).
FileData = Union[bytes, Callable[[str], Dict]]


def write_file(path: str, data: FileData, known: Optional[Dict] = None) -> Dict:
    """Writes one file of a version; returns its manifest entry (`known` when the caller
    already hashed these bytes)."""
    if callable(data):
        return data(path)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)
    if known is not None and known.get("bytes") == len(data):
        return known
    return file_entry(data)


def write_version(directory: str, name: str, files: Dict[str, FileData], manifest: Dict) -> str:
    """Writes `files` and `manifest.json` as the version `name`; returns its path. The
    manifest's `files` gets each file's entry (size and SHA-256) as it is written."""
    gfile = tf.io.gfile
    gfile.makedirs(directory)
    final = posixpath.join(directory, name)
    if gfile.exists(final):
        raise CheckpointError(f"checkpoint {final} already exists; save under another step")
    tmp = posixpath.join(directory, temporary_name(name))
    try:
        gfile.makedirs(tmp)
        known = manifest.get("files", {})
        manifest = dict(manifest, files=dict(known))
        for file_name, data in files.items():
            manifest["files"][file_name] = write_file(posixpath.join(tmp, file_name), data,
                                                      known.get(file_name))
        with gfile.GFile(posixpath.join(tmp, "manifest.json"), "w") as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True))
        durable.fsync_tree(tmp)
        durable.rename_durably(tmp, final)
    except BaseException:
        _remove_tree(tmp)  # ours: no later Saver of this process would take it for stale
        raise
    return final


def write_version_sharded(directory: str, name: str, files: Dict[str, FileData], manifest: Dict,
                          rank: int, size: int, barrier: Callable[[int], int],
                          check_shared: bool = False) -> str:
    """The same as `write_version` for one rank of `size`, every rank calling it together.

    Each rank writes its own files (and a `rank-R.json` listing them) into one temporary
    folder; rank 0 then writes the manifest of all of them and renames the folder into
    place. `barrier(value)` returns, once every rank has called it, the sum of the values
    the ranks passed: rank 0 tells the others which temporary folder it made (a folder of
    that name left by another writer that may still run is kept: the next name is taken).
    A file whose size and SHA-256 `manifest["files"]` already holds (taken where it was
    built) is not hashed again.

    With `check_shared` (a Saver's first save), every rank first looks for the writer file
    rank 0 put into the temporary folder: a rank that does not see it writes into a folder
    rank 0 will never read, so the save stops on every rank instead (mxrec.util.shared_dirs).

    Raises:
        CheckpointError: on every rank, the version exists already.
        NotSharedError: on every rank, with `check_shared`, when a rank does not see the
            folder rank 0 made (`directory` is not one shared filesystem); nothing is saved.
    """
    final = posixpath.join(directory, name)
    tmp = _agree_on_temporary(directory, name, final, rank, barrier)
    if check_shared:
        try:
            shared_dirs.check_written(directory, "mxrec Saver: the checkpoint folder",
                                      posixpath.join(tmp, WRITER_FILE), rank, size, barrier)
        except shared_dirs.NotSharedError:
            if rank == 0:
                _remove_tree(tmp)
            raise
    _write_rank_part(tmp, files, manifest, rank)
    barrier(0)
    if rank == 0:
        _publish_sharded(tmp, final, manifest, size)
    barrier(0)
    return final


def _agree_on_temporary(directory: str, name: str, final: str, rank: int,
                        barrier: Callable[[int], int]) -> str:
    """The temporary folder rank 0 made for the version, known to every rank.

    Raises:
        CheckpointError: on every rank, the version exists already.
    """
    attempt = 0
    if rank == 0:
        tf.io.gfile.makedirs(directory)
        if not tf.io.gfile.exists(final):
            attempt = _take_sharded_temporary(directory, name) + 1
    attempt = barrier(attempt)  # 0: rank 0 found the version there
    if attempt == 0:
        raise CheckpointError(f"checkpoint {final} already exists; save under another step")
    return posixpath.join(directory, _sharded_temporary_name(name, attempt - 1))


def _write_rank_part(tmp: str, files: Dict[str, FileData], manifest: Dict, rank: int) -> None:
    """One rank's files, durable, and its `rank-R.json`: the manifest with its own files."""
    gfile = tf.io.gfile
    known = manifest.get("files", {})  # digests the caller already took (Saver.save)
    entries = {}
    for file_name, data in files.items():
        entries[file_name] = write_file(posixpath.join(tmp, file_name), data,
                                        known.get(file_name))
        durable.fsync_path(posixpath.join(tmp, file_name))
    part = dict(manifest, files=entries)
    with gfile.GFile(posixpath.join(tmp, f"rank-{rank}.json"), "w") as f:
        f.write(json.dumps(part, sort_keys=True))


def _publish_sharded(tmp: str, final: str, manifest: Dict, size: int) -> None:
    """Rank 0, once every rank wrote its part: the manifest of all of them in place of the
    parts and the writer's file, then the folder renamed into place."""
    gfile = tf.io.gfile
    parts = []
    for r in range(size):
        with gfile.GFile(posixpath.join(tmp, f"rank-{r}.json"), "r") as f:
            parts.append(json.loads(f.read()))
    with gfile.GFile(posixpath.join(tmp, "manifest.json"), "w") as f:
        f.write(json.dumps(_whole_manifest(manifest, parts), indent=1, sort_keys=True))
    for r in range(size):
        gfile.remove(posixpath.join(tmp, f"rank-{r}.json"))
    gfile.remove(posixpath.join(tmp, WRITER_FILE))
    durable.fsync_path(posixpath.join(tmp, "manifest.json"))
    durable.fsync_path(tmp)
    durable.rename_durably(tmp, final)


def _whole_manifest(manifest: Dict, parts: List[Dict]) -> Dict:
    """The manifest of a version every rank wrote a part of: every rank's files, and per
    table the rank files in rank order and the sums of their counts."""
    whole = dict(manifest, ranks=len(parts), files={}, tables={})
    for part in parts:
        whole["files"].update(part["files"])
    for table in manifest["tables"]:
        metas = [part["tables"][table] for part in parts]
        whole["tables"][table] = dict(
            metas[0], files=[m["file"] for m in metas], ids=sum(m["ids"] for m in metas),
            removed=sum(m["removed"] for m in metas))
        del whole["tables"][table]["file"]
    return whole


def table_files(manifest: Dict, table: str) -> List[str]:
    """The files of `table` in a version, one per rank that wrote it (one when unsharded).

    Raises:
        CheckpointError: the manifest lists another number of files than its `ranks`.
    """
    meta = manifest["tables"][table]
    files = list(meta["files"]) if "files" in meta else [meta["file"]]
    ranks = manifest.get("ranks", 1)
    if len(files) != ranks:
        raise CheckpointError(
            f"checkpoint {version_name(manifest['kind'], manifest['step'])}: table {table!r} "
            f"has {len(files)} rank file(s) {files} but the manifest says it was saved by "
            f"{ranks} ranks; the version is damaged (restore an earlier one)")
    return files


def list_versions(directory: str) -> List[Tuple[str, int]]:
    """(kind, step) of every complete version, by step (a full save before a delta).

    Deltas that no full save precedes are left out: nothing can restore them.
    """
    try:
        entries = tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else []
    except tf.errors.NotFoundError:  # removed while listing
        return []
    found = []
    for entry in entries:
        match = _VERSION_RE.match(entry.rstrip("/"))
        if match:
            found.append((match.group(1), int(match.group(2))))
    found.sort(key=lambda item: (item[1], item[0] == "delta"))
    first_full = next((step for kind, step in found if kind == "full"), None)
    return [(kind, step) for kind, step in found
            if kind == "full" or (first_full is not None and step > first_full)]


def delete_old_versions(directory: str, max_to_keep: Optional[int]) -> None:
    """Keeps the newest `max_to_keep` full versions and the deltas that follow them.

    Older versions go newest first (a delta before the full save it builds on), each
    hidden by one rename before its files are removed; one another process already
    removed is skipped. Run it from one process per directory (rank 0).
    """
    if max_to_keep is None:
        return
    versions = list_versions(directory)
    fulls = [step for kind, step in versions if kind == "full"]
    if len(fulls) <= max_to_keep:
        return
    oldest_kept = fulls[-max_to_keep]
    for kind, step in reversed(versions):
        if step < oldest_kept:
            _delete_version(directory, version_name(kind, step))


def _delete_version(directory: str, name: str) -> None:
    hidden = posixpath.join(directory, temporary_name(f"deleted-{name}"))
    try:
        tf.io.gfile.rename(posixpath.join(directory, name), hidden)
    except tf.errors.NotFoundError:
        return  # already gone
    _remove_tree(hidden)


def _remove_tree(path: str) -> None:
    try:
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


# ------------------------------------------------------------- temporaries' writers


class Writer(NamedTuple):
    """The process that writes a temporary."""

    host: str  # the host name, with characters outside [A-Za-z0-9.-] as "_"
    pid: int
    start: int  # the process's start, clock ticks after boot (/proc); 0 where unknown

    def __str__(self) -> str:
        return f"host {self.host}, pid {self.pid}"


def _host_name() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())


def _process_start(pid: int) -> Optional[int]:
    """The start time of process `pid` in clock ticks after boot (field 22 of
    /proc/<pid>/stat); None when no such process runs; 0 where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
        try:  # a system without /proc: the process id alone
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    except OSError:  # /proc mounted with hidepid: the process is there, its start unknown
        return 0
    # The command name (field 2) may hold spaces and ")": the fields after it follow its
    # last ")".
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[19])


def this_writer() -> Writer:
    """This process as the writer of a temporary."""
    pid = os.getpid()
    return Writer(_host_name(), pid, _process_start(pid) or 0)


def temporary_name(what: str) -> str:
    """A fresh temporary's name for `what` (a version's name, `deleted-<version>`, a
    serving export's folder name) that names this process as its writer."""
    writer = this_writer()
    return (f"{_TMP_PREFIX}{what}{_WRITER_SEP}{writer.host}-{writer.pid}-{writer.start}-"
            f"{uuid.uuid4().hex[:8]}")


def _writer_from_name(name: str) -> Optional[Writer]:
    if _WRITER_SEP not in name:
        return None
    parts = name.rsplit(_WRITER_SEP, 1)[1].rsplit("-", 3)
    if len(parts) != 4 or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return Writer(parts[0], int(parts[1]), int(parts[2]))


def _write_writer_file(folder: str) -> None:
    with tf.io.gfile.GFile(posixpath.join(folder, WRITER_FILE), "w") as f:
        f.write(json.dumps(this_writer()._asdict(), sort_keys=True))


def _writer_from_file(path: str) -> Optional[Writer]:
    try:
        with tf.io.gfile.GFile(posixpath.join(path, WRITER_FILE), "r") as f:
            fields = json.loads(f.read())
        return Writer(str(fields["host"]), int(fields["pid"]), int(fields["start"]))
    except (tf.errors.OpError, ValueError, KeyError, TypeError):
        return None  # not written yet (or damaged): no writer known


def writer_of(directory: str, name: str) -> Optional[Writer]:
    """The writer a temporary names (in its name or its `writer.json`); None for one that
    names none."""
    return _writer_from_name(name) or _writer_from_file(posixpath.join(directory, name))


def writer_gone(writer: Writer) -> bool:
    """True when `writer` ran on this host and no longer runs (its process id is free, or
    taken by a process that started at another time)."""
    if writer.host != _host_name():
        return False
    start = _process_start(writer.pid)
    return start is None or (start != writer.start and start != 0 and writer.start != 0)


def _newest_change(path: str) -> float:
    """The newest modification time (seconds) of `path` and everything under it."""
    gfile = tf.io.gfile
    newest = gfile.stat(path).mtime_nsec / 1e9
    if gfile.isdir(path):
        for folder, _, files in gfile.walk(path):
            for name in [None, *files]:
                target = folder if name is None else posixpath.join(folder, name)
                try:
                    newest = max(newest, gfile.stat(target).mtime_nsec / 1e9)
                except tf.errors.NotFoundError:
                    continue
    return newest


def _why_kept(directory: str, name: str) -> Optional[str]:
    """Why the temporary `name` must stay (its writer may still write it); None when it is
    abandoned."""
    path = posixpath.join(directory, name)
    writer = writer_of(directory, name)
    if writer is None:
        try:
            age = time.time() - _newest_change(path)
        except tf.errors.NotFoundError:
            return None
        if age >= UNNAMED_TEMPORARY_AGE_S:
            return None
        return (f"it names no writer (an earlier mxrec's, or one being created) and changed "
                f"{age:.0f} s ago; it is removed once untouched for "
                f"{UNNAMED_TEMPORARY_AGE_S} s")
    if writer_gone(writer):
        return None
    if writer.host != _host_name():
        return (f"its writer ({writer}) runs on another host, where this process cannot see "
                "whether it still runs; remove it by hand once that process is gone")
    return f"its writer ({writer}) is still running"


def _sharded_temporary_name(version: str, index: int) -> str:
    return f"{_TMP_PREFIX}{version}-ranks" + (f"-{index}" if index else "")


def _take_sharded_temporary(directory: str, version: str) -> int:
    """Makes the folder that every rank of a save of `version` writes into and records this
    process as its writer; returns its index (its name is `_sharded_temporary_name`).

    Its name is one the ranks can agree on by a number: the first index whose folder does
    not exist once those left by writers that are gone are removed. A folder of a writer
    that may still run (or whose host cannot tell) is kept and skipped.
    """
    index = 0
    while True:
        name = _sharded_temporary_name(version, index)
        path = posixpath.join(directory, name)
        if tf.io.gfile.exists(path) and _why_kept(directory, name) is None:
            _remove_tree(path)
        if _make_new_folder(path):
            _write_writer_file(path)
            return index
        logging.warning("mxrec checkpoint: kept %s: %s", path,
                        _why_kept(directory, name) or "another process just took it")
        index += 1


def _make_new_folder(path: str) -> bool:
    """Makes the folder `path`; False when it exists (locally: made by another process
    meanwhile, which mkdir tells atomically; tf.io.gfile.mkdir accepts an existing one)."""
    local = durable.local_path(path)
    if local is None:
        if tf.io.gfile.exists(path):
            return False
        tf.io.gfile.mkdir(path)
        return True
    try:
        os.mkdir(local)
    except FileExistsError:
        return False
    return True


def remove_stale_temporaries(directory: str) -> List[str]:
    """Removes the `.tmp-` folders that saves and deletions which died left; returns their
    names.

    Only temporaries whose writer ran on this host and is gone are removed (and those naming
    no writer that nothing changed for UNNAMED_TEMPORARY_AGE_S); the others are kept and
    logged, so that a save in progress in another process (or on another host) goes on.
    """
    try:
        entries = tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else []
    except tf.errors.NotFoundError:
        return []
    removed = []
    for name in sorted(entry.rstrip("/") for entry in entries):
        if not name.startswith(_TMP_PREFIX):
            continue
        why = _why_kept(directory, name)
        if why is None:
            _remove_tree(posixpath.join(directory, name))
            removed.append(name)
        else:
            logging.warning("mxrec checkpoint: kept %s/%s: %s", directory, name, why)
    return removed


def read_version(directory: str, kind: str, step: int, only: Optional[Iterable[str]] = None
                 ) -> Tuple[Dict, Dict[str, Dict[str, np.ndarray]]]:
    """(manifest, {file name: {array name: array}}) of one version, every file verified
    (or only the files named in `only`).

    Raises:
        CheckpointError: no manifest, a corrupted manifest, another format, or a file
            missing, truncated or not matching its SHA-256.
    """
    manifest = read_manifest(directory, kind, step)
    path = posixpath.join(directory, version_name(kind, step))
    arrays = {}
    for file_name, expect in manifest["files"].items():
        if only is not None and file_name not in only:
            continue
        file_path = posixpath.join(path, file_name)
        if not tf.io.gfile.exists(file_path):
            raise CheckpointError(f"checkpoint file {file_path} is missing")
        with tf.io.gfile.GFile(file_path, "rb") as f:
            data = f.read()
        if len(data) != expect["bytes"]:
            raise CheckpointError(f"checkpoint file {file_path} is truncated: "
                                  f"{len(data)} bytes, the manifest says {expect['bytes']}")
        if sha256(data) != expect["sha256"]:
            raise CheckpointError(f"checkpoint file {file_path} is corrupted: its SHA-256 "
                                  "does not match the manifest")
        with np.load(io.BytesIO(data)) as npz:
            arrays[file_name] = {key: npz[key] for key in npz.files}
    return manifest, arrays


def read_manifest(directory: str, kind: str, step: int) -> Dict:
    """The manifest of one version (no file read).

    Raises:
        CheckpointError: no manifest, a corrupted manifest, or another format.
    """
    path = posixpath.join(directory, version_name(kind, step))
    manifest_path = posixpath.join(path, "manifest.json")
    if not tf.io.gfile.exists(manifest_path):
        raise CheckpointError(f"checkpoint {path} has no manifest.json: it is incomplete")
    try:
        with tf.io.gfile.GFile(manifest_path, "r") as f:
            manifest = json.loads(f.read())
    except ValueError as err:
        raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupted: {err}") \
            from None
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format {manifest.get('format')!r}; "
                              f"this mxrec reads format {FORMAT_VERSION}")
    return manifest

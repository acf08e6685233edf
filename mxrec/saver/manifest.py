"""A checkpoint directory's versions and their files: listing, atomic writes, verified reads.

    <dir>/full-000000001000/     a version: kind and step in its name
        manifest.json            written last: step, kind, chain, files with sizes and sha256s
        dense.npz, table-000.npz ...
    <dir>/.tmp-...               a save in progress, or a version being deleted; never read

A version is written into a `.tmp-` folder and made visible by one rename, so
a process killed mid-save leaves the earlier versions as they were; such a
folder is removed by the next `Saver` on that directory (`remove_stale_temporaries`).
Reading a version checks every file's size and SHA-256 against its manifest.

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
import posixpath
import re
import uuid
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from mxrec.util import durable

FORMAT_VERSION = 1
_VERSION_RE = re.compile(r"^(full|delta)-(\d{12})$")
_DELETED_PREFIX = ".tmp-deleted-"


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


def write_version(directory: str, name: str, files: Dict[str, bytes], manifest: Dict) -> str:
    """Writes `files` and `manifest.json` as the version `name`; returns its path."""
    gfile = tf.io.gfile
    gfile.makedirs(directory)
    final = posixpath.join(directory, name)
    if gfile.exists(final):
        raise CheckpointError(f"checkpoint {final} already exists; save under another step")
    tmp = posixpath.join(directory, f".tmp-{name}-{uuid.uuid4().hex}")
    gfile.makedirs(tmp)
    for file_name, data in files.items():
        with gfile.GFile(posixpath.join(tmp, file_name), "wb") as f:
            f.write(data)
    with gfile.GFile(posixpath.join(tmp, "manifest.json"), "w") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True))
    durable.fsync_tree(tmp)
    durable.rename_durably(tmp, final)
    return final


def write_version_sharded(directory: str, name: str, files: Dict[str, bytes], manifest: Dict,
                          rank: int, size: int, barrier: Callable[[], None]) -> str:
    """The same as `write_version` for one rank of `size`, every rank calling it together.

    Each rank writes its own files (and a `rank-R.json` listing them) into one temporary
    folder; rank 0 then writes the manifest of all of them and renames the folder into
    place. `barrier()` returns once every rank has called it. A file whose size and
    SHA-256 `manifest["files"]` already holds (taken where it was built) is not hashed again.
    """
    gfile = tf.io.gfile
    final = posixpath.join(directory, name)
    tmp = posixpath.join(directory, f".tmp-{name}-ranks")
    if rank == 0:
        gfile.makedirs(directory)
        if gfile.exists(final):
            raise CheckpointError(f"checkpoint {final} already exists; save under another step")
        if gfile.exists(tmp):  # left by a save that died
            gfile.rmtree(tmp)
        gfile.makedirs(tmp)
    barrier()
    for file_name, data in files.items():
        with gfile.GFile(posixpath.join(tmp, file_name), "wb") as f:
            f.write(data)
        durable.fsync_path(posixpath.join(tmp, file_name))
    known = manifest.get("files", {})  # digests the caller already took (Saver.save)
    part = dict(manifest, files={n: known[n] if n in known and known[n]["bytes"] == len(d)
                                 else file_entry(d)
                                 for n, d in files.items()})
    with gfile.GFile(posixpath.join(tmp, f"rank-{rank}.json"), "w") as f:
        f.write(json.dumps(part, sort_keys=True))
    barrier()
    if rank == 0:
        parts = []
        for r in range(size):
            with gfile.GFile(posixpath.join(tmp, f"rank-{r}.json"), "r") as f:
                parts.append(json.loads(f.read()))
        whole = dict(manifest, ranks=size, files={}, tables={})
        for part in parts:
            whole["files"].update(part["files"])
        for table in manifest["tables"]:
            metas = [part["tables"][table] for part in parts]
            whole["tables"][table] = dict(
                metas[0], files=[m["file"] for m in metas], ids=sum(m["ids"] for m in metas),
                removed=sum(m["removed"] for m in metas))
            del whole["tables"][table]["file"]
        with gfile.GFile(posixpath.join(tmp, "manifest.json"), "w") as f:
            f.write(json.dumps(whole, indent=1, sort_keys=True))
        for r in range(size):
            gfile.remove(posixpath.join(tmp, f"rank-{r}.json"))
        durable.fsync_path(posixpath.join(tmp, "manifest.json"))
        durable.fsync_path(tmp)
        durable.rename_durably(tmp, final)
    barrier()
    return final


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
    hidden = posixpath.join(directory, f"{_DELETED_PREFIX}{name}-{uuid.uuid4().hex}")
    try:
        tf.io.gfile.rename(posixpath.join(directory, name), hidden)
    except tf.errors.NotFoundError:
        return  # already gone
    _remove_tree(hidden)


def _remove_tree(path: str) -> None:
    try:
        tf.io.gfile.rmtree(path)
    except tf.errors.NotFoundError:
        pass


def remove_stale_temporaries(directory: str) -> List[str]:
    """Removes the `.tmp-` folders of saves and deletions that died; returns their names.

    Call it where no save into `directory` is under way (a Saver's construction, rank 0).
    """
    try:
        entries = tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else []
    except tf.errors.NotFoundError:
        return []
    stale = [entry.rstrip("/") for entry in entries if entry.startswith(".tmp-")]
    for name in stale:
        _remove_tree(posixpath.join(directory, name))
    return stale


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

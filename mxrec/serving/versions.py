"""Serving versions under an export base (TensorFlow Serving's layout), written atomically
and verified before use.

    EXPORT_BASE/<version>/saved_model.pb, variables/...   a SavedModel (TF Serving loads it)
    EXPORT_BASE/<version>/mxrec_version.json              written last, before the rename:
                                                           kind, base version, size and
                                                           SHA-256 of every other file
    EXPORT_BASE/.tmp-<version>-<uuid>/                     a version being written; ignored

`publish` renames a complete staging folder to `<version>` (one rename: a reader
sees all of a version or none of it; TensorFlow Serving ignores names that are not
numbers). `export_version` is the way a model of one's own becomes a version: it runs an
export (`export_saved_model`, `mxrec.keras.export_serving`) into a staging folder and
publishes it. `verify` checks a version against its manifest: a file missing or shorter than
listed is an IncompleteVersionError (a copy under way: look again later); a longer or
changed file, a file the manifest does not list, or a malformed manifest is a
DamagedVersionError naming it. `fingerprint` (names, sizes, mtimes) tells whether a
version's files changed since, without reading them.
"""

import json
import os
import posixpath
import re
import time
import uuid
from typing import Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from mxrec.saver.stream import file_digest
from mxrec.util import durable

MANIFEST = "mxrec_version.json"
# The streaming trainer's claim on an export base (mxrec.streaming.ownership): the trainer
# numbers its versions by step, so nothing else may publish there.
OWNER_FILE = "mxrec_owner.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class DamagedVersionError(ValueError):
    """A serving version whose files do not match its manifest (or that has none)."""


class IncompleteVersionError(DamagedVersionError):
    """A serving version whose files are not all there yet (missing, or shorter than the
    manifest says): a copy still under way, worth another look later."""


def _files(root: str, prefix: str = "") -> List[str]:
    out = []
    for entry in sorted(tf.io.gfile.listdir(posixpath.join(root, prefix) if prefix else root)):
        entry = entry.rstrip("/")
        relative = posixpath.join(prefix, entry) if prefix else entry
        if tf.io.gfile.isdir(posixpath.join(root, relative)):
            out.extend(_files(root, relative))
        elif relative != MANIFEST:
            out.append(relative)
    return out


def staging_dir(export_base: str, version: int) -> str:
    """A fresh folder name beside the versions for writing `version`."""
    return posixpath.join(export_base, f".tmp-{int(version)}-{uuid.uuid4().hex}")


def publish(staging: str, export_base: str, version: int, info: Optional[Dict] = None) -> str:
    """Writes the manifest of `staging` and renames it to EXPORT_BASE/<version>.

    Raises:
        ValueError: the version exists already.
    """
    final = posixpath.join(export_base, str(int(version)))
    if tf.io.gfile.exists(final):
        raise ValueError(f"serving version {final} exists already")
    manifest = dict(info or {})
    manifest.update(version=int(version), time=time.time(),
                    files={name: file_digest(posixpath.join(staging, name))
                           for name in _files(staging)})
    with tf.io.gfile.GFile(posixpath.join(staging, MANIFEST), "w") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True))
    durable.fsync_tree(staging)
    durable.rename_durably(staging, final)
    return final


def _next_version(export_base: str, version: Optional[int]) -> int:
    """`version` checked (a number not yet in the base), or one more than the newest."""
    if version is None:
        return max(list_versions(export_base), default=0) + 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"export_version: version must be an int >= 0 or None (one more "
                         f"than the newest), got {version!r}")
    if tf.io.gfile.exists(posixpath.join(export_base, str(version))):
        raise ValueError(f"export_version: serving version {version} exists already in "
                         f"{export_base}; versions are never replaced: pass a larger version "
                         "(or None for the next one)")
    return version


def export_version(export_base: str, write: Callable[[str], object],
                   version: Optional[int] = None) -> str:
    """Publishes a SavedModel as serving version `version` of `export_base`, with its manifest.

    `write(folder)` writes the SavedModel into `folder`, a fresh staging folder beside the
    versions that does not exist yet (as `export_saved_model` and `mxrec.keras.export_serving`
    want their target); then the manifest (size and SHA-256 of every file) is written and
    the folder renamed to EXPORT_BASE/<version>, so a predictor sees the whole version or
    none of it, and can tell later whether a copy of it is whole. Call it on one process
    (rank 0 on several ranks).

    Args:
        export_base: the folder of numeric versions a predictor follows (created if needed).
        write: writes the SavedModel into the folder it is given.
        version: the version number (an int >= 0 not yet in the base); None: one more than
            the newest version there (1 in an empty base).

    Returns:
        The version's folder, EXPORT_BASE/<version>.

    Raises:
        ValueError: the version exists already, is not an int >= 0, `write` wrote no
            SavedModel, or the base belongs to a streaming trainer (its OWNER_FILE).

    Example:
        >>> export_version("/serving/ctr", lambda folder: export_saved_model(
        ...     folder, "/ckpt/ctr", build))                 # -> "/serving/ctr/1"
    """
    tf.io.gfile.makedirs(export_base)
    if tf.io.gfile.exists(posixpath.join(export_base, OWNER_FILE)):
        raise ValueError(f"export_version: {export_base} belongs to a streaming trainer "
                         f"({OWNER_FILE}), which numbers its versions itself; give this "
                         "model its own export base")
    version = _next_version(export_base, version)
    staging = staging_dir(export_base, version)
    try:
        write(staging)
        if not any(tf.io.gfile.exists(posixpath.join(staging, name))
                   for name in ("saved_model.pb", "saved_model.pbtxt")):
            raise ValueError(f"export_version: write({staging!r}) wrote no SavedModel there "
                             "(no saved_model.pb)")
        return publish(staging, export_base, version, {"kind": "full", "base": None})
    finally:
        # Only what this call staged: the folder name is its own (a fresh uuid).
        if tf.io.gfile.exists(staging):
            tf.io.gfile.rmtree(staging)


def _check_entries(path: str, manifest) -> Dict:
    """The manifest's {file: {"bytes", "sha256"}} map, each entry checked: a name inside the
    version (relative, no ".."), a byte count and a SHA-256 in hex."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise DamagedVersionError(f"{path} is not a version manifest (an object with a "
                                  "'files' map)")
    for name, meta in manifest["files"].items():
        parts = name.split("/")
        if (not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts)
                or name == MANIFEST):
            raise DamagedVersionError(f"{path} lists {name!r}, which is no file inside the "
                                      "version")
        if (not isinstance(meta, dict) or type(meta.get("bytes")) is not int
                or meta["bytes"] < 0 or not isinstance(meta.get("sha256"), str)
                or not _SHA256.fullmatch(meta["sha256"])):
            raise DamagedVersionError(f"{path}: the entry of {name!r} is not "
                                      "{\"bytes\": N, \"sha256\": 64 hex digits}")
    return manifest["files"]


def read_manifest(version_dir: str) -> Dict:
    """The manifest of a version, checked to be one (fields it does not know are kept).

    Raises:
        DamagedVersionError: no manifest, not JSON, or its file map malformed.
    """
    path = posixpath.join(version_dir, MANIFEST)
    if not tf.io.gfile.exists(path):
        raise DamagedVersionError(
            f"serving version {version_dir} has no {MANIFEST}, so nothing can tell whether it "
            "is whole: publish versions with mxrec.serving.versions.export_version (or the "
            "streaming trainer), not by writing or copying a SavedModel into the base")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            manifest = json.loads(f.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DamagedVersionError(f"{path} is not JSON: {error}") from error
    _check_entries(path, manifest)
    return manifest


def _sizes(version_dir: str, expected: Dict) -> None:
    """Missing or short files (a copy still under way) before anything is read."""
    present = set(_files(version_dir))
    missing = sorted(set(expected) - present)
    if missing:
        raise IncompleteVersionError(f"serving version {version_dir}: missing {missing} "
                                     "(a copy still under way?)")
    for name, meta in sorted(expected.items()):
        size = tf.io.gfile.stat(posixpath.join(version_dir, name)).length
        if size < meta["bytes"]:
            raise IncompleteVersionError(f"serving version {version_dir}: {name} has {size} "
                                         f"bytes, the manifest says {meta['bytes']} (a copy "
                                         "still under way?)")
        if size > meta["bytes"]:
            raise DamagedVersionError(f"serving version {version_dir}: {name} has {size} "
                                      f"bytes, the manifest says {meta['bytes']}")
    extra = sorted(present - set(expected))
    if extra:
        raise DamagedVersionError(f"serving version {version_dir}: files {extra} are not in "
                                  f"its {MANIFEST}")


def verify(version_dir: str) -> Dict:
    """Checks every file of a version against its manifest; returns the manifest.

    Sizes are checked first, so a copy still under way costs a listing, not a read.

    Raises:
        IncompleteVersionError: a listed file missing or shorter than the manifest says.
        DamagedVersionError: no manifest or a malformed one, a file longer than listed, a
            file the manifest does not list, or one whose SHA-256 differs.
    """
    manifest = read_manifest(version_dir)
    expected = manifest["files"]
    _sizes(version_dir, expected)
    for name, meta in sorted(expected.items()):
        actual = file_digest(posixpath.join(version_dir, name))
        if actual["bytes"] != meta["bytes"]:  # changed while it was read
            raise IncompleteVersionError(f"serving version {version_dir}: {name} has "
                                         f"{actual['bytes']} bytes, the manifest says "
                                         f"{meta['bytes']}")
        if actual["sha256"] != meta["sha256"]:
            raise DamagedVersionError(f"serving version {version_dir}: {name} does not match "
                                      "its SHA-256 in the manifest")
    return manifest


def _stat(path: str) -> Tuple:
    local = durable.local_path(path)
    if local is None:
        stat = tf.io.gfile.stat(path)
        return stat.length, stat.mtime_nsec
    # tf.io.gfile's mtime has whole seconds on local files; the change time also moves when
    # a copy keeps the source's mtime (cp -p, rsync -t), and nothing can set it back.
    stat = os.stat(local)
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


def fingerprint(version_dir: str) -> Tuple:
    """(name, bytes, mtime, and for local files change time and inode) of every file of a
    version, the manifest included: equal fingerprints mean nothing was written, copied or
    removed there since. Nothing is read."""
    names = _files(version_dir)
    if tf.io.gfile.exists(posixpath.join(version_dir, MANIFEST)):
        names.append(MANIFEST)
    return tuple((name,) + _stat(posixpath.join(version_dir, name)) for name in sorted(names))


def list_versions(export_base: str) -> List[int]:
    """The numeric version folders of `export_base`, ascending (complete or not)."""
    if not tf.io.gfile.isdir(export_base):
        return []
    return sorted(int(e.rstrip("/")) for e in tf.io.gfile.listdir(export_base)
                  if e.rstrip("/").isdigit())


__all__ = ["MANIFEST", "OWNER_FILE", "DamagedVersionError", "IncompleteVersionError",
           "staging_dir", "publish", "export_version", "verify", "read_manifest", "fingerprint",
           "list_versions"]

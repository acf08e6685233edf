"""Serving versions under an export base (TensorFlow Serving's layout), written atomically
and verified before use.

    EXPORT_BASE/<version>/saved_model.pb, variables/...   a SavedModel (TF Serving loads it)
    EXPORT_BASE/<version>/mxrec_version.json              written last, before the rename:
                                                           kind, base version, size and
                                                           SHA-256 of every other file
    EXPORT_BASE/.tmp-<version>-<uuid>/                     a version being written; ignored

`publish` renames a complete staging folder to `<version>` (one rename: a reader
sees all of a version or none of it; TensorFlow Serving ignores names that are not
numbers). `verify` checks a version against its manifest: a missing, truncated or
changed file is a DamagedVersionError naming it.
"""

import hashlib
import json
import posixpath
import time
import uuid
from typing import Dict, List, Optional

import tensorflow as tf

from mxrec.util import durable

MANIFEST = "mxrec_version.json"


class DamagedVersionError(ValueError):
    """A serving version whose files do not match its manifest (or that has none)."""


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


def _digest(path: str) -> Dict:
    sha = hashlib.sha256()
    size = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            sha.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": sha.hexdigest()}


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
                    files={name: _digest(posixpath.join(staging, name))
                           for name in _files(staging)})
    with tf.io.gfile.GFile(posixpath.join(staging, MANIFEST), "w") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True))
    durable.fsync_tree(staging)
    durable.rename_durably(staging, final)
    return final


def read_manifest(version_dir: str) -> Dict:
    path = posixpath.join(version_dir, MANIFEST)
    if not tf.io.gfile.exists(path):
        raise DamagedVersionError(f"serving version {version_dir} has no {MANIFEST}")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            return json.loads(f.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DamagedVersionError(f"{path} is not JSON: {error}") from error


def verify(version_dir: str) -> Dict:
    """Checks every file of a version against its manifest; returns the manifest.

    Raises:
        DamagedVersionError: no manifest, or a file missing, extra, truncated or changed.
    """
    manifest = read_manifest(version_dir)
    expected = manifest.get("files", {})
    present = set(_files(version_dir))
    missing = sorted(set(expected) - present)
    if missing:
        raise DamagedVersionError(f"serving version {version_dir}: missing {missing}")
    for name, meta in sorted(expected.items()):
        actual = _digest(posixpath.join(version_dir, name))
        if actual["bytes"] != meta["bytes"]:
            raise DamagedVersionError(f"serving version {version_dir}: {name} has "
                                      f"{actual['bytes']} bytes, the manifest says "
                                      f"{meta['bytes']}")
        if actual["sha256"] != meta["sha256"]:
            raise DamagedVersionError(f"serving version {version_dir}: {name} does not match "
                                      "its SHA-256 in the manifest")
    return manifest


def list_versions(export_base: str) -> List[int]:
    """The numeric version folders of `export_base`, ascending (complete or not)."""
    if not tf.io.gfile.isdir(export_base):
        return []
    return sorted(int(e.rstrip("/")) for e in tf.io.gfile.listdir(export_base)
                  if e.rstrip("/").isdigit())


__all__ = ["MANIFEST", "DamagedVersionError", "staging_dir", "publish", "verify",
           "read_manifest", "list_versions"]

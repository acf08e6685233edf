"""Durable publication: a file's bytes reach the disk before a name announces them.

Every artifact mxrec publishes (a checkpoint version, a serving version, the donefile) is
written under a temporary name, its files are fsync'ed, it is renamed to its final name,
and the folder that holds the name is fsync'ed. A crash at any moment (a kill, a power
loss) leaves the old state or the new one, never a name that points at bytes the disk
does not hold.

fsync applies to local paths (no scheme, or file://). Other filesystems reached through
tf.io.gfile (gs://, s3://, hdfs://) make a closed file durable themselves and have no
folder to sync; for them these functions only write and rename.

Example:
    >>> write_atomic("/models/ctr/donefile.jsonl", b'{"step": 1}\\n')
    >>> fsync_tree("/models/ctr/.tmp-full-000000000001-ab12")   # then rename_durably(...)
"""

import os
import posixpath
import uuid
from typing import Union

import tensorflow as tf


def local_path(path: str):
    """The local filesystem path of `path`, or None when it lives elsewhere (gs://, ...)."""
    if path.startswith("file://"):
        return path[len("file://"):]
    if "://" in path:
        return None
    return path


def fsync_path(path: str) -> None:
    """Flushes a local file or folder to the disk (a no-op for other filesystems)."""
    local = local_path(path)
    if local is None:
        return
    flags = os.O_RDONLY
    if os.path.isdir(local):
        flags |= getattr(os, "O_DIRECTORY", 0)
    fd = os.open(local, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_parent(path: str) -> None:
    """Flushes the folder that holds `path`'s name (after a create, rename or delete)."""
    fsync_path(posixpath.dirname(path.rstrip("/")) or ".")


def fsync_tree(root: str) -> None:
    """Flushes every file under `root`, then every folder, deepest first, then `root`."""
    local = local_path(root)
    if local is None:
        return
    for folder, _, files in os.walk(local, topdown=False):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def rename_durably(source: str, target: str, overwrite: bool = False) -> None:
    """Renames `source` to `target` (a file or a folder already flushed) and flushes the
    folders that held the two names."""
    tf.io.gfile.rename(source, target, overwrite=overwrite)
    fsync_parent(target)
    if posixpath.dirname(source.rstrip("/")) != posixpath.dirname(target.rstrip("/")):
        fsync_parent(source)


def write_atomic(path: str, data: Union[bytes, str]) -> None:
    """Replaces the file `path` with `data`: written to a temporary name beside it, flushed,
    renamed over `path`, the folder flushed. A reader sees the old file or the new one."""
    directory = posixpath.dirname(path) or "."
    tf.io.gfile.makedirs(directory)
    tmp = posixpath.join(directory, f".{posixpath.basename(path)}.tmp-{uuid.uuid4().hex}")
    try:
        with tf.io.gfile.GFile(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        fsync_path(tmp)
        rename_durably(tmp, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise


__all__ = ["local_path", "fsync_path", "fsync_parent", "fsync_tree", "rename_durably",
           "write_atomic"]

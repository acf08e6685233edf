"""Which model a model dir and an export base belong to, and one trainer per model dir.

    MODEL_DIR/mxrec_model.json        the model's identity, written once, when a trainer
                                      first uses the folder: {"model_id", "created", "host"}
    MODEL_DIR/trainer.lock            locked (flock) by the trainer running on the folder
                                      (rank 0 on several ranks); says its pid, host and start
    EXPORT_BASE/mxrec_owner.json      the model whose versions the base holds, written once,
                                      when that model first exports there
    EXPORT_BASE/<v>/mxrec_version.json  each version names the model that wrote it

A trainer refuses to start on an export base that another model owns, or that holds
versions it cannot prove are its own, and refuses a model dir another trainer holds: a
second model (or a second copy of the same job) can never delete, overwrite or shadow
what the first one delivered. Clean-up after a crash (trainer._clean_after) deletes only
what this model wrote.

Example:
    >>> lock = ModelDirLock("/models/ctr")          # OwnershipError if a trainer holds it
    >>> identity = model_identity("/models/ctr")    # created on first use
    >>> claim_export_base("/serving/ctr", identity, "/models/ctr", listed=set())
"""

import errno
import fcntl
import json
import os
import posixpath
import socket
import time
import uuid
from typing import Dict, Iterable, Optional

import tensorflow as tf

from mxrec.serving import versions as serving_versions
from mxrec.util import durable

MODEL_FILE = "mxrec_model.json"
OWNER_FILE = serving_versions.OWNER_FILE
LOCK_FILE = "trainer.lock"


class OwnershipError(RuntimeError):
    """A model dir or export base that this trainer must not write: another model's, held
    by another trainer, or in a state that only an operator can resolve. Nothing was
    changed."""


def _read_json(path: str, what: str) -> Optional[Dict]:
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            value = json.loads(f.read())
    except (ValueError, UnicodeDecodeError) as error:
        raise OwnershipError(f"{what} {path} is not readable JSON ({error}); nothing was "
                             "changed: restore it from a backup, or move the folder aside "
                             "and start a new one") from error
    if not isinstance(value, dict) or not value.get("model_id"):
        raise OwnershipError(f"{what} {path} names no model_id; nothing was changed: restore "
                             "it from a backup, or move the folder aside")
    return value


def _write_once(path: str, value: Dict) -> Dict:
    """Writes `value` to `path` unless a file is there already; returns what is there after
    (the other writer's value when two raced)."""
    directory = posixpath.dirname(path)
    tf.io.gfile.makedirs(directory)
    local = durable.local_path(path)
    if local is None:  # no atomic no-clobber create on remote filesystems: best effort
        if not tf.io.gfile.exists(path):
            durable.write_atomic(path, json.dumps(value, indent=1, sort_keys=True))
        return _read_json(path, "identity file")
    tmp = f"{local}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        f.write(json.dumps(value, indent=1, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, local)  # fails where the name exists: the first writer wins
        durable.fsync_parent(local)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return _read_json(path, "identity file")


def model_identity(model_dir: str) -> Dict:
    """The identity of the model in `model_dir`, created (once) on first use."""
    path = posixpath.join(model_dir, MODEL_FILE)
    found = _read_json(path, "model identity")
    if found is not None:
        return found
    return _write_once(path, {"model_id": uuid.uuid4().hex, "created": time.time(),
                              "host": socket.gethostname(),
                              "model_dir": os.path.abspath(model_dir)
                              if durable.local_path(model_dir) else model_dir})


def version_owner(export_base: str, version: int) -> Optional[str]:
    """The model_id recorded in a serving version's manifest; None when it names none (a
    version of an earlier mxrec, or of another tool) or cannot be read."""
    try:
        manifest = serving_versions.read_manifest(posixpath.join(export_base, str(version)))
    except serving_versions.DamagedVersionError:
        return None
    return manifest.get("model_id")


def _describe(owner: Dict) -> str:
    return f"model {owner['model_id']} (model dir {owner.get('model_dir', '?')})"


def claim_export_base(export_base: str, identity: Dict, model_dir: str,
                      listed: Iterable[int]) -> None:
    """Makes sure `export_base` is this model's, claiming it when it is new.

    An unclaimed base is claimed when every version in it is this model's: named so in
    its manifest, or listed in this model's donefile (`listed`: versions an earlier
    mxrec delivered for it).

    Raises:
        OwnershipError: another model owns the base, or it holds versions this model did
            not write; the message names both and what to do.
    """
    path = posixpath.join(export_base, OWNER_FILE)
    owner = _read_json(path, "export base owner")
    mine = identity["model_id"]
    if owner is None:
        listed = set(listed)
        foreign = [v for v in serving_versions.list_versions(export_base)
                   if version_owner(export_base, v) != mine and v not in listed]
        if foreign:
            raise OwnershipError(
                f"export base {export_base} holds serving versions {foreign[:10]} that this "
                f"model (model dir {model_dir}) did not write: they are not in its donefile "
                "and their manifests name no model of this folder. Nothing was changed. Give "
                "each model its own --export-base (TF Serving serves each model from its own "
                "base path), or move those versions away if they are not served")
        owner = _write_once(path, {"model_id": mine, "model_dir": identity.get(
            "model_dir", model_dir), "claimed": time.time()})
    if owner["model_id"] != mine:
        raise OwnershipError(
            f"export base {export_base} belongs to {_describe(owner)}; this trainer's model "
            f"dir {model_dir} is model {mine}. Nothing was changed. Give each model its own "
            "--export-base: a second model writing there would replace or delete the versions "
            "being served")


def check_export_owner(export_base: str, identity: Dict) -> None:
    """Raises OwnershipError unless `export_base` is still this model's (checked before
    each delivery)."""
    owner = _read_json(posixpath.join(export_base, OWNER_FILE), "export base owner")
    if owner is None or owner["model_id"] != identity["model_id"]:
        raise OwnershipError(
            f"export base {export_base} is no longer this model's (owner file "
            f"{'missing' if owner is None else 'names ' + _describe(owner)}); this model is "
            f"{identity['model_id']}. Nothing was delivered; stop the other writer or give "
            "each model its own --export-base")


class ModelDirLock:
    """An exclusive lock on a model dir, held for the trainer's life (released by the
    kernel when the process dies, however it dies).

    On a filesystem reached through a scheme (gs://, hdfs://) there is no lock: such a
    trainer must be the only one on its folder (said once in the log).

    Raises:
        OwnershipError: another trainer holds the model dir.
    """

    def __init__(self, model_dir: str):
        self._fd = None
        local = durable.local_path(model_dir)
        if local is None:
            tf.compat.v1.logging.warning(
                "streaming: %s is not a local folder: no lock keeps a second trainer off it",
                model_dir)
            return
        os.makedirs(local, exist_ok=True)
        path = os.path.join(local, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise OwnershipError(
                f"model dir {model_dir} is in use by another trainer ({holder}); two trainers "
                "on one model dir would overwrite each other's checkpoints and donefile. Stop "
                "the other one, or give this run its own --model-dir") from error
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.time()}).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None


__all__ = ["MODEL_FILE", "OWNER_FILE", "LOCK_FILE", "OwnershipError", "model_identity",
           "version_owner", "claim_export_base", "check_export_owner", "ModelDirLock"]

"""Whether a folder every rank uses is one shared filesystem: a marker rank 0 writes there is
visible to every rank.

Ranks on several hosts save one checkpoint together (each rank its shard, rank 0 the
manifest of all), read one donefile and one data root: each host mounting its own disk at
the same path would split a checkpoint over the hosts and let ranks train from different
states, without any error of its own. So several ranks check a folder before they rely on
it: rank 0 writes a marker file of a random name into it, tells every rank the name (one
collective), each rank looks for the file (waiting up to MARKER_WAIT_S for a network
filesystem's cache), and a second collective tells every rank which ranks did not see it;
then every rank raises NotSharedError naming the folder and the ranks (and its own host),
and rank 0 removes its markers. Marker names start with a dot, which the folders'
listings (partitions, checkpoint and serving versions) skip.

Where it runs: the streaming trainer at start (the model dir, the export base, the data
root: mxrec.streaming.trainer) and mxrec's Saver at its first save on several ranks (the
checkpoint folder: mxrec.saver.manifest.write_version_sharded), the first moments a
collective runs with that folder known.
"""

import posixpath
import secrets
import socket
import time
from typing import Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from mxrec.util.log import logger

MARKER_PREFIX = ".mxrec-shared-"
# How long a rank looks for a marker before it counts as not seen: an NFS client may serve
# a folder's cached listing for a few seconds (actimeo); a lookup of a new name goes to the
# server, but a retry costs nothing when the folder is shared.
MARKER_WAIT_S = 5.0
# Tokens travel as float64 through the ranks' sums: 52 bits stay exact.
_TOKEN_BITS = 52
# A rank-0 write that failed: the others learn it through the token.
_NOT_WRITTEN = -1.0
_UNCHECKED = 0.0

# (sums over the ranks of `values`, every rank's `mine` by rank): every rank calls it
# together, as the streaming trainer's `_sum_over_ranks` does.
Exchange = Callable[[List[float], float], Tuple[np.ndarray, np.ndarray]]


class NotSharedError(RuntimeError):
    """A folder the ranks must share is not the same folder on every rank."""


def marker_path(directory: str, token: int) -> str:
    return posixpath.join(directory, f"{MARKER_PREFIX}{token:013x}")


def write_marker(directory: str) -> int:
    """Writes a marker of a new random name into `directory` (made if missing); its token."""
    token = secrets.randbits(_TOKEN_BITS) | 1  # never 0 (_UNCHECKED)
    tf.io.gfile.makedirs(directory)
    with tf.io.gfile.GFile(marker_path(directory, token), "w") as f:
        f.write(f"written by rank 0 on {socket.gethostname()}\n")
    return token


def visible(path: str, wait: float = MARKER_WAIT_S) -> bool:
    """Whether `path` exists, looking again for up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        if tf.io.gfile.exists(path):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def check(directories: Sequence[Tuple[str, str]], rank: int, size: int, exchange: Exchange,
          may_be_read_only: Sequence[str] = (), wait: float = MARKER_WAIT_S) -> None:
    """Raises NotSharedError on every rank unless every rank sees rank 0's marker in each
    folder; every rank calls it together (two collectives through `exchange`).

    Args:
        directories: (what it is, e.g. "the model dir (--model-dir)", path) of each folder.
        rank, size: this rank and the rank count (nothing is checked for one rank).
        exchange: sums over the ranks (Exchange).
        may_be_read_only: paths rank 0 may be unable to write into (a data root mounted read
            only): left unchecked then, with a log line saying so.
        wait: seconds a rank looks for a marker.
    """
    if size <= 1 or not directories:
        return
    if len(directories) > 50:
        raise ValueError(f"shared_dirs.check: at most 50 folders, got {len(directories)}")
    tokens, problems = [_UNCHECKED] * len(directories), {}
    if rank == 0:
        for index, (what, path) in enumerate(directories):
            try:
                tokens[index] = float(write_marker(path))
            except (tf.errors.OpError, OSError) as error:
                if path in may_be_read_only:
                    logger.info("%s %s is not writable here (%s): every rank is taken to see "
                                "the same one", what, path, error)
                else:
                    tokens[index] = _NOT_WRITTEN
                    problems[index] = f"rank 0 cannot write into it: {error}"
    # A broadcast: rank 0's tokens summed with the others' zeros.
    tokens = np.asarray(exchange(tokens, 0.0)[0], np.float64)
    unseen = 0
    for index, (_, path) in enumerate(directories):
        token = int(tokens[index])
        if token > 0 and not visible(marker_path(path, token), wait):
            unseen |= 1 << index
    _, masks = exchange([], float(unseen))
    if rank == 0:
        for index, (_, path) in enumerate(directories):
            if tokens[index] > 0:
                _remove(marker_path(path, int(tokens[index])))
    _raise_if_unshared(directories, tokens, masks.astype(np.int64), rank, problems)


def _remove(path: str) -> None:
    try:
        tf.io.gfile.remove(path)
    except tf.errors.OpError as error:
        logger.warning("could not remove the shared-folder marker %s: %s", path, error)


def _raise_if_unshared(directories, tokens, masks: np.ndarray, rank: int, problems) -> None:
    lines = []
    host = socket.gethostname()
    for index, (what, path) in enumerate(directories):
        missing = [r for r, mask in enumerate(masks) if (int(mask) >> index) & 1]
        if tokens[index] == _NOT_WRITTEN:
            lines.append(f"{what} {path}: {problems.get(index, 'rank 0 cannot write into it')}")
        elif missing:
            mine = (f" (this is rank {rank} on {host}, which does not see it)"
                    if rank in missing else f" (this is rank {rank} on {host})")
            lines.append(f"{what} {path}: rank(s) {missing} do not see the marker rank 0 wrote "
                         f"there{mine}")
    if lines:
        raise NotSharedError(
            "every rank must see the same folder (one shared filesystem mounted at the same "
            "path on every host: docs/MULTIWORKER.md, \"Several hosts\"): " + "; ".join(lines))


def check_written(path: str, what: str, marker: str, rank: int, size: int,
                  count_unseen: Callable[[int], int], wait: float = MARKER_WAIT_S) -> None:
    """The same for one folder where rank 0 has written `marker` (a file in it) already,
    every rank knowing its name, and the ranks' collective sums one count:
    `count_unseen(1 if this rank does not see it else 0)` returns how many ranks do not.
    Raises NotSharedError on every rank when any does not."""
    if size <= 1:
        return
    not_seen = not visible(marker, wait)
    count = count_unseen(int(not_seen))
    if count:
        who = (f"this rank ({rank} on {socket.gethostname()}) does not see it"
               if not_seen else f"this is rank {rank} on {socket.gethostname()}")
        raise NotSharedError(
            f"{what} {path}: {count} of {size} ranks do not see {marker}, which rank 0 made "
            f"there ({who}): every rank must see the same folder (one shared filesystem "
            "mounted at the same path on every host: docs/MULTIWORKER.md, \"Several hosts\")")

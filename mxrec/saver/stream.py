"""Table files written and read in bounded chunks: checkpoints of tables larger than memory.

A table file of mxrec's Saver is an uncompressed `.npz` (a zip of `.npy` members, the format
`np.savez` writes and `np.load` reads). Here it is written member by member and chunk by
chunk straight into its file, hashed (SHA-256) as it goes, so a save never holds a whole
member in memory; and read back by mapping each member of a local file into memory
(`np.memmap`): a restore reads the rows it needs through the page cache, which the kernel
reclaims (under a memory cgroup too), instead of copying the file into the process.

The memory a save or restore may add is `checkpoint_memory_mb` (a `Saver` argument): the
rows of a chunk (a table's embedding and optimizer slots) are sized to fit it
(`chunk_rows`). A table's records (ID, device row, count, last-seen time, tier flag) go
through in chunks of as many IDs: the engine spools them on a save, and a restore of one
full file reads them mapped from it (a fold of deltas or a resharding holds them as
columns: `mxrec.saver.fold`).

Example:
    >>> entry = write_npz("/ckpt/.tmp-x/table-000.npz",
    ...                   [Member("host/keys", np.int64, (n,), lambda: iter([keys]))])
    >>> entry                                         # the manifest's entry
    {'bytes': 1234, 'sha256': '...'}
    >>> arrays = MappedNpz("/ckpt/full-000000000100/table-000.npz")
    >>> arrays["state/embedding"][1000:2000]          # read from the file, not held
"""

import ctypes
import hashlib
import io
import os
import posixpath
import shutil
import tempfile
import zipfile
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf

from mxrec.saver.manifest import CheckpointError
from mxrec.util import durable

# The default of `checkpoint_memory_mb`.
DEFAULT_MEMORY_MB = 256
# The fewest rows a chunk holds; a budget below what they need is refused.
MIN_CHUNK_ROWS = 256
# A chunk's rows are held about this many times at once (read, converted, written).
_COPIES = 3
# Bytes read at a time while hashing or copying a file.
_READ_BYTES = 8 << 20


def check_memory_mb(where: str, memory_mb) -> int:
    """`memory_mb` as an int, or an error naming `where` unless it is a positive integer."""
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, (int, np.integer)):
        raise TypeError(f"{where}: checkpoint_memory_mb must be an integer (MiB), "
                        f"got {memory_mb!r}")
    if memory_mb < 1:
        raise ValueError(f"{where}: checkpoint_memory_mb must be >= 1 (MiB), got {memory_mb}")
    return int(memory_mb)


def row_bytes(dim: int, states: int) -> int:
    """Bytes of one ID's rows over `states` (the embedding and the optimizer slots)."""
    return int(dim) * 4 * max(int(states), 1)


def check_fits(where: str, memory_mb: int, table: str, dim: int, states: int) -> None:
    """Refuses a budget below what one chunk of `table` needs (`MIN_CHUNK_ROWS` rows).

    Raises:
        ValueError: naming checkpoint_memory_mb, the table and the numbers.
    """
    need = MIN_CHUNK_ROWS * row_bytes(dim, states) * _COPIES
    if memory_mb << 20 < need:
        raise ValueError(
            f"{where}: checkpoint_memory_mb={memory_mb} MiB is below what one chunk of table "
            f"{table!r} needs: {MIN_CHUNK_ROWS} rows x dim {dim} x {states} state(s) "
            f"(embedding and optimizer slots) x 4 bytes x {_COPIES} copies = {need} bytes "
            f"({-(-need >> 20)} MiB); raise checkpoint_memory_mb")


def chunk_rows(memory_mb: int, dim: int, states: int) -> int:
    """Rows per chunk of a table within the budget (at least `MIN_CHUNK_ROWS`)."""
    return max(MIN_CHUNK_ROWS, (memory_mb << 20) // (row_bytes(dim, states) * _COPIES))


# ------------------------------------------------------------------------------ writing

# fallocate(2)'s FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE.
_PUNCH_HOLE = 0x01 | 0x02


def release_range(path: str, offset: int, length: int) -> None:
    """Frees `length` bytes of a local file's disk blocks at `offset` (they read as zeros
    after): a spool file copied into a checkpoint gives its disk back as the copy goes.
    Where the filesystem cannot (no hole punching), the file keeps its blocks until it is
    removed: only the disk's peak is higher."""
    if length <= 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_WRONLY)
    try:
        libc.fallocate(fd, _PUNCH_HOLE, ctypes.c_long(offset), ctypes.c_long(length))
    finally:
        os.close(fd)



class Member(NamedTuple):
    """One array of a table file: its name, dtype, shape and its chunks in order (each an
    array of `dtype` whose rows continue the previous chunk's)."""

    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]
    chunks: Callable[[], Iterator[np.ndarray]]


def whole(name: str, array: np.ndarray, rows: int = 1 << 20) -> Member:
    """A member from an array in memory, written `rows` rows at a time."""
    array = np.asarray(array)

    def chunks():
        if array.ndim == 0:
            yield array
            return
        for begin in range(0, len(array), rows):
            yield array[begin:begin + rows]

    return Member(name, array.dtype, array.shape, chunks)


class _HashingWriter:
    """A write-only stream that hashes what passes through it and refuses to seek, so that
    zipfile writes each member's sizes after its data (no seeking back)."""

    def __init__(self, raw):
        self._raw = raw
        # tf.io.gfile's files take bytes only; a local file takes the buffer as it is.
        self._as_bytes = not isinstance(raw, io.IOBase)
        self._hash = hashlib.sha256()
        self._bytes = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._raw.write(bytes(view) if self._as_bytes else view)
        self._hash.update(view)
        self._bytes += len(view)
        return len(view)

    def tell(self) -> int:
        return self._bytes

    def seek(self, *_):
        raise OSError("a checkpoint file is written in one pass")

    def flush(self) -> None:
        self._raw.flush()

    def entry(self) -> Dict:
        return {"bytes": self._bytes, "sha256": self._hash.hexdigest()}


def _open_for_writing(path: str):
    local = durable.local_path(path)
    return open(local, "wb") if local is not None else tf.io.gfile.GFile(path, "wb")


def write_npz(path: str, members: Iterable[Member]) -> Dict:
    """Writes an `.npz` of `members` at `path` (any filesystem tf.io.gfile knows), a chunk
    at a time; returns its manifest entry (bytes and SHA-256, hashed as written).

    Raises:
        CheckpointError: a member's chunks hold another number of rows than its shape says.
    """
    with _open_for_writing(path) as raw:
        stream = _HashingWriter(raw)
        with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for member in members:
                _write_member(archive, member, path)
        raw.flush()
        if durable.local_path(path) is not None:
            os.fsync(raw.fileno())
    return stream.entry()


def _write_member(archive: zipfile.ZipFile, member: Member, path: str) -> None:
    dtype = np.dtype(member.dtype)
    shape = tuple(int(s) for s in member.shape)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": shape}
    rows = 0
    with archive.open(member.name + ".npy", "w", force_zip64=True) as out:
        np.lib.format.write_array_header_1_0(out, header)
        for chunk in member.chunks():
            chunk = np.ascontiguousarray(chunk, dtype)
            rows += len(chunk) if chunk.ndim else 1
            out.write(memoryview(chunk).cast("B") if chunk.size else b"")
    if rows != (shape[0] if shape else 1):
        raise CheckpointError(f"writing {path}: array {member.name!r} got {rows} rows, "
                              f"its shape says {shape}")


# ------------------------------------------------------------------------------ reading


def file_digest(path: str) -> Dict:
    """{bytes, sha256} of a file, read `_READ_BYTES` at a time."""
    digest = hashlib.sha256()
    size = 0
    # A local file is read straight into each block (tf.io.gfile copies it once more).
    local = durable.local_path(path)
    with (open(local, "rb", buffering=0) if local is not None
          else tf.io.gfile.GFile(path, "rb")) as f:
        while True:
            block = f.read(_READ_BYTES)
            if not block:
                break
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def verify(path: str, expect: Dict) -> None:
    """Checks a file's size and SHA-256 against its manifest entry, reading it in blocks.

    Raises:
        CheckpointError: the file is missing, truncated or corrupted.
    """
    if not tf.io.gfile.exists(path):
        raise CheckpointError(f"checkpoint file {path} is missing")
    size = tf.io.gfile.stat(path).length
    if size != expect["bytes"]:
        raise CheckpointError(f"checkpoint file {path} is truncated: {size} bytes, the "
                              f"manifest says {expect['bytes']}")
    if file_digest(path)["sha256"] != expect["sha256"]:
        raise CheckpointError(f"checkpoint file {path} is corrupted: its SHA-256 does not "
                              "match the manifest")


class MappedNpz:
    """The arrays of a local, uncompressed `.npz`, each mapped from the file (`np.memmap`):
    indexing one reads those rows from the file (through the page cache).

    A member that cannot be mapped (compressed, or in Fortran order) is loaded whole.
    """

    def __init__(self, path: str):
        self.path = path
        self._arrays: Dict[str, np.ndarray] = {}
        with open(path, "rb") as raw, zipfile.ZipFile(raw) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                self._arrays[info.filename[:-4]] = _map_member(path, raw, archive, info)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __contains__(self, name: str) -> bool:
        return name in self._arrays

    def __iter__(self):
        return iter(self._arrays)

    def keys(self):
        return self._arrays.keys()

    def get(self, name: str, default=None):
        return self._arrays.get(name, default)


def _map_member(path: str, raw, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    if info.compress_type != zipfile.ZIP_STORED:
        with archive.open(info) as member:
            return np.lib.format.read_array(member)
    raw.seek(info.header_offset)
    local = raw.read(30)
    if local[:4] != b"PK\x03\x04":
        raise CheckpointError(f"checkpoint file {path}: member {info.filename} is damaged")
    name_bytes = int.from_bytes(local[26:28], "little")
    extra_bytes = int.from_bytes(local[28:30], "little")
    raw.seek(info.header_offset + 30 + name_bytes + extra_bytes)
    version = np.lib.format.read_magic(raw)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(raw)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(raw)
    if fortran or dtype.hasobject:
        with archive.open(info) as member:
            return np.lib.format.read_array(member)
    count = int(np.prod(shape)) if shape else 1
    if count == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=raw.tell(), shape=shape)


class LocalCopies:
    """Local paths of checkpoint files to map: a local file as it is; a file of another
    filesystem (tf.io.gfile) copied, a block at a time, into a temporary folder that
    `close` removes."""

    def __init__(self):
        self._folder: Optional[str] = None

    def local(self, path: str) -> str:
        local = durable.local_path(path)
        if local is not None:
            return local
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="mxrec-restore-")
        target = os.path.join(self._folder, f"{len(os.listdir(self._folder))}-"
                                            f"{posixpath.basename(path)}")
        with tf.io.gfile.GFile(path, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, _READ_BYTES)
        return target

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def chunks_of(count: int, rows: int) -> List[Tuple[int, int]]:
    """[(begin, end)] covering range(count) in pieces of `rows`."""
    return [(begin, min(count, begin + rows)) for begin in range(0, count, max(rows, 1))]


def rechunked(chunks: Iterable[np.ndarray], rows: int) -> Iterator[np.ndarray]:
    """The arrays of `chunks` joined and cut again into pieces of `rows` (the last one
    shorter)."""
    held: List[np.ndarray] = []
    count = 0
    for chunk in chunks:
        held.append(chunk)
        count += len(chunk)
        while count >= rows:
            joined = np.concatenate(held)
            yield joined[:rows]
            held, count = [joined[rows:]], count - rows
    if count:
        yield np.concatenate(held)

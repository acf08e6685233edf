"""The streaming trainer's donefile: one JSON line per trained partition, replaced atomically.

A line is written only after the partition's checkpoint version (and serving
version, when exporting) is complete, so the last line names the newest state a
restart may resume from. The file is rewritten whole into a temporary name, flushed
to the disk and renamed over the old one (mxrec.util.durable.write_atomic): a reader (or
a restart) sees the old or the new file, never a torn line, even after a power loss.

Line fields: partition, day, step (= checkpoint version), checkpoint ("full" or
"delta"), export_version (or null), metrics (progressive validation), rows
(trained), lines, bad_lines, evicted, table_rows, ranks (the ranks that trained it; rows,
lines, bad_lines, evicted and table_rows are sums over them), exchange (the engine of
several ranks: "grpc" or "mpi"; null in one process), seconds, time. On several
ranks rank 0 alone writes it.
"""

import json
from typing import Dict, List

import tensorflow as tf

from mxrec.util import durable


def read(path: str) -> List[Dict]:
    """Every entry of the donefile at `path`; [] when there is none."""
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path, "r") as f:
        text = f.read()
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"donefile {path}:{number} is not JSON: {error}") from error
    return entries


def create(path: str) -> None:
    """Writes an empty donefile where there is none: from a model's first start on, a
    missing donefile means a lost one, never a model that recorded nothing yet."""
    if not tf.io.gfile.exists(path):
        durable.write_atomic(path, "")


def append(path: str, entry: Dict) -> None:
    """Adds one line, atomically (write a new file, rename it over the old)."""
    lines = [json.dumps(e, sort_keys=True) for e in read(path)]
    lines.append(json.dumps(entry, sort_keys=True))
    durable.write_atomic(path, "\n".join(lines) + "\n")


__all__ = ["read", "create", "append"]

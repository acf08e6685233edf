"""Time partitions of a data root, listed in time order through tf.io.gfile.

Layout (ElasticCTR's HDFS folders; any filesystem tf.io.gfile knows):

    ROOT/20240101/00/part-00000 ... _SUCCESS     an hourly partition "20240101/00"
    ROOT/20240101/01/...
    ROOT/20240102/part-00000 ... _SUCCESS        a daily partition "20240102"

A partition is ready once its done marker (`_SUCCESS` unless configured) exists;
its data are the other files of the folder, by name, skipping names that start
with "_" or "." (markers, temporary files). A day folder is a partition of its
own when it holds the done marker itself; otherwise its two-digit subfolders
are the hourly partitions. Partitions are ordered by (day, hour), a day's own
partition before its hours.

Example:
    >>> [p.name for p in list_partitions("/data/stream")]
    ['20240101/00', '20240101/01', '20240102']
"""

import calendar
import dataclasses
import posixpath
import re
from typing import List, Optional

import tensorflow as tf

DONE_MARKER = "_SUCCESS"
_DAY_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
_HOUR_RE = re.compile(r"^(\d{2})$")


@dataclasses.dataclass(frozen=True)
class Partition:
    """One ready partition.

    Attributes:
        name: "yyyyMMdd/hh" or "yyyyMMdd".
        path: its folder.
        day: "yyyyMMdd".
        hour: 0-23, or None for a daily partition.
        files: its data files, by name.
    """

    name: str
    path: str
    day: str
    hour: Optional[int]
    files: tuple

    @property
    def timestamp(self) -> int:
        """Seconds since the epoch (UTC) of the partition's start."""
        match = _DAY_RE.match(self.day)
        year, month, day = (int(g) for g in match.groups())
        return calendar.timegm((year, month, day, self.hour or 0, 0, 0))

    @property
    def sort_key(self):
        return (self.day, -1 if self.hour is None else self.hour)


def _entries(path: str) -> List[str]:
    return sorted(entry.rstrip("/") for entry in tf.io.gfile.listdir(path))


def _data_files(path: str, entries: List[str]) -> tuple:
    return tuple(posixpath.join(path, e) for e in entries
                 if not e.startswith(("_", ".")) and not tf.io.gfile.isdir(posixpath.join(path, e)))


def partition_at(root: str, name: str, done_marker: str = DONE_MARKER) -> Optional[Partition]:
    """The partition `name` ("yyyyMMdd" or "yyyyMMdd/hh") of `root` if it is ready, else None.

    Raises:
        ValueError: a name of another form.
    """
    parts = name.strip("/").split("/")
    if not _DAY_RE.match(parts[0]) or len(parts) > 2 or (
            len(parts) == 2 and not _HOUR_RE.match(parts[1])):
        raise ValueError(f"partition name {name!r} is not yyyyMMdd or yyyyMMdd/hh")
    path = posixpath.join(root, *parts)
    if not tf.io.gfile.isdir(path):
        return None
    entries = _entries(path)
    if done_marker not in entries:
        return None
    hour = int(parts[1]) if len(parts) == 2 else None
    if hour is not None and hour > 23:
        raise ValueError(f"partition {name!r}: hour {hour} is not 00-23")
    return Partition("/".join(parts), path, parts[0], hour, _data_files(path, entries))


def list_partitions(root: str, done_marker: str = DONE_MARKER) -> List[Partition]:
    """Every ready partition under `root`, in time order.

    Raises:
        FileNotFoundError: `root` is not a folder.
    """
    if not tf.io.gfile.isdir(root):
        raise FileNotFoundError(f"data root {root!r} is not a folder")
    found = []
    for day in _entries(root):
        if not _DAY_RE.match(day):
            continue
        day_path = posixpath.join(root, day)
        if not tf.io.gfile.isdir(day_path):
            continue
        entries = _entries(day_path)
        if done_marker in entries:
            found.append(Partition(day, day_path, day, None, _data_files(day_path, entries)))
        for hour in entries:
            if _HOUR_RE.match(hour) and int(hour) < 24 and \
                    tf.io.gfile.isdir(posixpath.join(day_path, hour)):
                partition = partition_at(root, f"{day}/{hour}", done_marker)
                if partition is not None:
                    found.append(partition)
    return sorted(found, key=lambda p: p.sort_key)


def of_granularity(partitions: List[Partition], granularity: Optional[str]) -> List[Partition]:
    """The daily (ROOT/yyyyMMdd) or hourly (ROOT/yyyyMMdd/hh) ones of `partitions`; all of
    them for None."""
    if granularity is None:
        return list(partitions)
    return [p for p in partitions if (p.hour is None) == (granularity == "daily")]


def unready(root: str, done_marker: str = DONE_MARKER) -> List[str]:
    """What under `root` is not a ready partition, for messages: data files directly in
    the root, entries not named yyyyMMdd, and day or hour folders without their marker.

    Example:
        >>> unready("/data/flat")
        ['data files directly in /data/flat (part-0.txt, part-1.txt): ...']
    """
    if not tf.io.gfile.isdir(root):
        return [f"{root} is not a folder"]
    entries = _entries(root)
    files = [e for e in entries if not tf.io.gfile.isdir(posixpath.join(root, e))]
    folders = [e for e in entries if e not in files]
    found = []
    data = [f for f in files if not f.startswith(("_", "."))]
    if data:
        found.append(f"data files directly in {root} ({_some(data)}): put each partition's "
                     "files in a folder ROOT/yyyyMMdd or ROOT/yyyyMMdd/hh")
    other = [e for e in folders if not _DAY_RE.match(e)]
    if other:
        found.append(f"folders not named yyyyMMdd ({_some(other)})")
    waiting = []
    for day in (e for e in folders if _DAY_RE.match(e)):
        day_entries = _entries(posixpath.join(root, day))
        if done_marker in day_entries:
            continue
        hours = [h for h in day_entries if _HOUR_RE.match(h)
                 and tf.io.gfile.isdir(posixpath.join(root, day, h))]
        waiting += [f"{day}/{h}" for h in hours
                    if done_marker not in _entries(posixpath.join(root, day, h))]
        if not hours:
            waiting.append(day)
    if waiting:
        found.append(f"{len(waiting)} partition folder(s) without their done marker "
                     f"{done_marker!r}, not ready yet ({_some(waiting)})")
    return found


def _some(names: List[str], count: int = 3) -> str:
    return ", ".join(names[:count]) + (f", ... ({len(names)} in all)"
                                       if len(names) > count else "")


__all__ = ["DONE_MARKER", "Partition", "list_partitions", "of_granularity", "partition_at",
           "unready"]

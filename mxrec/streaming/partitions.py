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

A folder whose name is no date yyyyMMdd (20241301, 20240230, 2024-01-01) or, inside a
day, a number that is no hour 00-23 (24, 7) is skipped with a warning naming it, logged
once per folder and process (not on every poll of a watching trainer); names that start
with "_" or "." are skipped silently, and so are other names inside a day folder (a daily
partition's data files are not looked at one by one on every poll).

Example:
    >>> [p.name for p in list_partitions("/data/stream")]
    ['20240101/00', '20240101/01', '20240102']
"""

import calendar
import dataclasses
import datetime
import posixpath
import re
from typing import List, Optional

import tensorflow as tf
from absl import logging

DONE_MARKER = "_SUCCESS"
_DAY_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
_HOUR_RE = re.compile(r"^(\d{2})$")
_NUMBER_RE = re.compile(r"^[0-9]+$")
# Folders already warned about: a watching trainer lists the root on every poll, and a
# folder with a bad name stays there until someone moves it. Log de-duplication only.
_WARNED = set()


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


def day_fault(name: str) -> Optional[str]:
    """Why `name` is no day folder name yyyyMMdd of a date that exists, or None."""
    match = _DAY_RE.match(name)
    if not match:
        return "not a date yyyyMMdd"
    try:
        datetime.date(*(int(g) for g in match.groups()))
    except ValueError as error:
        return f"not a date yyyyMMdd ({error})"
    return None


def hour_fault(name: str) -> Optional[str]:
    """Why `name` is no hour folder name 00-23, or None."""
    if not _HOUR_RE.match(name) or int(name) > 23:
        return "not an hour 00-23"
    return None


def _skip(path: str, fault: str) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        logging.warning("streaming: skipping folder %s: %s", path, fault)


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def partition_at(root: str, name: str, done_marker: str = DONE_MARKER) -> Optional[Partition]:
    """The partition `name` ("yyyyMMdd" or "yyyyMMdd/hh") of `root` if it is ready, else None.

    Raises:
        ValueError: a name of another form, or no date or hour (20241301, 20240101/24).
    """
    parts = name.strip("/").split("/")
    fault = day_fault(parts[0]) if len(parts) <= 2 else "not yyyyMMdd or yyyyMMdd/hh"
    if fault is None and len(parts) == 2:
        fault = hour_fault(parts[1])
    if fault is not None:
        raise ValueError(f"partition name {name!r} is not yyyyMMdd or yyyyMMdd/hh: {fault}")
    path = posixpath.join(root, *parts)
    if not tf.io.gfile.isdir(path):
        return None
    entries = _entries(path)
    if done_marker not in entries:
        return None
    hour = int(parts[1]) if len(parts) == 2 else None
    return Partition("/".join(parts), path, parts[0], hour, _data_files(path, entries))


def list_partitions(root: str, done_marker: str = DONE_MARKER) -> List[Partition]:
    """Every ready partition under `root`, in time order; folders named no date, or a
    number that is no hour, are skipped with a warning (once per folder).

    Raises:
        FileNotFoundError: `root` is not a folder.
    """
    if not tf.io.gfile.isdir(root):
        raise FileNotFoundError(f"data root {root!r} is not a folder")
    found = []
    for day in _entries(root):
        day_path = posixpath.join(root, day)
        if _hidden(day) or not tf.io.gfile.isdir(day_path):
            continue
        fault = day_fault(day)
        if fault is not None:
            _skip(day_path, fault)
            continue
        entries = _entries(day_path)
        if done_marker in entries:
            found.append(Partition(day, day_path, day, None, _data_files(day_path, entries)))
        for hour in entries:
            hour_path = posixpath.join(day_path, hour)
            if not _NUMBER_RE.match(hour) or not tf.io.gfile.isdir(hour_path):
                continue
            fault = hour_fault(hour)
            if fault is not None:
                _skip(hour_path, fault)
                continue
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
    the root, folders named no date yyyyMMdd or a number that is no hour 00-23, and day
    or hour folders without their marker.

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
    days = [e for e in folders if not _hidden(e) and day_fault(e) is None]
    other = [e for e in folders if not _hidden(e) and e not in days]
    waiting = []
    for day in days:
        day_entries = _entries(posixpath.join(root, day))
        subfolders = [h for h in day_entries if _NUMBER_RE.match(h)
                      and tf.io.gfile.isdir(posixpath.join(root, day, h))]
        hours = [h for h in subfolders if hour_fault(h) is None]
        other += [f"{day}/{h}" for h in subfolders if h not in hours]
        if done_marker in day_entries:
            continue
        waiting += [f"{day}/{h}" for h in hours
                    if done_marker not in _entries(posixpath.join(root, day, h))]
        if not hours:
            waiting.append(day)
    if other:
        found.append(f"folders that are no date yyyyMMdd or hour 00-23 "
                     f"({_some(other)})")
    if waiting:
        found.append(f"{len(waiting)} partition folder(s) without their done marker "
                     f"{done_marker!r}, not ready yet ({_some(waiting)})")
    return found


def _some(names: List[str], count: int = 3) -> str:
    return ", ".join(names[:count]) + (f", ... ({len(names)} in all)"
                                       if len(names) > count else "")


__all__ = ["DONE_MARKER", "Partition", "day_fault", "hour_fault", "list_partitions",
           "of_granularity", "partition_at", "unready"]

"""Which versions a restore reads.

A restore reads the last full save at or before the wanted step and every delta after it,
in step order (`chain`; `read_chain` reads their manifests and the last version's
dense.npz, for checks before anything loads). `locate` tells a directory of
mxrec Saver versions (or one version folder) from a TF checkpoint. The table files fold
into one state per table in `mxrec.saver.fold`, as columns: a full save replaces the
state, a delta removes its removed IDs and overwrites the records and rows of the IDs it
holds, and every rank's file folds into the whole table.
"""

import posixpath
import re
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from mxrec.saver import manifest as manifest_io
from mxrec.saver.manifest import CheckpointError

_VERSION_DIR = re.compile(r"^(full|delta)-(\d{12})$")
Version = Tuple[str, Dict, Dict[str, Dict[str, np.ndarray]]]  # kind, manifest, files


def locate(path: str) -> Optional[Tuple[str, Optional[int]]]:
    """(directory, step) when `path` is a directory of mxrec Saver versions (step None: its
    latest) or one version of it (`<dir>/full-000000000100`); None for anything else (a TF
    checkpoint)."""
    if not isinstance(path, str) or not path:
        return None
    path = path.rstrip("/")
    match = _VERSION_DIR.match(posixpath.basename(path))
    if match and tf.io.gfile.exists(posixpath.join(path, "manifest.json")):
        return posixpath.dirname(path), int(match.group(2))
    if tf.io.gfile.isdir(path) and manifest_io.list_versions(path):
        return path, None
    return None


def read_chain(directory: str, version: Optional[int] = None) -> List[Version]:
    """The versions a restore of `version` (a step; None: the latest) reads, in order: their
    manifests, each delta's predecessor checked, and the last version's dense.npz (verified
    against its manifest), for checks before any table is read. The table files are read
    by `mxrec.saver.fold.open_chain`, mapped, not here.

    Raises:
        CheckpointError: nothing to read, a broken chain, a bad or missing file.
    """
    out = []
    previous_step = None
    steps = chain(manifest_io.list_versions(directory), version, directory)
    for index, (kind, step) in enumerate(steps):
        only = ("dense.npz",) if index == len(steps) - 1 else ()
        manifest, arrays = manifest_io.read_version(directory, kind, step, only=only)
        check_link(directory, kind, step, manifest, previous_step)
        out.append((kind, manifest, arrays))
        previous_step = step
    return out


def check_link(directory: str, kind: str, step: int, manifest: Dict,
               previous_step: Optional[int]) -> None:
    """Checks one version of a chain read in step order: a delta follows the version read
    before it (`previous_step`), and every file its tables name is in its manifest.

    Raises:
        CheckpointError: a delta whose base is missing; a table file the manifest omits.
    """
    if kind == "delta" and manifest["previous"] != previous_step:
        raise CheckpointError(
            f"delta checkpoint at step {step} follows step {manifest['previous']}, "
            f"which is missing from {directory}; cannot apply it")
    for name in manifest["tables"]:
        for file_name in manifest_io.table_files(manifest, name):
            if file_name not in manifest["files"]:
                raise CheckpointError(
                    f"checkpoint {manifest_io.version_name(kind, step)} in {directory}: "
                    f"table {name!r} names file {file_name}, which its manifest does "
                    "not list; the version is damaged")


def chain(versions: List[Tuple[str, int]], version: Optional[int], directory: str
          ) -> List[Tuple[str, int]]:
    """The full save and the deltas to apply, for `version` (a step) or the latest.

    Args:
        versions: (kind, step) of the directory's versions, by step.
        version: the step to restore; None for the latest.
        directory: for messages.
    """
    if version is not None:
        versions = [v for v in versions if v[1] <= version]
        if not any(step == version for _, step in versions):
            raise CheckpointError(f"no checkpoint at step {version} in {directory} "
                                  "(restore_model_version)")
    fulls = [step for kind, step in versions if kind == "full"]
    if not fulls:
        raise CheckpointError(f"no full checkpoint in {directory}"
                              + ("" if version is None else f" at or before step {version}"))
    base = fulls[-1]
    return [("full", base)] + [(k, s) for k, s in versions if k == "delta" and s > base]

"""One ID's bytes in each training tier of a table, as the engine lays its rows out.

The host and SSD tiers store an ID's components (the embedding, then each optimizer slot)
one after another, the embedding in `storage_dtype` and the slots in `slot_dtype`
(cc_ops/engine/row_format.h, `RowLayout`); an SSD record adds its header. Rather than
repeat that layout here, `measure` reads it from the engine: a scratch table of the same
width and element types, with the same slot components, spills one row to an SSD file, and
its tier statistics give `host_row_bytes` (RowLayout's bytes of all components) and
`ssd_record_bytes` (the record in the file). The device holds the same components in the
same dtypes (the table variable and its slot variables), so its bytes per row are the host
tier's values.

    >>> measure(64, "bfloat16", "float32", slots=1)
    TierBytes(device=384, host=384, ssd=400)
"""

import dataclasses
import functools
import itertools
import os
import tempfile
from typing import List, Optional

import numpy as np

from mxrec._lib import loader
from mxrec.saver import manifest as manifest_io

_SCRATCH = itertools.count()


@dataclasses.dataclass(frozen=True)
class TierBytes:
    """Bytes of one ID's row and optimizer slots: in the device variables, in a host-tier
    slot (its values), and in an SSD record (header and values)."""

    device: float
    host: float
    ssd: float


@functools.cache
def measure(dim: int, storage: str, slot_dtype: str = "float32", slots: int = 1) -> TierBytes:
    """The engine's bytes per ID of a table of `dim` whose rows rest in `storage` and its
    `slots` optimizer slots in `slot_dtype`.

    Raises:
        RuntimeError: the engine spilled no record (its SSD tier did not start).
    """
    engine = loader.engine()
    key = f"__mxrec_quality_layout_{os.getpid()}_{next(_SCRATCH)}"
    components = ["embedding"] + [f"slot{i}" for i in range(slots)]
    with tempfile.TemporaryDirectory(prefix="mxrec-quality-layout-") as path:
        # One device row and one host slot: the third ID's row reaches the SSD file.
        engine.create_table(key=key, name=key, dim=dim, capacity=1, host_capacity=1,
                            ssd_capacity=4, ssd_path=path, storage_dtype=storage,
                            slot_dtype=slot_dtype)
        try:
            for name in components[1:]:
                engine.tier_register(key, name)
            for batch in range(3):
                (_, _, reused), = engine.process([key], [np.array([batch + 1], np.int64)],
                                                 True, batch)
                for name in components:
                    engine.tier_swap(key, name, reused, np.zeros((len(reused), dim), np.float32))
            stats = dict(engine.tier_stats(key))
        finally:
            engine.drop_prefix(key)
    if not stats.get("ssd_record_bytes"):
        raise RuntimeError(f"mxrec.quality: the engine's SSD tier spilled no record of a "
                           f"scratch table ({stats.get('ssd_rows', 0)} SSD rows)")
    return TierBytes(device=int(stats["host_row_bytes"]), host=int(stats["host_row_bytes"]),
                     ssd=int(stats["ssd_record_bytes"]))


def slot_counts(checkpoint_dir: str) -> dict:
    """{table: optimizer slots} of the latest version in `checkpoint_dir` (the states its
    manifest lists besides the embedding), or {} without a version.

    Raises:
        CheckpointError: the latest version's manifest is missing, corrupted or of another
            format.
    """
    versions = manifest_io.list_versions(checkpoint_dir)
    if not versions:
        return {}
    tables = manifest_io.read_manifest(checkpoint_dir, *versions[-1]).get("tables", {})
    return {name: len([s for s in entry.get("state", []) if s != "embedding"])
            for name, entry in tables.items()}


def per_id(tables: List[tuple], storage: str, slot_dtype: str = "float32",
           slots: Optional[dict] = None) -> TierBytes:
    """The mean bytes per ID over `tables`, [(name, IDs, dim)], weighted by their IDs, each
    table measured with its slot count (`slots[name]`, 1 if unknown: Adagrad's)."""
    slots = slots or {}
    total, sums = 0, [0, 0, 0]
    for name, ids, dim in tables:
        got = measure(dim, storage, slot_dtype, slots.get(name, 1))
        for i, value in enumerate((got.device, got.host, got.ssd)):
            sums[i] += ids * value
        total += ids
    total = max(total, 1)
    return TierBytes(*(s / total for s in sums))

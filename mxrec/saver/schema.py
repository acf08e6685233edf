"""Every field a table file of mxrec's Saver stores, defined once.

`mxrec.saver.checkpoint` writes a table's file through these names and `mxrec.saver.merge`
reads it through them; the format on disk is the one the layout in checkpoint.py's docstring
describes (and older checkpoints keep loading: nothing here changed a name or a position).

A table file (`.npz`) holds:
- `host/<name>` for each of `HOST_ARRAYS`: the host table's records (one entry per ID:
  keys, device rows or -1, counts, last seen), its free rows and the IDs removed since the
  save before (deltas);
- `host/scalars`: int64 `[next_row, newest_timestamp, counting_frozen]` (`SCALARS`, in
  that order);
- `host/access_threshold`: float64 scalar;
- `state/<state>`: the device rows of each state (embedding, optimizer slots) of the IDs
  with a device row, in their order in `host/keys`;
- tables with a host tier: `host/<name>` for each of `TIER_ARRAYS`, and per state
  `tier/<state>` (values of the in_host IDs) with `tier_mask/<state>` (0 where the tier
  held no value).

While a restore folds versions, each ID's record is a `Record`.
"""

from typing import Dict

import numpy as np

HOST_ARRAYS = ("keys", "rows", "counts", "last_seen", "free_rows", "removed")
SCALARS = ("next_row", "newest_timestamp", "counting_frozen")
TIER_ARRAYS = ("in_host", "lru_rows", "lru_ages")
SCALARS_KEY = "host/scalars"
ACCESS_THRESHOLD_KEY = "host/access_threshold"


def host_key(name: str) -> str:
    return f"host/{name}"


def state_key(state: str) -> str:
    return f"state/{state}"


def tier_key(state: str) -> str:
    return f"tier/{state}"


def tier_mask_key(state: str) -> str:
    return f"tier_mask/{state}"


def names_with_prefix(arrays: Dict[str, np.ndarray], prefix: str):
    """The `<name>`s of the arrays `<prefix>/<name>` (states, tier states), in file order."""
    return [k[len(prefix) + 1:] for k in arrays if k.startswith(prefix + "/")]


def pack_scalars(host: Dict) -> np.ndarray:
    """`host/scalars` from an engine export (`export_state`)."""
    return np.array([int(host[name]) for name in SCALARS], np.int64)


def scalar(scalars: np.ndarray, name: str) -> int:
    """One of `SCALARS` read from a `host/scalars` array."""
    return int(scalars[SCALARS.index(name)])


def with_scalars(scalars: np.ndarray, **values: int) -> np.ndarray:
    """A copy of a `host/scalars` array with the named scalars replaced."""
    out = np.array(scalars, np.int64)
    for name, value in values.items():
        out[SCALARS.index(name)] = value
    return out

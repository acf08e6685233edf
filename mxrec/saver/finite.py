"""The finiteness check that stands between a trained model and what mxrec publishes.

A NaN or an infinity in one row of a table, an optimizer slot or a dense weight makes every
prediction that touches it NaN, and training on from it spreads the damage. The Saver (on
request) and the serving export and delta (by default) look at every value they are about to
write and refuse, before writing anything, with a `NonFiniteError` that names each table or
variable at fault, how many values are not finite there, and one ID (or index) to look at.

Example:
    >>> faults = []
    >>> faults += table_faults("user", "embedding", ids, rows)    # rows [N, dim], ids [N]
    >>> faults += dense_faults("dense/kernel", kernel)
    >>> raise_if_any(faults, "Saver.save: step 100 (full) into /ckpt")
"""

from typing import List, NamedTuple, Sequence

import numpy as np

from mxrec.saver.manifest import CheckpointError


class NonFiniteError(CheckpointError):
    """A model about to be saved or exported holds a NaN or an infinity; nothing was written.

    Attributes:
        faults: the `Fault`s found (on several ranks: this rank's own; a rank whose own
            values are finite has none and names the ranks at fault in its message).
    """

    def __init__(self, message: str, faults: Sequence["Fault"] = ()):
        super().__init__(message)
        self.faults = list(faults)


class Fault(NamedTuple):
    """The non-finite values of one array about to be written."""

    what: str  # "table 'user' embedding", "table 'user' host tier adagrad/accumulator", ...
    count: int  # values that are NaN or +-inf
    example: str  # "ID 42" (a table) or "index (3, 1)" (a dense variable)

    def describe(self) -> str:
        return f"{self.what}: {self.count} non-finite value(s), e.g. {self.example}"


def _non_finite(values: np.ndarray) -> np.ndarray:
    """Where `values` is NaN or +-inf (False everywhere for integer arrays)."""
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.inexact):
        return np.zeros(values.shape, bool)
    return ~np.isfinite(values)


def table_faults(table: str, state: str, ids: np.ndarray, rows: np.ndarray) -> List[Fault]:
    """The fault of rows [N, dim] of one table state (embedding, a slot) keyed by ids [N];
    [] when every value is finite."""
    bad = _non_finite(rows)
    if not bad.any():
        return []
    bad_rows = bad.reshape(len(bad), -1).any(axis=1)
    example = int(np.asarray(ids)[np.argmax(bad_rows)])
    return [Fault(f"table {table!r} {state}", int(bad.sum()), f"ID {example}")]


def dense_faults(name: str, value) -> List[Fault]:
    """The fault of one dense variable's value; [] when it is finite (or not a float)."""
    bad = _non_finite(value)
    if not bad.any():
        return []
    index = tuple(int(i) for i in np.unravel_index(np.argmax(bad), bad.shape))
    return [Fault(f"variable {name!r}", int(bad.sum()), f"index {index}")]


def describe(faults: Sequence[Fault], most: int = 6) -> str:
    """The first `most` faults, then how many more (a NaN spreads to every weight: the first
    ones say where to look, the whole list would bury them)."""
    shown = "; ".join(fault.describe() for fault in faults[:most])
    if len(faults) > most:
        shown += f"; and {len(faults) - most} more array(s)"
    return shown


def raise_if_any(faults: Sequence[Fault], refusing: str) -> None:
    """Raises NonFiniteError when `faults` is not empty.

    Args:
        faults: what the check found.
        refusing: what is refused, for the message ("Saver.save: step 100 (full) into DIR").
    """
    if faults:
        raise NonFiniteError(f"{refusing}: refused, nothing written: the model is not finite: "
                             f"{describe(faults)}", faults)


__all__ = ["NonFiniteError", "Fault", "table_faults", "dense_faults", "describe",
           "raise_if_any"]

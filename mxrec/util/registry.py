"""What a higher layer provides to a lower one: one registry of named slots.

A module never imports a layer above its own (tests/test_layers.py). Where a lower layer
needs something only a higher one has, the higher one fills a slot here and the lower one
reads it; an empty slot means the behaviour without the higher layer. Every slot is listed
below, with who fills it and who reads it:

- `WING`: filled by `mxrec.distributed.multirank.setup` (`init()` on several ranks) with a
  `MultiRank`; read by `mxrec.core.wing.current()`. Empty: one process (`OneProcess`).
- `RANKS`: filled by `mxrec.distributed.communication` on import with its (rank, size)
  queries; read by `mxrec.util.ranks`. Empty: rank 0 of 1.
- `CONFIG`: filled by `mxrec.util.config` on import with `get_config_initializer`; read by
  `mxrec.util.ops` (`set_threshold` finds its table there). Empty: `init()` was not called.
- `ITERATOR_INITIALIZER`: filled by `mxrec.graph.modifier` on import with `get_initializer`;
  read by `mxrec.util.config.get_initializer`. Empty: no graph was rewritten.
- `TARGET_BATCH`: filled by `mxrec.graph.modifier` on import with `get_target_batch`; read
  by `TrainParamsConfig.get_target_batch`. Empty: no graph was rewritten.
- `END_OF_DATA`: filled by `mxrec.distributed.end_of_data` on import (by
  `multirank.setup`) with `agree`; read by `mxrec.util.eos` (`eos_map` on several ranks).
  Empty: one process.
- `LOOKUP_OVERRIDE`: filled by `mxrec.export.saved_model` for the export's graph with
  `serving_lookup`; read by `mxrec.core.table.lookup_override`. Empty: the key stage.

`LOOKUP_OVERRIDE` is filled for one graph: its value is kept on that graph (freed with it, as
`mxrec.core.graph_state` keeps its state), the others for the process.

Example:
    >>> provide(RANKS, (get_rank_id, get_rank_size))   # mxrec.distributed.communication
    >>> rank_id, _ = provided(RANKS)                    # mxrec.util.ranks
"""

from typing import Any, Dict

WING = "wing"
RANKS = "ranks"
CONFIG = "config"
ITERATOR_INITIALIZER = "iterator_initializer"
TARGET_BATCH = "target_batch"
LOOKUP_OVERRIDE = "lookup_override"
END_OF_DATA = "end_of_data"

_PROCESS_SLOTS = frozenset({WING, RANKS, CONFIG, ITERATOR_INITIALIZER, TARGET_BATCH,
                            END_OF_DATA})
_GRAPH_SLOTS = frozenset({LOOKUP_OVERRIDE})
_SLOTS = _PROCESS_SLOTS | _GRAPH_SLOTS
_GRAPH_ATTRIBUTE = "_mxrec_provided"

_filled: Dict[str, Any] = {}


def _check(slot: str, graph) -> None:
    if slot not in _SLOTS:
        raise ValueError(f"mxrec.util.registry: no slot {slot!r}; the slots are "
                         f"{sorted(_SLOTS)}")
    if (graph is None) != (slot in _PROCESS_SLOTS):
        raise ValueError(f"mxrec.util.registry: slot {slot!r} is filled per graph"
                         if graph is None else
                         f"mxrec.util.registry: slot {slot!r} is filled for the process, "
                         "not for one graph")


def provide(slot: str, value, graph=None) -> None:
    """Fills `slot` with `value` (None empties it); a per-graph slot for `graph` only.

    Raises:
        ValueError: no such slot, or `graph` given for a process slot (or missing for a
            per-graph one).
    """
    _check(slot, graph)
    if graph is None:
        _filled[slot] = value
        return
    per_graph = getattr(graph, _GRAPH_ATTRIBUTE, None)
    if per_graph is None:
        per_graph = {}
        setattr(graph, _GRAPH_ATTRIBUTE, per_graph)
    per_graph[slot] = value


def provided(slot: str, graph=None):
    """What fills `slot` (for `graph`, a per-graph slot), or None while it is empty.

    Raises:
        ValueError: as `provide`.
    """
    _check(slot, graph)
    if graph is None:
        return _filled.get(slot)
    return getattr(graph, _GRAPH_ATTRIBUTE, {}).get(slot)

"""mxrec.util.registry: what a higher layer provides to a lower one, by named slot."""

import gc
import weakref

import pytest
import tensorflow as tf

from mxrec.core import table, wing
from mxrec.util import ranks, registry


def test_empty_slots_give_the_behaviour_without_the_higher_layer(monkeypatch):
    monkeypatch.setattr(registry, "_filled", {})
    assert registry.provided(registry.RANKS) is None
    assert (ranks.get_rank_id(), ranks.get_rank_size()) == (0, 1)
    assert type(wing.current()) is wing.OneProcess


def test_a_filled_slot_is_what_the_lower_layer_reads(monkeypatch):
    monkeypatch.setattr(registry, "_filled", {})
    registry.provide(registry.RANKS, (lambda: 2, lambda: 4))
    assert (ranks.get_rank_id(), ranks.get_rank_size()) == (2, 4)
    behaviour = wing.OneProcess()
    registry.provide(registry.WING, behaviour)
    assert wing.current() is behaviour
    registry.provide(registry.WING, None)
    assert wing.current() is not behaviour


def test_a_per_graph_slot_belongs_to_its_graph():
    graph, other = tf.Graph(), tf.Graph()
    registry.provide(registry.LOOKUP_OVERRIDE, print, graph=graph)
    assert table.lookup_override(graph) is print
    assert table.lookup_override(other) is None
    held = weakref.ref(graph)
    del graph
    gc.collect()
    assert held() is None


@pytest.mark.parametrize("slot,graph,match", [
    ("no_such_slot", None, "no slot 'no_such_slot'"),
    (registry.LOOKUP_OVERRIDE, None, "filled per graph"),
    (registry.WING, "graph", "filled for the process"),
])
def test_a_wrong_slot_is_refused(slot, graph, match):
    with pytest.raises(ValueError, match=match):
        registry.provide(slot, None, graph=tf.Graph() if graph else None)
    with pytest.raises(ValueError, match=match):
        registry.provided(slot, graph=tf.Graph() if graph else None)

"""checkpoint.tier_components: a folded table's host-tier values in the engine's import form,
against a per-ID loop."""

import numpy as np
import pytest

from mxrec.saver.checkpoint import tier_components


def _reference(entries, dim):
    names = sorted({n for entry in entries for n in entry})
    present = np.zeros(len(entries), np.uint32)
    packed = np.zeros((len(entries), len(names), dim), np.float32)
    for i, entry in enumerate(entries):
        for c, name in enumerate(names):
            if name in entry:
                present[i] |= np.uint32(1 << c)
                packed[i, c] = entry[name]
    return names, present, packed


@pytest.mark.parametrize("seed", range(6))
def test_matches_a_per_id_loop_with_absent_components(seed):
    rng = np.random.default_rng(seed)
    dim = int(rng.integers(1, 9))
    components = ["embedding", "Adagrad/accumulator", "Adam/m", "Adam/v"][:rng.integers(1, 5)]
    entries = []
    for _ in range(int(rng.integers(0, 300))):
        held = [n for n in components if rng.random() < 0.7]
        entries.append({n: rng.normal(size=dim).astype(np.float32) for n in held})
    got, want = tier_components(entries, dim), _reference(entries, dim)
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    if entries and len(components) > 1:
        assert got[1].min() != got[1].max(), "the case needs entries lacking a component"


def test_no_entries_and_entries_without_values():
    names, present, packed = tier_components([], 4)
    assert names == [] and present.shape == (0,) and packed.shape == (0, 0, 4)
    names, present, packed = tier_components([{}, {"embedding": np.ones(2, np.float32)}], 2)
    assert names == ["embedding"]
    np.testing.assert_array_equal(present, [0, 1])
    np.testing.assert_array_equal(packed[:, 0], [[0, 0], [1, 1]])

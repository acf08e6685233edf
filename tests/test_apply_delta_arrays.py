"""sparse.apply_delta_arrays (a serving table after a delta) against a per-ID reference:
the base's IDs in their order minus the removed ones, changed rows replaced where they stand,
new IDs appended in the delta's order."""

import numpy as np
import pytest

from mxrec.saver.sparse import apply_delta_arrays

DIM = 3


def _reference(base, delta):
    rows = {}
    order = []
    for k, row in zip(base["ids"].tolist(), base["embeddings"]):
        if k not in rows:
            order.append(k)
        rows[k] = row
    removed = set(delta.get("removed", np.zeros([0], np.int64)).tolist())
    order = [k for k in order if k not in removed]
    for k, row in zip(delta.get("ids", np.zeros([0], np.int64)).tolist(),
                      delta.get("embeddings", np.zeros([0, DIM], np.float32))):
        if k not in rows or k in removed:
            order.append(k)
        rows[k] = row
    ids = np.array(order, np.int64)
    emb = np.array([rows[k] for k in order], np.float32).reshape(-1, DIM)
    return ids, emb


def _case(rng, base_size, changed, added, removed):
    # even IDs (negative ones too) in the base, odd ones new
    base_ids = (rng.choice(1 << 61, base_size, replace=False).astype(np.int64)
                - (1 << 60)) * 2
    base = {"ids": base_ids,
            "embeddings": rng.standard_normal((base_size, DIM)).astype(np.float32)}
    pick = rng.permutation(base_size)
    changed_ids = base_ids[pick[:changed]]
    removed_ids = base_ids[pick[changed:changed + removed]]
    new_ids = rng.choice(1 << 40, added, replace=False).astype(np.int64) * 2 + 1
    d_ids = np.concatenate([changed_ids, new_ids])
    rng.shuffle(d_ids)
    delta = {"ids": d_ids,
             "embeddings": rng.standard_normal((len(d_ids), DIM)).astype(np.float32),
             "removed": removed_ids}
    return base, delta


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("sizes", [(0, 0, 5, 0), (50, 0, 0, 0), (50, 50, 0, 0), (50, 10, 10, 10),
                                   (2000, 700, 900, 300), (2000, 0, 0, 2000), (1, 1, 1, 0)])
def test_matches_the_per_id_reference(seed, sizes):
    rng = np.random.default_rng(seed)
    base, delta = _case(rng, *sizes)
    out = apply_delta_arrays(base, delta, "t")
    ids, emb = _reference(base, delta)
    np.testing.assert_array_equal(out["ids"], ids)
    np.testing.assert_array_equal(out["embeddings"], emb)
    assert out["embeddings"].dtype == np.float32 and out["ids"].dtype == np.int64


def test_a_base_id_twice_takes_the_delta_at_its_last_place():
    base = {"ids": np.array([5, 9, 5], np.int64),
            "embeddings": np.arange(9, dtype=np.float32).reshape(3, DIM)}
    delta = {"ids": np.array([5, 4], np.int64),
             "embeddings": np.full([2, DIM], -1, np.float32)}
    out = apply_delta_arrays(base, delta)
    np.testing.assert_array_equal(out["ids"], [5, 9, 5, 4])
    np.testing.assert_array_equal(out["embeddings"][:, 0], [0, 3, -1, -1])


def test_the_base_is_left_as_it_was():
    rng = np.random.default_rng(3)
    base, delta = _case(rng, 100, 40, 20, 10)
    before = {k: v.copy() for k, v in base.items()}
    apply_delta_arrays(base, delta)
    for k in before:
        np.testing.assert_array_equal(base[k], before[k])


def test_bad_deltas_name_the_table():
    base = {"ids": np.array([1, 2], np.int64), "embeddings": np.zeros([2, DIM], np.float32)}
    with pytest.raises(ValueError, match="'user'.*twice"):
        apply_delta_arrays(base, {"ids": np.array([3, 3]),
                                  "embeddings": np.zeros([2, DIM], np.float32)}, "user")
    with pytest.raises(ValueError, match="'user'.*both changed and removed"):
        apply_delta_arrays(base, {"ids": np.array([1]), "embeddings": np.zeros([1, DIM]),
                                  "removed": np.array([1])}, "user")
    with pytest.raises(ValueError, match=r"'user'.*must be \[1, 3\]"):
        apply_delta_arrays(base, {"ids": np.array([1]), "embeddings": np.zeros([1, 2])}, "user")
    with pytest.raises(ValueError, match="unknown keys"):
        apply_delta_arrays(base, {"rows": np.array([1])}, "user")

"""What the mx_rec-style demos trained, read out of a session, and a NumPy forward pass over
it: the references their train-then-predict tests compare against."""

import numpy as np
import tensorflow as tf

from mxrec.core import dynamic, tiers
from mxrec.core.table import graph_tables

BATCH, USER_FEATURES, ITEM_FEATURES, USER_RANGE, ITEM_RANGE = 32, 4, 6, 3000, 2000


def trained_state(sess):
    """({table: {id: row}}, {dense variable: value}) of the session's graph: every admitted
    ID's embedding wherever it lives (device, host or SSD tier, dynamic store) and the MLP."""
    tables = {}
    for name, table in graph_tables(sess.graph).items():
        if isinstance(table, dynamic.DynamicTable):
            ids, values = dynamic.export_values(table)
        elif tiers.is_tiered(table):
            ids, values = tiers.export_values(sess, table, slots=False)["embedding"]
        else:
            ids, rows = table.export_rows()
            values = sess.run(table.variable)[rows]
        tables[name] = dict(zip(ids.tolist(), np.asarray(values)))
    dense = {v.op.name: sess.run(v)
             for v in sess.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
             if v.op.name.startswith("mlp/")}
    return tables, dense


def assert_same_state(got, want):
    """Bit for bit: a restore copies values, it computes nothing."""
    got_tables, got_dense = got
    want_tables, want_dense = want
    assert sorted(got_tables) == sorted(want_tables)
    for name, rows in want_tables.items():
        assert len(rows) > 0, name
        assert sorted(got_tables[name]) == sorted(rows), f"{name}: IDs differ"
        for key, value in rows.items():
            np.testing.assert_array_equal(got_tables[name][key], value, err_msg=f"{name}/{key}")
    assert sorted(got_dense) == sorted(want_dense) and want_dense
    for name, value in want_dense.items():
        np.testing.assert_array_equal(got_dense[name], value, err_msg=name)


def eval_batches(batches=3):
    """The demos' evaluation data (seed 2): [(user_ids, item_ids, label_0, label_1)]."""
    rng = np.random.default_rng(2)
    out = []
    for _ in range(batches):
        out.append((rng.integers(0, USER_RANGE, (BATCH, USER_FEATURES)),
                    rng.integers(0, ITEM_RANGE, (BATCH, ITEM_FEATURES)),
                    rng.integers(0, 2, BATCH).astype(np.float32),
                    rng.integers(0, 2, BATCH).astype(np.float32)))
    return out


def _pooled(rows, ids, dim, default):
    """Sum of the rows of ids (an ID without a row reads `default`), float64."""
    missing = np.full(dim, default, np.float64)
    return np.stack([sum((np.asarray(rows.get(int(i), missing), np.float64) for i in line),
                         np.zeros(dim)) for line in ids])


def logits(state, user_ids, item_ids, hidden, default=0.0, lookup_times=2):
    """The demos' forward pass in NumPy: [user, item] + [user] * lookup_times pooled
    embeddings, ReLU layers `hidden` (variable prefixes), two heads. `default`: what an
    evaluation lookup gives an ID without a row (the lookup's serving_default_value)."""
    tables, dense = state
    user_dim = len(next(iter(tables["user_table"].values())))
    item_dim = len(next(iter(tables["item_table"].values())))
    user = _pooled(tables["user_table"], user_ids, user_dim, default)
    x = np.concatenate([user, _pooled(tables["item_table"], item_ids, item_dim, default)]
                       + [user] * lookup_times, axis=1)
    for name in hidden:
        x = np.maximum(x @ dense[f"mlp/{name}_w"] + dense[f"mlp/{name}_b"], 0)
    return [(x @ dense[f"mlp/head{h}_w"] + dense[f"mlp/head{h}_b"])[:, 0] for h in (0, 1)]


def cross_entropy(logit, label):
    return np.mean(np.maximum(logit, 0) - logit * label + np.log1p(np.exp(-np.abs(logit))))

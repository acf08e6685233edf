"""get_asc_insert_func plans its specs in packed key-stage calls (a round of consecutive specs
of distinct tables per call): every spec's planned rows, restore index and reused rows must be
those of the engine planning each spec alone, in spec order, on twin tables with the same
settings (admission thresholds, eviction between batches so rows are reused, a table with two
specs, int32 and int64 IDs)."""

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func, planned_tensors, start_asc_pipeline
from mxrec.core.embedding import create_table
from mxrec.util.initialize import get_config_initializer, init

# table: (device rows, admission threshold)
_TABLES = {"t_user": (300, 0.0), "t_item": (400, 2.0), "t_cat": (200, 1.0)}
# spec name, batch key, table, dtype: user and user2 share a table (two rounds)
_SPECS = [("user", "user", "t_user", np.int64), ("item", "item", "t_item", np.int32),
          ("user2", "user2", "t_user", np.int64), ("cat", "cat", "t_cat", np.int64)]
_BATCHES, _ROWS = 12, 16


def _features():
    rng = np.random.default_rng(7)
    out = {}
    for _, key, _, dtype in _SPECS:
        # IDs from a pool that moves on with the batches, so old IDs age out.
        start = np.repeat(np.arange(_BATCHES) * 6, _ROWS)[:, None]
        out[key] = (start + rng.integers(0, 60, size=(_BATCHES * _ROWS, 3))).astype(dtype)
    out["timestamp"] = np.repeat(1000 + 10 * np.arange(_BATCHES), _ROWS).astype(np.int64)
    return out


def test_insert_func_packed_rounds_match_per_spec_plans():
    init()
    start_asc_pipeline()
    engine = loader.engine()
    twins = {}
    for name, (capacity, threshold) in _TABLES.items():
        table = create_table(tf.int64, 4, name, tf.zeros_initializer(),
                             device_vocabulary_size=capacity)
        table.configure_admission(access_threshold=threshold)
        twins[name] = f"test_feature_spec_packed/{name}"
        engine.create_table(key=twins[name], name=name, dim=4, capacity=capacity)
        engine.configure_admission(twins[name], access_threshold=threshold)
    specs = [FeatureSpec(name, table_name=table, index_key=key)
             for name, key, table, _ in _SPECS] + [FeatureSpec("timestamp", is_timestamp=True)]
    features = _features()
    dataset = tf.data.Dataset.from_tensor_slices(features).batch(_ROWS)
    dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
    # No prefetch that tf.data would inject: each batch is planned in the step that reads it,
    # so the eviction after a step comes before the next batch's plan on both sides.
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    dataset = dataset.with_options(options)
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    planned = [planned_tensors(batch, spec) for spec in specs[:-1]]
    runtime = get_config_initializer()
    reused_seen = 0
    try:
        with tf.compat.v1.Session() as session:
            for b in range(_BATCHES):
                got = session.run(planned)
                stamp = 1000 + 10 * b
                for (name, key, table, _), (rows, restore, reused) in zip(_SPECS, got):
                    ids = features[key][b * _ROWS:(b + 1) * _ROWS].reshape(-1).astype(np.int64)
                    (want,) = engine.process([twins[table]], [ids], train=True,
                                             timestamp=stamp)
                    for label, x, y in zip(("rows", "restore", "reused"), want,
                                           (rows, restore, reused)):
                        np.testing.assert_array_equal(y, x, err_msg=f"batch {b}, {name}, {label}")
                    reused_seen += len(reused)
                for table in _TABLES:
                    engine.evict(runtime.table_key(table), 25)
                    engine.evict(twins[table], 25)
        assert reused_seen > 0  # eviction freed rows that later batches reused
        for table in _TABLES:
            want = engine.export_state(twins[table])
            have = engine.export_state(runtime.table_key(table))
            for field in ("keys", "rows", "counts", "last_seen"):
                np.testing.assert_array_equal(np.asarray(have[field]), np.asarray(want[field]),
                                              err_msg=f"{table} {field}")
    finally:
        engine.drop_prefix("test_feature_spec_packed/")

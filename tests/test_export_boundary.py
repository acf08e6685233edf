"""Row exports at the step boundary: batches planned ahead (deferred, not yet committed by
their step) are not part of `export_rows(at_boundary=True)` nor of dynamic.export_values,
as they are not part of a checkpoint."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from mxrec.core import dynamic


@pytest.fixture
def table(engine):
    key = "test_export_boundary/t"
    engine.create_table(key=key, name="t", dim=4, capacity=8, padding_keys=[],
                        access_threshold=0.0, faae_coefficient=1.0)
    yield key
    engine.drop_prefix("test_export_boundary/")


def _export(engine, key, at_boundary):
    ids, rows = engine.export_rows(key, at_boundary=at_boundary)
    return dict(zip(ids.tolist(), rows.tolist()))


def test_pending_batch_left_out_and_refilled_rows_given_back(engine, table):
    # IDs 1..6 take rows 0..5 at times 0..5; evicting at age 2 from time 5 frees 1..3's rows.
    for t, key_id in enumerate(range(1, 7)):
        engine.process([table], [np.array([key_id], np.int64)], True, t)
    engine.evict(table, 2)
    trained = _export(engine, table, at_boundary=False)
    assert sorted(trained) == [4, 5, 6]
    assert _export(engine, table, at_boundary=True) == trained

    # A deferred batch: ID 4 again (seen), 100..104 new (two refill freed rows 0..2).
    batch = np.array([4, 100, 101, 102, 103, 104], np.int64)
    ((_, _, _, batch_id),) = engine.process([table], [batch], True, 6, True)
    planned = _export(engine, table, at_boundary=False)
    assert set(planned) == {4, 5, 6, 100, 101, 102, 103, 104}
    assert _export(engine, table, at_boundary=True) == trained

    engine.commit(table, batch_id)
    assert _export(engine, table, at_boundary=True) == planned


def test_no_table(engine):
    with pytest.raises(Exception, match="test_export_boundary/none"):
        engine.export_rows("test_export_boundary/none", at_boundary=True)


def test_dynamic_export_values_with_a_planned_batch(engine):
    """An exported dynamic table with a batch planned ahead: the trained rows only (it
    failed with 'address ... which no ID of the table holds' before)."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import test_dynamic_expansion as model  # noqa: PLC0415 (its model, not a fixture)

    graph = tf.Graph()
    with graph.as_default():
        ph, train, tables = model._model(True, model.OPTIMIZERS["adagrad"][1]())  # noqa: SLF001
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in model._stream()[:5]:  # noqa: SLF001
                sess.run(train, {ph[k]: v for k, v in batch.items()})
            table = tables[0]
            ids, values = dynamic.export_values(table)
            accumulator = table.optimizers[0].store_slot("accumulator")
            _, slot = dynamic.export_values(table, accumulator)
            new = np.arange(10**12, 10**12 + 300, dtype=np.int64)
            engine.process([table.table_key], [new], True, 99, True)
            assert engine.pending_batches(table.table_key) == 1
            later_ids, later_values = dynamic.export_values(table)
            np.testing.assert_array_equal(later_ids, ids)
            np.testing.assert_array_equal(later_values, values)
            np.testing.assert_array_equal(dynamic.export_values(table, accumulator)[1], slot)
            assert not np.isin(new, later_ids).any()

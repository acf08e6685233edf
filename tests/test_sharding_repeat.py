"""id_exchange.repeat_by_counts against np.repeat (the owner's IDs repeated by their
occurrences over the global batch, for admission)."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.distributed.id_exchange import repeat_by_counts


def _run(values, counts):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        return sess.run(repeat_by_counts(tf.constant(values), tf.constant(counts)))


@pytest.mark.parametrize("counts", [[3, 1, 2], [0, 2, 0, 0, 5, 0], [1], [], [0, 0],
                                    [10000, 1, 1, 3]])
def test_repeat_by_counts_equals_numpy(counts):
    counts = np.asarray(counts, np.int64)
    values = np.arange(len(counts), dtype=np.int64) * 7 + 11
    got = _run(values, counts)
    np.testing.assert_array_equal(got, np.repeat(values, counts))
    assert got.dtype == np.int64


def test_repeat_by_counts_power_law_counts():
    rng = np.random.default_rng(0)
    counts = np.minimum(rng.zipf(1.3, 5000), 20000).astype(np.int32)
    values = rng.integers(-2**62, 2**62, len(counts), dtype=np.int64)
    got = _run(values, counts)
    np.testing.assert_array_equal(got, np.repeat(values, counts))

"""Independent references the tests compare mxrec against."""

import numpy as np
import tensorflow as tf


class RefKeyStage:
    """Plain-Python model of one table's key stage (threshold 0, no eviction).

    IDs get rows in order of first occurrence; padding keys and, in evaluation,
    unseen IDs take the default index len(unique_rows).
    """

    def __init__(self, capacity, padding_keys=()):
        self.capacity = capacity
        self.padding = set(int(k) for k in padding_keys)
        self.rows = {}

    def process(self, ids, train=True):
        """Returns (unique_rows, restore) like the engine; OverflowError when full."""
        unique, local, restore, new = [], {}, [], []
        for key in (int(k) for k in ids):
            if key in self.padding or (not train and key not in self.rows):
                restore.append(None)
                continue
            if key not in local:
                local[key] = len(unique)
                unique.append(key)
                if key not in self.rows:
                    new.append(key)
            restore.append(local[key])
        if len(self.rows) + len(new) > self.capacity:
            raise OverflowError(len(self.rows) + len(new) - self.capacity)
        for key in new:
            self.rows[key] = len(self.rows)
        default = len(unique)
        return (np.array([self.rows[k] for k in unique], np.int32),
                np.array([default if r is None else r for r in restore], np.int32))

    def export(self):
        ids = np.array(list(self.rows), np.int64)
        return ids, np.array([self.rows[k] for k in ids.tolist()], np.int32)


def distinct_rows_initializer(seed=0):
    """A seeded initializer that makes a distinct value per row, for any row count.

    The rows it gives a table are read back after the variables are
    initialised (see `initial_rows`), so tests know every row's start value.
    """
    return tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=seed)


def initial_rows(sess, table):
    """The table's initial values [capacity, dim]; checks that all rows differ."""
    values = sess.run(table.variable)
    assert len(np.unique(values, axis=0)) == len(values)
    return values


def power_law_ids(rng, vocab, shape, alpha=1.2):
    """IDs drawn from `vocab` with P(rank k) ~ 1 / (k + 1)^alpha (many repeats)."""
    p = 1.0 / np.arange(1, len(vocab) + 1) ** alpha
    return vocab[rng.choice(len(vocab), size=shape, p=p / p.sum())]


def int64_vocab(rng, size):
    """`size` distinct int64 IDs spread over the whole range, extremes included."""
    extremes = np.array([-(2**63), 2**63 - 1, 0, -1], np.int64)
    spread = rng.integers(-(2**63), 2**63 - 1, size=size * 2, dtype=np.int64, endpoint=True)
    vocab = np.unique(np.concatenate([extremes, spread]))
    vocab = np.concatenate([extremes, rng.permutation(np.setdiff1d(vocab, extremes))])
    return vocab[:size]

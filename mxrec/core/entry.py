"""PaddlePaddle-style admission policies and entry point.

    entry = CountFilterEntry(10)            # a row once an ID was seen 10 times
    entry = ProbabilityEntry(0.1, seed=7)   # a row for a fixed 10% of IDs, the same on rerun
    emb = sparse_embedding(ids, size=[1_000_000, 16], padding_idx=0, entry=entry)
    shrink(threshold=7)                     # drop IDs unseen for 7 shrink periods (days)
"""

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from mxrec.core.embedding import SparseEmbedding, create_table, sparse_lookup
from mxrec.util.config import get_config_initializer


class CountFilterEntry:
    """Admits an ID once it has been seen `count_filter` times."""

    def __init__(self, count_filter: int):
        if isinstance(count_filter, bool) or not isinstance(count_filter, (int, np.integer)) \
                or count_filter < 0:
            raise ValueError(f"CountFilterEntry: count_filter must be an int >= 0, "
                             f"got {count_filter!r}")
        self.count_filter = int(count_filter)

    def apply(self, table: SparseEmbedding):
        table.configure_admission(access_threshold=self.count_filter)


class ProbabilityEntry:
    """Admits each ID with probability `probability`, decided once per ID.

    The decision is a hash of (ID, seed), so a rerun with the same seed admits
    exactly the same IDs, and an ID that is not admitted never is.
    """

    def __init__(self, probability: float, seed: int = 0):
        if not 0.0 < probability <= 1.0:
            raise ValueError(f"ProbabilityEntry: probability must be in (0, 1], "
                             f"got {probability!r}")
        self.probability = float(probability)
        self.seed = int(seed)

    def apply(self, table: SparseEmbedding):
        table.configure_admission(probability=self.probability, seed=self.seed)


def sparse_embedding(input, size: Sequence[int], padding_idx: Optional[int] = None,  # noqa: A002
                     is_test: bool = False, entry=None, param_attr=None, dtype="float32",
                     name: Optional[str] = None) -> tf.Tensor:
    """Paddle's `sparse_embedding` on an mxrec table.

    Args:
        input: int64 IDs of any rank >= 1.
        size: [device rows, dim].
        padding_idx: an ID that looks up as zeros and is never counted or updated.
        is_test: lookup without inserting or counting.
        entry: CountFilterEntry or ProbabilityEntry; None admits every ID.
        param_attr: an initializer (default truncated normal, stddev 0.01).
        name: the table's name; a second call with the same name shares the table.

    Returns:
        input.shape + [dim] embeddings.
    """
    if dtype not in ("float32", tf.float32):
        raise TypeError(f"sparse_embedding: dtype must be float32, got {dtype!r}")
    if len(size) != 2:
        raise ValueError(f"sparse_embedding: size must be [rows, dim], got {size!r}")
    if entry is not None and not isinstance(entry, (CountFilterEntry, ProbabilityEntry)):
        raise TypeError(f"sparse_embedding: entry must be CountFilterEntry or ProbabilityEntry, "
                        f"got {type(entry).__name__}")
    name = name or "sparse_embedding"
    runtime = get_config_initializer()
    table = runtime.tables.get(name)
    if table is None or table.variable.graph is not tf.compat.v1.get_default_graph():
        initializer = param_attr or tf.compat.v1.truncated_normal_initializer(stddev=0.01)
        table = create_table(tf.int64, int(size[1]), name, initializer,
                             device_vocabulary_size=int(size[0]),
                             padding_keys=None if padding_idx is None else [padding_idx])
        if entry is not None:
            entry.apply(table)
    return sparse_lookup(table, input, is_train=not is_test)


def shrink(threshold: int) -> int:
    """Ages every table's IDs by one period and removes those unseen for `threshold` periods.

    Returns:
        IDs removed over all tables.
    """
    runtime = get_config_initializer()
    return sum(table.shrink(threshold)
               for table in runtime.tables.values())

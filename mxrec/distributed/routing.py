"""Tables sharded across ranks: each rank owns the IDs `owner(id) == rank` of every table.

A sharded lookup on N ranks runs in three phases, a module each:

- route (this module, rank-local, no collective): which rank owns each ID, and the plan
  of what goes where: the batch's unique IDs, their occurrence counts and owner buckets.
- exchange (mxrec.distributed.id_exchange): the collectives that bring the IDs to their
  owners; the owner runs its key stage and device lookup on what it received.
- send-back (mxrec.distributed.send_back): the owner's embeddings back to the ranks that
  asked, and their gradients the same way in reverse.

The direct path runs the three in the step; the graph modifier splits them between the input
pipeline (`route`), a planning subgraph (the exchange, the key stage, the send-back's plan)
and the step (mxrec.distributed.sharded_pipeline).

    ids ─► unique (local) ─► occurrences per unique ID, owner per unique ID
        ─► buckets [N, chunk, 2] of (ID, occurrence count) (chunk: the largest bucket of any
           rank, from an all-reduce; send_count under init(use_dynamic=False))
        ─► one all-to-all: rank r receives every rank's IDs that r owns
        ─► owner: the received IDs with their occurrence counts as weights ─► the table's
           own key stage and device lookup (admission counts every occurrence of the global
           batch; eviction, tiers and reused rows run on the owner as in one process)
        ─► embeddings [N, chunk, dim] ─► all-to-all back ─► one gather: each flat ID's row
           (`positions`: owner x chunk + slot of its unique ID)
    backward: the gradient takes the same path in reverse (the transpose of an equal-chunk
    all-to-all is another all-to-all); the owner's segment sums add the ranks' gradients of an
    ID, and `all2all_gradients_op="sum_gradients_and_div_by_ranksize"` divides them by N.

The owner of an ID (`owner_of`) is documented and independent of the rank count's form:
    owner(id) = ((id * 0x9E3779B97F4A7C15 mod 2^64) >> 33) mod N
(a Fibonacci hash: consecutive IDs spread over the ranks), so any N works and a checkpoint
written by N ranks is re-partitioned by the same function on M ranks.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from mxrec.distributed import sharded_ops

# 0x9E3779B97F4A7C15 as a signed 64-bit integer (TF multiplies int64 with wrap-around).
_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)
_SHIFT = 33


def owner_of(ids: tf.Tensor, size: int) -> tf.Tensor:
    """The rank that owns each ID (int32), for int64 `ids`."""
    mixed = tf.math.multiply(ids, tf.constant(_MULTIPLIER, tf.int64))
    # A logical shift: on uint64 bits, then back (the value fits in 31 bits).
    high = tf.bitwise.right_shift(tf.bitcast(mixed, tf.uint64), tf.constant(_SHIFT, tf.uint64))
    return tf.cast(tf.math.floormod(tf.bitcast(high, tf.int64), size), tf.int32)


def owner_of_numpy(ids: np.ndarray, size: int) -> np.ndarray:
    """owner_of in NumPy (checkpoints, tests)."""
    mixed = np.asarray(ids, np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(_SHIFT)) % np.uint64(size)).astype(np.int32)


@dataclasses.dataclass
class Route:
    """The rank-local part of a lookup (no collective): where each local unique ID goes.

    Attributes:
        pairs: [U, 2] int64, (ID, occurrence count) of the unique IDs sorted by owner.
        counts: [N] int32, unique IDs per owner.
        where: [U, 2] int32, (owner, slot in that owner's bucket) per sorted unique ID.
        order: [U] int32, the unique IDs' order sorted by owner.
        index: [n] int32, position of each flat ID among the unique IDs.
    """

    pairs: tf.Tensor
    counts: tf.Tensor
    where: tf.Tensor
    order: tf.Tensor
    index: tf.Tensor


def route(ids: tf.Tensor, size: int) -> Route:
    """Local dedupe, occurrence counts and owner buckets of `ids` (any rank >= 1), in one
    op (MxrecRoute, on the CPU): the values of `route_reference`, bit for bit."""
    pairs, counts, where, order, index = sharded_ops.route(tf.cast(ids, tf.int64), size)
    return Route(pairs=pairs, counts=counts, where=where, order=order, index=index)


def route_reference(ids: tf.Tensor, size: int) -> Route:
    """`route` composed of TensorFlow ops: the reference the op is tested against
    (tests/test_route_op.py). Unique IDs in first-occurrence order (tf.unique), sorted by
    owner with a stable sort, so an owner's IDs keep that order."""
    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    uniq, index = tf.unique(flat, out_idx=tf.int32)
    num = tf.size(uniq)
    occurrences = tf.math.unsorted_segment_sum(tf.ones_like(index, tf.int64), index, num)
    owner = owner_of(uniq, size)
    order = tf.argsort(owner, stable=True)
    owner_sorted = tf.gather(owner, order)
    counts = tf.math.bincount(owner, minlength=size, maxlength=size, dtype=tf.int32)
    starts = tf.cumsum(counts, exclusive=True)
    position = tf.range(num) - tf.gather(starts, owner_sorted)
    where = tf.stack([owner_sorted, position], axis=1)
    # IDs and their occurrence counts travel together.
    pairs = tf.stack([tf.gather(uniq, order), tf.gather(occurrences, order)], axis=1)
    return Route(pairs=pairs, counts=counts, where=where, order=order, index=index)

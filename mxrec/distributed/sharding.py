"""Tables sharded across ranks: each rank owns the IDs `owner(id) == rank` of every table.

One lookup on N ranks (direct path), per step: `route` (rank-local), `exchange` (the
collectives that bring the IDs to their owners), the owner's key stage and device lookup,
`send_back`. The graph modifier runs the same pieces, split between the input pipeline
(`route`), a planning subgraph (`exchange`, key stage) and the step (mxrec.graph.sharded).

    ids ─► unique (local) ─► occurrences per unique ID, owner per unique ID
        ─► buckets [N, chunk, 2] of (ID, occurrence count) (chunk: the largest bucket of any
           rank, from an all-reduce; send_count under init(use_dynamic=False))
        ─► one all-to-all: rank r receives every rank's IDs that r owns
        ─► owner: the IDs repeated by their occurrences ─► the table's own key stage and
           device lookup (admission counts every occurrence of the global batch; eviction,
           tiers and reused rows run on the owner as in one process)
        ─► embeddings [N, chunk, dim] ─► all-to-all back ─► each rank's unique IDs ─► positions
    backward: the gradient takes the same path in reverse (the transpose of an equal-chunk
    all-to-all is another all-to-all); the owner's segment sums add the ranks' gradients of an
    ID, and `all2all_gradients_op="sum_gradients_and_div_by_ranksize"` divides them by N.

The owner of an ID (`owner_of`) is documented and independent of the rank count's form:
    owner(id) = ((id * 0x9E3779B97F4A7C15 mod 2^64) >> 33) mod N
(a Fibonacci hash: consecutive IDs spread over the ranks), so any N works and a checkpoint
written by N ranks is re-partitioned by the same function on M ranks.
"""

import dataclasses
import weakref
import zlib
from typing import Optional

import numpy as np
import tensorflow as tf

from mxrec.distributed import communication

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


def _fingerprint(table, send_count, is_train) -> int:
    text = (f"{table.table_name}|{table.dim}|{table.key_dtype.name}|{send_count}|{is_train}|"
            f"{table.all2all_gradients_op}")
    return zlib.crc32(text.encode()) & 0x3FFFFFFF


def agreed_max(table, value: tf.Tensor, fingerprint: int, fields: str) -> tf.Tensor:
    """The largest `value` (int32 scalar) over all ranks, after checking in the same
    all-reduce (max of the fingerprint and of its negation) that every rank built this lookup
    alike; `fields` names what the fingerprint covers, for the error."""
    summary = communication.allreduce(
        tf.stack([value, tf.constant(fingerprint), tf.constant(-fingerprint)]), "max")
    agree = tf.debugging.Assert(
        tf.equal(summary[1], -summary[2]),
        [f"sparse_lookup on table {table.table_name!r}: the ranks built different lookups "
         f"({fields} differ between ranks, or the ranks build their graphs in different "
         "orders); every rank must run the same model"])
    with tf.control_dependencies([agree]):
        return tf.identity(summary[0])


_GET_NEXT = ("IteratorGetNext", "IteratorGetNextSync")
_WALK_LIMIT = 10000  # ops visited back from a lookup's IDs in search of their iterators
# graph -> names of the MakeIterator ops that already wait for the ranks
_FENCED = weakref.WeakKeyDictionary()


def fence_iterators(ids: tf.Tensor) -> int:
    """Makes the initializers of the iterators that `ids` come from wait for every rank.

    Each initializer (MakeIterator) gets a small all-reduce as a control input. Why: a step
    that ends in OutOfRangeError does not advance its kind's sequence of step ids
    (communication.allreduce), so the next step of the same kind reuses that step id. When
    the two follow each other directly (evaluating twice in a row, training again after the
    data ended) a rank must not start the reused step while a peer still finishes the
    failed one: the initializer run between them is the point where every rank meets.
    Iterators fed through a string handle are not reached from the graph and are not
    fenced (docs/MULTIWORKER.md). Returns how many initializers were fenced now.
    """
    graph = ids.graph
    fenced = _FENCED.setdefault(graph, set())
    todo, seen, makers = [ids.op], {ids.op.name}, {}
    while todo and len(seen) < _WALK_LIMIT:
        op = todo.pop()
        if op.type in _GET_NEXT:  # one iterator may feed several get_next ops
            makers.update((user.name, user) for user in op.inputs[0].consumers()
                          if user.type == "MakeIterator" and user.name not in fenced)
            continue
        for tensor in op.inputs:
            if tensor.op.name not in seen:
                seen.add(tensor.op.name)
                todo.append(tensor.op)
    for maker in makers.values():
        fenced.add(maker.name)
        with graph.as_default(), graph.name_scope(None), tf.control_dependencies(None), \
                tf.name_scope("mxrec_iterator_fence"):
            fence = communication.allreduce(tf.constant(0, tf.int32), "sum")
        maker._add_control_input(fence.op)  # noqa: SLF001 (no public way on a built op)
    return len(makers)


def batch_time(local_time: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
    """The global batch's time: the newest local time over all ranks."""
    if local_time is None:
        return None
    return communication.allreduce(tf.cast(local_time, tf.int64), "max")


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


@dataclasses.dataclass
class Exchange:
    """The IDs one rank received as owner, and where they go back.

    Attributes:
        chunk: scalar int32, rows per peer of this step's all-to-alls.
        valid: [V] int32, the received slots that hold an ID.
        owned: [M] int64, the IDs to plan on the owner (training: each repeated by its
            occurrences over the global batch).
        first: [V] int32, the position in `owned` of each received ID's first copy.
    """

    chunk: tf.Tensor
    valid: tf.Tensor
    owned: tf.Tensor
    first: tf.Tensor


def route(ids: tf.Tensor, size: int) -> Route:
    """Local dedupe, occurrence counts and owner buckets of `ids` (any rank >= 1)."""
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


def exchange(table, routed: Route, is_train: bool, send_count: Optional[int]) -> Exchange:
    """Sends each rank's unique IDs (and occurrence counts) to their owners: one
    all-reduce (the chunk, and a check that every rank built the same lookup) and one
    all-to-all."""
    size = communication.get_rank_size()
    counts = routed.counts
    # One all-reduce gives the largest bucket and checks that every rank built this lookup
    # of the same table (name, dim, key type, send_count): max and -min of a fingerprint.
    largest = agreed_max(table, tf.reduce_max(counts), _fingerprint(table, send_count, is_train),
                         "table name, dim, key dtype, send_count or is_train")
    if send_count is None:
        chunk = tf.maximum(largest, 1)
    else:
        check = tf.debugging.Assert(
            largest <= send_count,
            [f"sparse_lookup on table {table.table_name!r}: a rank sends more unique IDs to "
             f"one peer than send_count={send_count} allows (raise send_count, or use "
             "init(use_dynamic=True)); this rank's IDs per peer:", counts,
             "largest over all ranks:", largest], summarize=size)
        with tf.control_dependencies([check]):
            chunk = tf.identity(tf.constant(send_count, tf.int32))
    shape = tf.stack([size, chunk])
    send = tf.scatter_nd(routed.where, routed.pairs, tf.concat([shape, [2]], axis=0))
    received = tf.reshape(communication.alltoall(send), [-1, 2])
    recv_ids, recv_occ = received[:, 0], received[:, 1]
    valid = tf.cast(tf.where(recv_occ > 0)[:, 0], tf.int32)
    owned = tf.gather(recv_ids, valid)
    owned_occ = tf.gather(recv_occ, valid)
    if is_train:
        # Every occurrence of the global batch counts for admission, as in one process.
        repeated = repeat_by_counts(owned, owned_occ)
        first = tf.cast(tf.cumsum(owned_occ, exclusive=True), tf.int32)
    else:
        repeated = owned
        first = tf.range(tf.size(owned))
    return Exchange(chunk=chunk, valid=valid, owned=repeated, first=first)


def repeat_by_counts(values: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """`values[i]` repeated `counts[i]` times, in order (np.repeat of a vector).

    tf.repeat tiles every value to the largest count and masks the result back: with
    power-law IDs (a hot ID occurs thousands of times in a global batch) that is
    len(values) x max(counts) elements, 0.6 s of a step on the bench (profile in
    docs/MULTIWORKER.md). Here: one searchsorted over the counts' running sum,
    O(sum(counts) x log len(values)).
    """
    counts = tf.cast(counts, tf.int64)
    ends = tf.cumsum(counts)
    total = tf.reduce_sum(counts)
    source = tf.searchsorted(ends, tf.range(total, dtype=tf.int64), side="right",
                             out_type=tf.int64)
    return tf.gather(values, source)


def send_back(table, owned_emb: tf.Tensor, exchanged: Exchange, routed: Route, ids: tf.Tensor,
              grad_scale: Optional[float]) -> tf.Tensor:
    """The owner's embeddings of `exchanged.owned` [M, dim] back to the ranks that asked,
    spread over `ids`' positions: [*ids.shape, dim]. Differentiable in `owned_emb`."""
    size = communication.get_rank_size()
    dim = table.dim
    chunk = exchanged.chunk
    emb = tf.gather(owned_emb, exchanged.first)
    slots = tf.scatter_nd(exchanged.valid[:, None], emb, tf.stack([size * chunk, dim]))
    back = communication.alltoall(tf.reshape(slots, tf.stack([size, chunk, dim])),
                                  grad_scale=grad_scale)
    local_sorted = tf.gather_nd(back, routed.where)
    local = tf.gather(local_sorted, tf.math.invert_permutation(routed.order))
    out = tf.gather(local, routed.index)
    out_shape = tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], axis=0)
    out = tf.reshape(out, out_shape)
    out.set_shape(ids.shape.concatenate([dim]))
    return out

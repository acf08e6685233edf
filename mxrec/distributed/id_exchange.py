"""The exchange phase of a sharded lookup (mxrec.distributed.routing has the whole path):
each rank's unique IDs, with their occurrence counts, to the ranks that own them.

- One lookup (`exchange`; `shared_exchange`, built once per IDs tensor on the direct path):
  one all-reduce (the chunk, and a fingerprint that every rank built this lookup alike,
  `agreed_max`) and one all-to-all of (ID, count) buckets. The owner plans what it received
  with the counts as key-stage weights (`Exchange`).
- Every lookup of a step at once, for the graph modifier (`exchange_all`): one agreement
  all-reduce and one ID all-to-all for all of them, each lookup placed in the buffer of its
  send group (`send_groups`) for the send-back.
- The collectives around it: the batch's time over the ranks (`batch_time`) and the
  iterators' initializers where the ranks meet (`fence_iterators`).
"""

import dataclasses
import weakref
import zlib
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from mxrec.core.graph_state import shared_tensor
from mxrec.distributed import communication, routing, sharded_ops


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
    fenced (docs/design/multiworker.md). Returns how many initializers were fenced now.
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
    """The global batch's time: the newest local time over all ranks (one all-reduce per
    local time tensor, shared by the lookups that read the same one)."""
    if local_time is None:
        return None
    return shared_tensor(local_time.graph, ("batch_time", local_time.name),
                         lambda: communication.allreduce(tf.cast(local_time, tf.int64), "max"))


@dataclasses.dataclass
class Exchange:
    """The IDs one rank received as owner, and where they go back.

    The `spot`, `group_*` fields place this lookup in the buffer its embeddings go back in:
    its own (`exchange`), or the one it shares with the step's other lookups of its send
    group (`exchange_all` with `groups`, `send_back_all`). The fields from `emb` on are
    the send-back's records (mxrec.distributed.send_back): set there, read by the graph
    modifier.

    Attributes:
        chunk: scalar int32, rows per peer of this step's ID all-to-all for this lookup.
        valid: [V] int32, the received slots that hold an ID.
        owned: [M] int64, the IDs to plan on the owner: the received ones, M = V (an ID
            that several ranks sent is there once per rank).
        weights: [M] int64 (training), each owned ID's occurrences in the sending rank's
            batch, which the owner's key stage counts (as if the ID were repeated that
            many times: mxrec.util.ops.key_stage); None in evaluation.
        first: [V] int32, the position in `owned` of each received ID.
        spot: [V] int32, each received ID's row in the send-back buffer [N * group_chunk].
        group_chunk: scalar int32, rows per peer of that buffer.
        group_offset: scalar int32, this lookup's first row per peer in it.
        group_first: [V] int32, `first` counted over the group's owned IDs, in group order.
        owned_size: scalar int32, the size of `owned` where exchange_all knows it, or None.
        emb, out: the owner's embeddings [M, dim] and what came back, [n, dim] (n flat IDs),
            set by send_back.
        backward: (d_out, d_emb) of each backward pass built through send_back: the gradient
            arriving at `out` and the one it gave `emb` (the graph modifier rebuilds these
            for all lookups together, `send_back_all`).
        peer_backward: (sent, received) of each backward all-to-all of a replicated lookup
            (mxrec.distributed.replicated), [N, chunk, dim] each.
        position: [n] int32, each flat ID's row in the [N * group_chunk] buffer that comes
            back (`positions`; set by send_back).
        plan: the send_back.SendPlan send_back made (reused by a lookup sharing this
            exchange, `shared_exchange`).
        shared: the send-backs so far of the lookups sharing this exchange
            (`shared_exchange`: one list for all of them), or None; `send_back` sends
            theirs and the next one's embeddings in one all-to-all each way.
    """

    chunk: tf.Tensor
    valid: tf.Tensor
    owned: tf.Tensor
    first: tf.Tensor
    weights: Optional[tf.Tensor] = None
    spot: Optional[tf.Tensor] = None
    group_chunk: Optional[tf.Tensor] = None
    group_offset: Optional[tf.Tensor] = None
    group_first: Optional[tf.Tensor] = None
    owned_size: Optional[tf.Tensor] = None
    emb: Optional[tf.Tensor] = None
    out: Optional[tf.Tensor] = None
    backward: list = dataclasses.field(default_factory=list)
    peer_backward: list = dataclasses.field(default_factory=list)
    position: Optional[tf.Tensor] = None
    plan: Optional[object] = None
    shared: Optional[list] = None

    def __post_init__(self):
        # Alone in its buffer unless exchange_all placed it in a group's.
        if self.spot is None:
            self.spot, self.group_first = self.valid, self.first
            self.group_chunk, self.group_offset = self.chunk, tf.constant(0, tf.int32)


def exchange(table, routed: routing.Route, is_train: bool,
             send_count: Optional[int]) -> Exchange:
    """Sends each rank's unique IDs (and occurrence counts) to their owners: one
    all-reduce (the chunk, and a check that every rank built the same lookup) and one
    all-to-all."""
    size = communication.get_rank_size()
    counts = routed.counts
    # One all-reduce gives the largest bucket and checks that every rank built this lookup
    # of the same table (name, dim, key type, send_count): max and -min of a fingerprint.
    largest = agreed_max(table, tf.reduce_max(counts), _fingerprint(table, send_count, is_train),
                         "table name, dim, key dtype, send_count or is_train")
    chunk = _chunk(table, send_count, largest, counts, size)
    send = sharded_ops.pack_send([routed.where], [routed.pairs], tf.reshape(chunk, [1]), size)
    received = tf.reshape(communication.alltoall(send), [-1, 2])
    return _received(received, chunk, is_train)


def shared_exchange(table, ids: tf.Tensor, is_train: bool, send_count: Optional[int],
                    router=None):
    """(route, exchange) of a direct-path lookup of `ids`: built once per IDs tensor and
    shared by every lookup of the same `ids` (same is_train, send_count and router), each
    with an Exchange of its own that starts from the first one's, send plan included.

    A wide & deep model looks its IDs up in two tables; the second lookup then runs no
    routing, no agreement all-reduce, no ID all-to-all and no send-back planning of its
    own: the owners receive the same IDs with the same counts, so its key stage and its
    embeddings' way back are the first lookup's (the values are those of its own exchange,
    bit for bit). The first lookup's fingerprint is the one the ranks compare."""
    router = router or routing.route
    size = communication.get_rank_size()
    key = ("shared_exchange", ids.name, bool(is_train), send_count, router.__module__,
           router.__name__, size)
    made = []

    def make():
        routed = router(ids, size)
        made.append(exchange(table, routed, is_train, send_count))
        made[0].shared = []  # the lookups' send-backs (send_back)
        return routed, made[0]

    # The graph being built: a lookup inside a cond branch or a function builds its own.
    routed, first = shared_tensor(tf.compat.v1.get_default_graph(), key, make)
    if made:
        return routed, first
    # The first lookup's send-back set `plan`/`position`; the per-lookup records start empty.
    return routed, dataclasses.replace(first, emb=None, out=None, backward=[],
                                       peer_backward=[])


def repeat_by_counts(values: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """`values[i]` repeated `counts[i]` times, in order (np.repeat of a vector).

    tf.repeat tiles every value to the largest count and masks the result back: with
    power-law IDs (a hot ID occurs thousands of times in a global batch) that is
    len(values) x max(counts) elements, 0.6 s of a step on the bench (profile in
    docs/history/multiworker.md). Here: one searchsorted over the counts' running sum,
    O(sum(counts) x log len(values)).
    """
    counts = tf.cast(counts, tf.int64)
    ends = tf.cumsum(counts)
    total = tf.reduce_sum(counts)
    source = tf.searchsorted(ends, tf.range(total, dtype=tf.int64), side="right",
                             out_type=tf.int64)
    return tf.gather(values, source)


def check_groups(groups, count: int, what: str) -> None:
    """Raises ValueError unless `groups` are disjoint non-empty lists of lookup indices in
    range(count)."""
    seen = set()
    for group in groups:
        if not group:
            raise ValueError(f"{what}: an empty send group in groups={groups}")
        for index in group:
            if not isinstance(index, (int, np.integer)) or not 0 <= index < count:
                raise ValueError(f"{what}: groups={groups} names lookup {index!r}; the step "
                                 f"has {count} lookups (indices 0 to {count - 1})")
            if index in seen:
                raise ValueError(f"{what}: lookup {index} is in two send groups "
                                 f"(groups={groups}); each lookup sends in one buffer")
            seen.add(index)


def send_groups(keys):
    """The send groups of a step's lookups: the indices of the lookups with equal keys
    ((embedding dtype, dim, gradient scale): one buffer each way), in order of first
    appearance; a lookup whose key is None (replicated: it sends no embeddings) is in
    none."""
    groups = {}
    for index, key in enumerate(keys):
        if key is not None:
            groups.setdefault(key, []).append(index)
    return list(groups.values())


# One step's sharded lookups of the graph modifier, fused (mxrec.distributed.sharded_pipeline):
# one agreement all-reduce and one ID all-to-all for every table and every lookup of the step
# together (and mxrec.distributed.send_back.send_back_all the way back).

_FIELDS = "table name, dim, key dtype, send_count, is_train or all2all_gradients_op"


@dataclasses.dataclass
class PlannedLookup:
    """What the fused exchange needs of one lookup: its name (for errors), its table and
    its send_count (None: dynamic)."""

    name: str
    table: object
    send_count: Optional[int]


def exchange_all(lookups, routes, stamps, is_train: bool, also=(), groups=None):
    """`exchange` for every lookup of a step at once.

    One all-reduce (max) of one int64 vector agrees on everything: per lookup its largest
    bucket, the batch time of each lookup that has one (the newest over the ranks, as
    `batch_time`), and per lookup a fingerprint of its fields and its negation (max and -min:
    every rank built this lookup alike, at this position of the step). Then one all-to-all of
    [N, sum_l chunk_l, 2] (ID, count) pairs: per peer, the lookups' buckets concatenated.

    The ops are vectorised over the lookups (one scatter of every lookup's buckets, one pass
    over the received slots, one split per output), so a step of 26 lookups plans with about
    as many ops as a step of one: on a small batch the executor's cost per op, not the bytes,
    was most of the planning (docs/history/multiworker.md, "where the step time goes").

    Args:
        lookups: [PlannedLookup], in the step's (every rank's) order.
        routes: [routing.Route], one per lookup.
        stamps: per lookup its local batch time (int64 scalar) or None.
        also: more int64 scalars to take the largest of over the ranks in the same
            all-reduce (the graph modifier's "every rank has a next batch", negated).
        groups: send_groups of the lookups, or None (each alone): the Exchanges' `spot`
            and `group_*` fields then place each lookup in its group's send-back buffer.
            Lookups given the same stamp tensor share one agreed batch time.

    Returns:
        ([Exchange], [batch time or None], [the largest of each of `also`]), one Exchange
        per lookup, each equal to what `exchange` gives for that lookup alone.
    """
    size = communication.get_rank_size()
    count = len(lookups)
    if groups is not None:
        check_groups(groups, count, "exchange_all")
    distinct = _distinct_stamps(stamps)
    summary = _agreement(lookups, routes, distinct, is_train, also)
    chunks = _chunks(lookups, routes, summary[:count], size)
    if count == 1:  # nothing to group: the single lookup's own exchange
        route, chunk = routes[0], chunks[0]
        send = sharded_ops.pack_send([route.where], [route.pairs], chunks, size)
        exchanges = [_received(tf.reshape(communication.alltoall(send), [-1, 2]), chunk,
                               is_train)]
    else:
        exchanges, slots = _received_all(routes, chunks, is_train, size)
        if groups is not None and any(len(g) > 1 for g in groups):
            _place_in_groups(exchanges, slots, chunks, groups)
    extra = count + len(distinct) + 2 * count  # where `also`'s maxima start in the summary
    return exchanges, _agreed_stamps(summary, stamps, distinct, count), \
        [summary[extra + i] for i in range(len(also))]


def _agreement(lookups, routes, distinct, is_train: bool, also) -> tf.Tensor:
    """exchange_all's one all-reduce (max): [L] largest buckets, then the `distinct` stamps'
    batch times, [L] fingerprints, [L] their negations and `also`, int64, read after a check
    that every rank built every lookup alike (the error names the lookups that differ)."""
    count = len(lookups)
    counts = tf.stack([r.counts for r in routes])  # [L, N] unique IDs per lookup and owner
    times = [tf.cast(s, tf.int64) for s in distinct]
    prints = [_fingerprint(lk.table, lk.send_count, is_train) for lk in lookups]
    pieces = [tf.cast(tf.reduce_max(counts, axis=1), tf.int64)]
    if times:
        pieces.append(tf.stack(times))
    pieces.append(tf.constant(prints + [-p for p in prints], tf.int64))
    if also:
        pieces.append(tf.stack([tf.cast(value, tf.int64) for value in also]))
    summary = communication.allreduce(tf.concat(pieces, axis=0), "max")
    base = count + len(times)
    agree = tf.equal(summary[base:base + count], -summary[base + count:base + 2 * count])
    blame = tf.constant([
        f"sparse_lookup {lk.name!r} on table {lk.table.table_name!r} (lookup {i + 1} of the "
        f"{count} sharded lookups of this step, which share one agreement)"
        for i, lk in enumerate(lookups)])
    check = tf.debugging.Assert(
        tf.reduce_all(agree),
        [f"the ranks built different lookups ({_FIELDS} differ between ranks, or the ranks "
         "build their graphs in different orders); every rank must run the same model. The "
         "lookups that differ:", tf.boolean_mask(blame, tf.logical_not(agree))],
        summarize=count)
    with tf.control_dependencies([check]):
        return tf.identity(summary)


def _chunks(lookups, routes, largest: tf.Tensor, size: int) -> tf.Tensor:
    """[L] int32, each lookup's rows per peer (`_chunk`) from `largest`, its agreed largest
    bucket (int64)."""
    largest = tf.cast(largest, tf.int32)
    chunks = tf.maximum(largest, 1)
    if any(lk.send_count is not None for lk in lookups):
        chunks = tf.stack([
            chunks[i] if lk.send_count is None else
            _chunk(lk.table, lk.send_count, largest[i], r.counts, size, lk.name)
            for i, (lk, r) in enumerate(zip(lookups, routes))])
    return chunks


class _ReceivedSlots(NamedTuple):
    """The filled slots of the fused ID all-to-all, grouped by lookup (MxrecExchangeReceived):
    per slot its lookup, its peer, its slot within the lookup's own [N * chunk] buffer
    (`valid`) and its row in the lookup's owned IDs (`first`), [V] int32 each; the filled
    slots per lookup, [L] int32."""

    lookup: tf.Tensor
    peer: tf.Tensor
    valid: tf.Tensor
    first: tf.Tensor
    per_lookup: tf.Tensor


def _received_all(routes, chunks: tf.Tensor, is_train: bool, size: int):
    """Every lookup's (ID, count) pairs into its columns of one [N, sum(chunks), 2] buffer,
    the all-to-all, and the owner's side split by lookup: ([Exchange], _ReceivedSlots)."""
    count = len(routes)
    send = sharded_ops.pack_send([r.where for r in routes], [r.pairs for r in routes], chunks,
                                 size)
    received = tf.reshape(communication.alltoall(send), [-1, 2])
    # The received slots that hold an ID, grouped by lookup, in peer-then-column order
    # within a lookup (the order of `exchange`'s tf.where), in one op.
    pairs, lookup, peer, valid, per_lookup = sharded_ops.exchange_received(received, chunks,
                                                                           size)
    ids, occurrences = pairs[:, 0], pairs[:, 1]
    # Every received ID is planned once; in training with its occurrences as its weight
    # (admission counts every occurrence of the global batch, as in one process).
    first = tf.range(tf.size(lookup)) - tf.gather(tf.cumsum(per_lookup, exclusive=True),
                                                  lookup)
    valid_parts = tf.split(valid, per_lookup, num=count)
    first_parts = tf.split(first, per_lookup, num=count)
    owned_parts = tf.split(ids, per_lookup, num=count)
    weight_parts = (tf.split(occurrences, per_lookup, num=count) if is_train
                    else [None] * count)
    chunk_parts = tf.unstack(chunks, num=count)
    exchanges = [Exchange(chunk=chunk, valid=v, owned=o, first=f, weights=w, owned_size=m)
                 for chunk, v, o, f, w, m in zip(chunk_parts, valid_parts, owned_parts,
                                                 first_parts, weight_parts,
                                                 tf.unstack(per_lookup, num=count))]
    return exchanges, _ReceivedSlots(lookup, peer, valid, first, per_lookup)


def _place_in_groups(exchanges, slots: _ReceivedSlots, chunks: tf.Tensor, groups) -> None:
    """Sets each Exchange's `spot` and `group_*` fields: its rows in its send group's buffer,
    per peer after its group's earlier lookups (`group_offset`) in rows of the group's width
    (`group_chunk`)."""
    count = len(exchanges)
    offset, width = _within_groups(chunks, groups, count)
    owned_offset, _ = _within_groups(slots.per_lookup, groups, count)
    spot = (slots.valid + slots.peer * tf.gather(width - chunks, slots.lookup)
            + tf.gather(offset, slots.lookup))
    group_first = slots.first + tf.gather(owned_offset, slots.lookup)
    for ex, sp, gf, w, o in zip(exchanges, tf.split(spot, slots.per_lookup, num=count),
                                tf.split(group_first, slots.per_lookup, num=count),
                                tf.unstack(width, num=count),
                                tf.unstack(offset, num=count)):
        ex.spot, ex.group_first, ex.group_chunk, ex.group_offset = sp, gf, w, o


def _received_slots_reference(received: tf.Tensor, chunks: tf.Tensor):
    """exchange_all's grouping of the received slots composed of TensorFlow ops: the
    reference MxrecExchangeReceived (sharded_ops.exchange_received) is tested against
    (tests/test_exchange_received_op.py). `received` [N * sum(chunks), 2] int64 (ID,
    occurrences; 0 in an empty slot), per peer the lookups' columns concatenated; `chunks`
    [L] int32, each lookup's columns per peer. Unlike the op it checks neither N * sum(chunks)
    against received's length nor the signs of chunks and counts (a negative count reads as
    an empty slot).

    Returns:
        (pairs, lookup, peer, valid, per_lookup): the filled slots' pairs [V, 2] grouped by
        lookup (a stable sort keeps each lookup's slots in peer-then-column order), their
        lookup, peer and slot within the lookup's own [N * chunk] buffer [V] int32, and
        the filled slots per lookup [L] int32.
    """
    count = tf.size(chunks)
    total = tf.reduce_sum(chunks)
    offsets = tf.cumsum(chunks, exclusive=True)
    filled = tf.where(received[:, 1] > 0)[:, 0]
    filled = tf.cast(filled, tf.int32)
    peer, column = filled // total, filled % total
    column_lookup = repeat_by_counts(tf.range(count), chunks)
    lookup = tf.gather(column_lookup, column)
    order = tf.argsort(lookup, stable=True)
    lookup = tf.gather(lookup, order)
    peer, column = tf.gather(peer, order), tf.gather(column, order)
    pairs = tf.gather(received, tf.gather(filled, order))
    valid = peer * tf.gather(chunks, lookup) + column - tf.gather(offsets, lookup)
    per_lookup = tf.math.unsorted_segment_sum(tf.ones_like(lookup), lookup, count)
    return pairs, lookup, peer, valid, per_lookup


def _within_groups(values: tf.Tensor, groups, count: int):
    """For [L] int32 `values` (one per lookup) and `groups` (lists of lookup indices; a
    lookup in none is alone): per lookup the sum of the values of the lookups before it in
    its group, and its group's total, [L] each."""
    grouped = {i for g in groups for i in g}
    groups = list(groups) + [[i] for i in range(count) if i not in grouped]
    order = [i for g in groups for i in g]
    group_of = [n for n, g in enumerate(groups) for _ in g]
    starts = np.cumsum([0] + [len(g) for g in groups])[:-1]
    inverse = np.argsort(order)
    ordered = tf.gather(values, order)
    before = tf.cumsum(ordered, exclusive=True)
    within = before - tf.gather(before, starts[group_of])
    totals = tf.gather(tf.math.segment_sum(ordered, group_of), group_of)
    return tf.gather(within, inverse), tf.gather(totals, inverse)


def _distinct_stamps(stamps):
    """The stamp tensors of `stamps`, each once (by identity), in order."""
    distinct = []
    for stamp in stamps:
        if stamp is not None and not any(stamp is seen for seen in distinct):
            distinct.append(stamp)
    return distinct


def _agreed_stamps(summary: tf.Tensor, stamps, distinct, count: int):
    """The batch times of exchange_all's agreement, per lookup (None where it has none;
    lookups of one stamp tensor get the same agreed one)."""
    agreed = [summary[count + n] for n in range(len(distinct))]
    return [None if stamp is None else
            agreed[next(n for n, seen in enumerate(distinct) if seen is stamp)]
            for stamp in stamps]


def _chunk(table, send_count: Optional[int], largest: tf.Tensor, counts: tf.Tensor, size: int,
           name: Optional[str] = None) -> tf.Tensor:
    """Rows per peer of a lookup's all-to-alls: the largest bucket over the ranks, or
    send_count (static shapes) after checking that no rank's bucket exceeds it. `name`: the
    lookup's, where the error is to name it (the fused exchange)."""
    if send_count is None:
        return tf.maximum(largest, 1)
    what = "sparse_lookup" if name is None else f"sparse_lookup {name!r}"
    check = tf.debugging.Assert(
        largest <= send_count,
        [f"{what} on table {table.table_name!r}: a rank sends more unique IDs to one peer "
         f"than send_count={send_count} allows (raise send_count, or use "
         "init(use_dynamic=True)); this rank's IDs per peer:", counts,
         "largest over all ranks:", largest], summarize=size)
    with tf.control_dependencies([check]):
        return tf.identity(tf.constant(send_count, tf.int32))


def _received(received: tf.Tensor, chunk: tf.Tensor, is_train: bool) -> Exchange:
    """The owner's side of an ID all-to-all: `received` [N * chunk, 2] (ID, occurrences),
    empty slots with 0 occurrences."""
    recv_ids, recv_occ = received[:, 0], received[:, 1]
    valid = tf.cast(tf.where(recv_occ > 0)[:, 0], tf.int32)
    owned = tf.gather(recv_ids, valid)
    # In training each received ID counts its occurrences over the sender's batch for
    # admission (the key stage's weights), as if repeated: as in one process.
    weights = tf.gather(recv_occ, valid) if is_train else None
    return Exchange(chunk=chunk, valid=valid, owned=owned, first=tf.range(tf.size(owned)),
                    weights=weights)

"""Tables sharded across ranks: each rank owns the IDs `owner(id) == rank` of every table.

One lookup on N ranks (direct path), per step: `route` (rank-local), `exchange` (the
collectives that bring the IDs to their owners), the owner's key stage and device lookup,
`send_back`. The graph modifier runs the same pieces, split between the input pipeline
(`route`), a planning subgraph (`exchange`, key stage) and the step (mxrec.graph.sharded).

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
import weakref
import zlib
from typing import Optional

import numpy as np
import tensorflow as tf

from mxrec.core.graph_state import shared_tensor
from mxrec.distributed import communication
from mxrec.util import ops as mxrec_ops
from mxrec.util.gradients import custom_gradient

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
    """The global batch's time: the newest local time over all ranks (one all-reduce per
    local time tensor, shared by the lookups that read the same one)."""
    if local_time is None:
        return None
    return shared_tensor(local_time.graph, ("batch_time", local_time.name),
                         lambda: communication.allreduce(tf.cast(local_time, tf.int64), "max"))


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

    The `spot`, `group_*` fields place this lookup in the buffer its embeddings go back in:
    its own (`exchange`), or the one it shares with the step's other lookups of its send
    group (`exchange_all` with `groups`, `send_back_all`).

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
        plan: the SendPlan send_back made (reused by a lookup sharing this exchange,
            `shared_exchange`).
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
    plan: Optional["SendPlan"] = None
    shared: Optional[list] = None

    def __post_init__(self):
        # Alone in its buffer unless exchange_all placed it in a group's.
        if self.spot is None:
            self.spot, self.group_first = self.valid, self.first
            self.group_chunk, self.group_offset = self.chunk, tf.constant(0, tf.int32)


def route(ids: tf.Tensor, size: int) -> Route:
    """Local dedupe, occurrence counts and owner buckets of `ids` (any rank >= 1), in one
    op (MxrecRoute, on the CPU): the values of `route_reference`, bit for bit."""
    pairs, counts, where, order, index = mxrec_ops.route(tf.cast(ids, tf.int64), size)
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
    chunk = _chunk(table, send_count, largest, counts, size)
    send = mxrec_ops.pack_send([routed.where], [routed.pairs], tf.reshape(chunk, [1]), size)
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
    router = router or route
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
    docs/MULTIWORKER.md). Here: one searchsorted over the counts' running sum,
    O(sum(counts) x log len(values)).
    """
    counts = tf.cast(counts, tf.int64)
    ends = tf.cumsum(counts)
    total = tf.reduce_sum(counts)
    source = tf.searchsorted(ends, tf.range(total, dtype=tf.int64), side="right",
                             out_type=tf.int64)
    return tf.gather(values, source)


def positions(routed: Route, chunk: tf.Tensor, offset=0) -> tf.Tensor:
    """Each flat ID's row in the [N * chunk] buffer the embedding all-to-all returns: its
    unique ID's (owner, slot), as owner * chunk + offset + slot (`offset`: the lookup's first
    row per peer in a buffer it shares). One gather by these rows replaces the gather_nd by
    `where`, the inverse of `order` and the gather by `index` (and their three gradients by
    one segment sum, over the same terms in the same order). One op (MxrecSendPositions)
    computes them: the value of gather(gather(flat, invert_permutation(order)), index)."""
    (position,) = mxrec_ops.send_positions(
        [routed.where], [routed.order], [routed.index], tf.reshape(chunk, [1]),
        tf.reshape(tf.cast(offset, tf.int32), [1]), [0], 1)
    return position


@dataclasses.dataclass
class SendPlan:
    """Where one send group's embeddings go: the buffer [N * chunk, dim] of its lookups
    (per peer each lookup's rows after the previous lookup's) and the indices into it, all
    planned before the embeddings exist (`plan_send_back`).

    Attributes:
        spots: [V] int32, the row of each ID this rank received as owner.
        first: [V] int32, that ID's row in the group's owned embeddings (concatenated).
        position: [n] int32, each flat ID's row in the buffer that comes back.
        out_sizes: [k] int32, flat IDs per lookup (`position` split by lookup).
        owned_sizes: [k] int32, owned IDs per lookup (the owned embeddings' rows).
        chunk: scalar int32, rows per peer of the buffer.
        owned: scalar int32, the group's owned IDs.
    """

    spots: tf.Tensor
    first: tf.Tensor
    position: tf.Tensor
    out_sizes: tf.Tensor
    owned_sizes: tf.Tensor
    chunk: tf.Tensor
    owned: tf.Tensor

    FIELDS = ("spots", "first", "position", "out_sizes", "owned_sizes", "chunk", "owned")


def plan_send_back(exchanges, routes) -> SendPlan:
    """The SendPlan of one send group: `exchanges` (placed in one buffer by exchange_all's
    `groups`, or one lookup alone) and their routes, in group order."""

    def joined(values):
        return values[0] if len(values) == 1 else tf.concat(values, axis=0)

    position = [positions(r, ex.group_chunk, ex.group_offset)
                for ex, r in zip(exchanges, routes)]
    owned_sizes = tf.stack([tf.size(ex.owned, out_type=tf.int32) for ex in exchanges])
    return SendPlan(spots=joined([ex.spot for ex in exchanges]),
                    first=joined([ex.group_first for ex in exchanges]),
                    position=joined(position),
                    out_sizes=tf.stack([tf.size(p, out_type=tf.int32) for p in position]),
                    owned_sizes=owned_sizes, chunk=exchanges[0].group_chunk,
                    owned=tf.reduce_sum(owned_sizes))


def plan_send_backs(exchanges, routes, groups):
    """plan_send_back of every send group at once, with ops shared by all the groups'
    lookups (one pass over their routes instead of one per lookup: on a small batch the
    executor's cost per op is most of the planning). Equal to plan_send_back per group.

    Args:
        exchanges, routes: of the step's lookups (placed by exchange_all's `groups`).
        groups: send_groups of the lookups.

    Returns:
        [SendPlan], one per group.
    """
    _check_groups(groups, len(exchanges), "plan_send_backs")
    if len(routes) != len(exchanges):
        raise ValueError(f"plan_send_backs: {len(exchanges)} exchanges but {len(routes)} "
                         "routes; give one route per lookup")
    if not groups:
        return []
    if len(groups) == 1 and len(groups[0]) == 1:
        return [plan_send_back([exchanges[groups[0][0]]], [routes[groups[0][0]]])]
    members = sorted(i for g in groups for i in g)
    slot = {i: n for n, i in enumerate(members)}
    count = len(members)
    ex = [exchanges[i] for i in members]
    rt = [routes[i] for i in members]
    width = tf.stack([e.group_chunk for e in ex])
    offset = tf.stack([e.group_offset for e in ex])
    flat_sizes = tf.stack([tf.size(r.index, out_type=tf.int32) for r in rt])
    owned_sizes = tf.stack([tf.size(e.owned, out_type=tf.int32) if e.owned_size is None
                            else e.owned_size for e in ex])
    # positions() of every member at once, each group's in member order (one op over the
    # routes: the TF composition took a dozen ops over every flat ID of the step).
    group_of = np.zeros(count, np.int64)
    for number, g in enumerate(groups):
        group_of[[slot[i] for i in g]] = number
    positions_of = mxrec_ops.send_positions(
        [r.where for r in rt], [r.order for r in rt], [r.index for r in rt],
        tf.cast(width, tf.int32), tf.cast(offset, tf.int32), group_of.tolist(), len(groups))
    plans = []
    for g, group_position in zip(groups, positions_of):
        rows = [slot[i] for i in g]
        sizes = tf.gather(owned_sizes, rows)

        def joined(values):
            return values[0] if len(values) == 1 else tf.concat(values, axis=0)

        plans.append(SendPlan(spots=joined([exchanges[i].spot for i in g]),
                              first=joined([exchanges[i].group_first for i in g]),
                              position=group_position, out_sizes=tf.gather(flat_sizes, rows),
                              owned_sizes=sizes, chunk=exchanges[g[0]].group_chunk,
                              owned=tf.reduce_sum(sizes)))
    return plans


def _check_groups(groups, count: int, what: str) -> None:
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


def _alltoall_parts(parts, name: str):
    """One all-to-all for [N, width_i] tensors of one dtype, each peer's row of each
    concatenated; returns each part's share back."""
    with tf.name_scope(name):
        if len(parts) == 1:
            return [communication.alltoall(parts[0])]
        moved = communication.alltoall(tf.concat(parts, axis=1))
        widths = tf.stack([tf.shape(part, out_type=tf.int32)[1] for part in parts])
        return tf.split(moved, widths, axis=1, num=len(parts))


# Embedding dtypes with one-op kernels for the owner's side of the send-back (MxrecScatterRows,
# MxrecGatherSumRows); others take the TF composition they equal.
_FUSED_DTYPES = (tf.float32, tf.float64)


def _scatter_out(plan: SendPlan, emb: tf.Tensor, dim: int, size: int) -> tf.Tensor:
    """The owner's side forward: the group's owned embeddings [M, dim] into the buffer,
    [N, chunk * dim]."""
    if emb.dtype in _FUSED_DTYPES:
        slots = mxrec_ops.scatter_rows(emb, plan.first, plan.spots, size * plan.chunk)
    else:
        rows = tf.gather(emb, plan.first)
        slots = tf.scatter_nd(plan.spots[:, None], rows, tf.stack([size * plan.chunk, dim]))
    return tf.reshape(slots, tf.stack([size, plan.chunk * dim]))


def _gather_back(plan: SendPlan, moved: tf.Tensor, dim: int) -> tf.Tensor:
    """The asking side forward: each flat ID's row of the buffer that came back, [n, dim]."""
    return tf.gather(tf.reshape(moved, [-1, dim]), plan.position)


def _scatter_grad(plan: SendPlan, d_out: tf.Tensor, dim: int, size: int) -> tf.Tensor:
    """The asking side backward: the gradients of the flat IDs [n, dim] summed into their
    rows of the buffer, [N, chunk * dim] (the transpose of `_gather_back`)."""
    summed = tf.math.unsorted_segment_sum(d_out, plan.position, size * plan.chunk)
    return tf.reshape(summed, tf.stack([size, plan.chunk * dim]))


def _gather_grad(plan: SendPlan, moved: tf.Tensor, dim: int, scale) -> tf.Tensor:
    """The owner's side backward: the buffer of gradients that came back, times `scale`,
    summed into the owned rows, [M, dim] (the transpose of `_scatter_out`)."""
    moved = tf.reshape(moved, [-1, dim])
    if moved.dtype in _FUSED_DTYPES:
        return mxrec_ops.gather_sum_rows(moved, plan.spots, plan.first, plan.owned, scale)
    if scale is not None:
        moved = moved * scale
    return tf.math.unsorted_segment_sum(tf.gather(moved, plan.spots), plan.first, plan.owned)


@dataclasses.dataclass
class _SharedSendBack:
    """One lookup's send-back over a shared exchange (Exchange.shared)."""

    key: tuple  # (embedding dtype, gradient scale): lookups of one key share a buffer
    emb: tf.Tensor  # the owner's embeddings [M, dim]
    dim: int
    shaped: tf.Tensor  # the reshape to [*ids.shape, dim] of what came back
    exchanged: Exchange


def _moved(plan: SendPlan, emb: tf.Tensor, dim: int, size: int, grad_scale,
           exchanged: Optional[Exchange]) -> tf.Tensor:
    """The owner's embeddings [M, dim] at the asking ranks' flat IDs, [n, dim]: one
    all-to-all each way, the gradient the same path in reverse (recorded in
    `exchanged.backward` where given)."""

    @custom_gradient
    def moved(emb):
        def grad(d_out):
            d_out = tf.convert_to_tensor(d_out)
            (back,) = _alltoall_parts([_scatter_grad(plan, d_out, dim, size)], "alltoall")
            d_emb = _gather_grad(plan, back, dim, grad_scale)
            if exchanged is not None:
                exchanged.backward.append((d_out, d_emb))
            return d_emb

        (back,) = _alltoall_parts([_scatter_out(plan, tf.stop_gradient(emb), dim, size)],
                                  "alltoall")
        return _gather_back(plan, back, dim), grad

    return moved(emb)


def send_back(table, owned_emb: tf.Tensor, exchanged: Exchange, routed: Route, ids: tf.Tensor,
              grad_scale: Optional[float]) -> tf.Tensor:
    """The owner's embeddings of `exchanged.owned` [M, dim] back to the ranks that asked,
    spread over `ids`' positions: [*ids.shape, dim]. Differentiable in `owned_emb`: the
    gradient takes the same path in reverse (one custom gradient over the whole send-back,
    recorded in `exchanged.backward` for `send_back_all`).

    Lookups sharing their exchange (`shared_exchange`, `Exchange.shared`) with the same
    embedding dtype and gradient scale send together: the earlier ones' embeddings and
    this one's side by side, [M, dim_1 + ... + dim_k], in one all-to-all each way (the
    same values, bit for bit: every column moves and sums alone), and the earlier lookups'
    results are rewired to their columns of it (their own all-to-alls are left with no
    consumer and never run). A wide & deep model's step then sends 1 embedding and 1
    gradient all-to-all instead of 2 each."""
    size, dim = communication.get_rank_size(), table.dim
    plan = exchanged.plan if exchanged.plan is not None else plan_send_back([exchanged], [routed])
    exchanged.position, exchanged.plan = plan.position, plan
    key = (owned_emb.dtype, grad_scale)
    earlier = [m for m in exchanged.shared if m.key == key] if exchanged.shared else []
    if not earlier:
        out = _moved(plan, owned_emb, dim, size, grad_scale, exchanged)
    else:
        dims = [m.dim for m in earlier] + [dim]
        with tf.name_scope("shared_send_back"):
            joint = _moved(plan, tf.concat([m.emb for m in earlier] + [owned_emb], axis=1),
                           sum(dims), size, grad_scale, None)
            pieces = tf.split(joint, dims, axis=1, num=len(dims))
        for member, piece in zip(earlier, pieces):
            member.shaped.op._update_input(0, piece)  # noqa: SLF001 (no public way)
            member.exchanged.out = piece
        out = pieces[-1]
    exchanged.emb, exchanged.out = owned_emb, out
    out = tf.reshape(out, tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], axis=0))
    out.set_shape(ids.shape.concatenate([dim]))
    if exchanged.shared is not None:
        exchanged.shared.append(_SharedSendBack(key, owned_emb, dim, out, exchanged))
    return out


def send_back_all(exchanges, groups, plans, scales, gradient_scope, after=()):
    """The send-back of all sharded lookups of a step, fused: per embedding dtype one
    all-to-all forward and, per backward pass, one backward, for every send group (and the
    backward all-to-alls of replicated lookups); returns ((old, new) tensor pairs whose
    consumers are to read the new ones, whether `after` was made a control input).

    The lookups' own send-backs (send_back) stay in the graph unread: each lookup's `out`
    and each backward pass's `d_emb` are replaced by their share of the fused ones, equal
    to what the lookup's own send-back gives (the same terms summed in the same order).

    Args:
        exchanges: [Exchange] of the step's lookups after send_back (emb/out/backward set),
            or after replicated.send_back (peer_backward set).
        groups: send_groups of the sharded lookups, each with its SendPlan in `plans`
            (planned ahead of the step).
        scales: per lookup the factor of its gradient, or None.
        gradient_scope: tensor -> the name scope of the tf.gradients call that built it.
        after: ops the writes of the backward passes' gradients to the tables (without a
            backward pass: the forward send-back) wait for.
    """
    size = communication.get_rank_size()
    _check_groups(groups, len(exchanges), "send_back_all")
    if len(plans) != len(groups) or len(scales) != len(exchanges):
        raise ValueError(f"send_back_all: {len(groups)} send groups with {len(plans)} plans, "
                         f"{len(exchanges)} lookups with {len(scales)} gradient scales; give "
                         "one plan per group and one scale per lookup")
    for group in groups:
        missing = [i for i in group if exchanges[i].out is None]
        if missing:
            raise ValueError(f"send_back_all: lookups {missing} have no send-back to replace "
                             "(sharding.send_back was not built for them)")
        kinds = {(exchanges[i].out.dtype.name, int(exchanges[i].out.shape[-1]),
                  scales[i]) for i in group}
        if len(kinds) > 1:
            raise ValueError(f"send_back_all: send group {group} mixes (dtype, dim, gradient "
                             f"scale) {sorted(kinds, key=str)}; one buffer holds one kind "
                             "(sharding.send_groups)")
    pairs = []
    dims = [int(exchanges[g[0]].out.shape[-1]) for g in groups]

    def by_dtype(items):
        found = {}
        for item, dtype in items:
            found.setdefault(dtype, []).append(item)
        return found.values()

    passes = {}  # gradient scope -> {lookup: (dy, dx)}
    for i, ex in enumerate(exchanges):
        for dy, dx in ex.backward + ex.peer_backward:
            passes.setdefault(gradient_scope(dx), {})[i] = (dy, dx)
    gate_forward = bool(after) and not passes
    with tf.name_scope("send_back_fused"), tf.control_dependencies(
            list(after) if gate_forward else []):
        for members in by_dtype((g, exchanges[groups[g][0]].out.dtype)
                                for g in range(len(groups))):
            parts = []
            for g in members:
                ex = [exchanges[i] for i in groups[g]]
                emb = ex[0].emb if len(ex) == 1 else tf.concat([e.emb for e in ex], axis=0)
                parts.append(_scatter_out(plans[g], emb, dims[g], size))
            for g, back in zip(members, _alltoall_parts(parts, "alltoall")):
                out = _gather_back(plans[g], back, dims[g])
                pieces = ([out] if len(groups[g]) == 1 else
                          tf.split(out, plans[g].out_sizes, num=len(groups[g])))
                for i, piece in zip(groups[g], pieces):
                    piece.set_shape(exchanges[i].out.shape)
                    pairs.append((exchanges[i].out, piece))
    grouped = {i for g in groups for i in g}
    for grads in passes.values():
        # A backward exchange, as the bench reads it ("gradients" in its name). It does not
        # wait for `after`: the ops that write the tables do (_gate_writers), so the
        # gradients' exchange overlaps the planning of the next batch.
        first = len(pairs)
        with tf.name_scope("gradients_fused"):
            items = [(("group", g), exchanges[groups[g][0]].out.dtype)
                     for g in range(len(groups)) if any(i in grads for i in groups[g])]
            items += [(("peer", i), grads[i][0].dtype) for i in sorted(grads)
                      if i not in grouped]
            for members in by_dtype(items):
                parts = []
                for kind, index in members:
                    if kind == "peer":
                        parts.append(tf.reshape(grads[index][0], tf.stack([size, -1])))
                        continue
                    ins = [grads[i][0] if i in grads else tf.zeros_like(exchanges[i].out)
                           for i in groups[index]]
                    d_out = ins[0] if len(ins) == 1 else tf.concat(ins, axis=0)
                    parts.append(_scatter_grad(plans[index], d_out, dims[index], size))
                for (kind, index), back in zip(members, _alltoall_parts(parts, "alltoall")):
                    if kind == "peer":
                        dy, dx = grads[index]
                        new = tf.reshape(back, tf.shape(dy))
                        if scales[index] is not None:
                            new = new * scales[index]
                        new.set_shape(dx.shape)
                        pairs.append((dx, new))
                        continue
                    members_of = groups[index]
                    scale = scales[members_of[0]]
                    d_emb = _gather_grad(plans[index], back, dims[index], scale)
                    pieces = ([d_emb] if len(members_of) == 1 else
                              tf.split(d_emb, plans[index].owned_sizes, num=len(members_of)))
                    for i, piece in zip(members_of, pieces):
                        if i in grads:
                            piece.set_shape(grads[i][1].shape)
                            pairs.append((grads[i][1], piece))
        if after:
            pairs[first:] = _gate_writers(pairs[first:], list(after))
    return pairs, bool(after) and (bool(passes) or bool(groups))


def _table_writers(tensor: tf.Tensor, limit: int = 10_000):
    """The stateful ops with a resource input (an optimizer's apply to a table, or to its
    slots) that read `tensor` or what is computed from it, found by following data edges;
    None where one of them sits in a control-flow context (a cond or loop body that an
    outside control input cannot enter) or the search passes `limit` ops."""
    found, seen, frontier = [], set(), list(tensor.consumers())
    while frontier:
        op = frontier.pop()
        if op in seen:
            continue
        seen.add(op)
        if len(seen) > limit:
            return None
        if op.op_def is not None and op.op_def.is_stateful and any(
                t.dtype == tf.resource for t in op.inputs):
            if op._control_flow_context is not None:  # pylint: disable=protected-access
                return None
            found.append(op)
            continue
        for output in op.outputs:
            frontier.extend(output.consumers())
    return found


def _gate_writers(pairs, after):
    """Makes `after` a control input of the ops that apply each backward pass's gradient
    (old, new) pair to its table, which read `old` (they will read `new`): the step still
    runs `after`, and only those writes wait for it. A gradient with no such op (not
    applied, or applied inside a control-flow context) is read through an identity that
    waits for `after` instead."""
    ops = [a.op if isinstance(a, tf.Tensor) else a for a in after]
    gated = []
    for old, new in pairs:
        writers = _table_writers(old)
        if not writers:
            with tf.control_dependencies(after):
                waiting = tf.identity(new)
            waiting.set_shape(new.shape)
            gated.append((old, waiting))
            continue
        for op in writers:
            missing = [a for a in ops if a not in op.control_inputs]
            if missing:
                op._add_control_inputs(missing)  # pylint: disable=protected-access
        gated.append((old, new))
    return gated


# One step's sharded lookups of the graph modifier, fused (mxrec.distributed.sharded_pipeline):
# one agreement all-reduce, one ID all-to-all, one embedding all-to-all forward and one
# gradient all-to-all backward for every table and every lookup of the step together.

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
    was most of the planning (docs/MULTIWORKER.md, "Where the step time goes").

    Args:
        lookups: [PlannedLookup], in the step's (every rank's) order.
        routes: [Route], one per lookup.
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
        _check_groups(groups, count, "exchange_all")
    counts = tf.stack([r.counts for r in routes])  # [L, N] unique IDs per lookup and owner
    distinct = _distinct_stamps(stamps)
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
        summary = tf.identity(summary)
    largest = tf.cast(summary[:count], tf.int32)
    chunks = tf.maximum(largest, 1)  # [L] rows per peer of each lookup
    if any(lk.send_count is not None for lk in lookups):
        chunks = tf.stack([
            chunks[i] if lk.send_count is None else
            _chunk(lk.table, lk.send_count, largest[i], r.counts, size, lk.name)
            for i, (lk, r) in enumerate(zip(lookups, routes))])
    if count == 1:  # nothing to group: the single lookup's own exchange
        route, chunk = routes[0], chunks[0]
        send = mxrec_ops.pack_send([route.where], [route.pairs], chunks, size)
        exchanges = [_received(tf.reshape(communication.alltoall(send), [-1, 2]), chunk,
                               is_train)]
        return exchanges, _agreed_stamps(summary, stamps, distinct, count), \
            [summary[base + 2 * count + i] for i in range(len(also))]
    # Every lookup's (ID, count) pairs into its columns of one [N, sum(chunks), 2] buffer.
    send = mxrec_ops.pack_send([r.where for r in routes], [r.pairs for r in routes], chunks,
                               size)
    received = tf.reshape(communication.alltoall(send), [-1, 2])
    # The received slots that hold an ID, grouped by lookup, in peer-then-column order
    # within a lookup (the order of `exchange`'s tf.where), in one op.
    pairs, lookup, peer, valid, per_lookup = mxrec_ops.exchange_received(received, chunks,
                                                                         size)
    ids, occurrences = pairs[:, 0], pairs[:, 1]
    # Every received ID is planned once; in training with its occurrences as its weight
    # (admission counts every occurrence of the global batch, as in one process).
    owned_sizes = per_lookup
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
                                                 tf.unstack(owned_sizes, num=count))]
    if groups is not None and any(len(g) > 1 for g in groups):
        # Each lookup's rows in its send group's buffer: per peer after its group's earlier
        # lookups (`group_offset`) in rows of the group's width (`group_chunk`).
        offset, width = _within_groups(chunks, groups, count)
        owned_offset, _ = _within_groups(owned_sizes, groups, count)
        spot = (valid + peer * tf.gather(width - chunks, lookup) + tf.gather(offset, lookup))
        group_first = first + tf.gather(owned_offset, lookup)
        for ex, sp, gf, w, o in zip(exchanges, tf.split(spot, per_lookup, num=count),
                                    tf.split(group_first, per_lookup, num=count),
                                    tf.unstack(width, num=count),
                                    tf.unstack(offset, num=count)):
            ex.spot, ex.group_first, ex.group_chunk, ex.group_offset = sp, gf, w, o
    return exchanges, _agreed_stamps(summary, stamps, distinct, count), \
        [summary[base + 2 * count + i] for i in range(len(also))]


def _received_slots_reference(received: tf.Tensor, chunks: tf.Tensor):
    """exchange_all's grouping of the received slots composed of TensorFlow ops: the
    reference MxrecExchangeReceived (mxrec_ops.exchange_received) is tested against
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

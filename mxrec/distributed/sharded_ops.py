"""Python wrappers of the sharded lookup's TensorFlow ops (cc_ops/ops/route_ops.cc,
exchange_received_ops.cc, send_plan_ops.cc), all run on the CPU.

Each op does in one kernel what a composition of TensorFlow ops did, with the same values:
`route` for mxrec.distributed.routing, `pack_send` and `exchange_received` for
mxrec.distributed.id_exchange, `send_positions`, `scatter_rows` and `gather_sum_rows` for
mxrec.distributed.send_back. None is differentiable: the send-back builds its own transposes.
"""

import numbers
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from mxrec._lib import loader


def route(ids: tf.Tensor, size: int) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor,
                                               tf.Tensor]:
    """The rank-local part of a sharded lookup in one op (MxrecRoute): `ids` (int64, any
    shape, read flat) deduplicated and bucketed by owner over `size` ranks.

    Returns:
        (pairs, counts, where, order, index), the fields of mxrec.distributed.routing.Route
        with the values of its `route_reference`: pairs [U, 2] int64, counts [size] int32,
        where [U, 2] int32, order [U] int32, index [n] int32.

    Raises:
        ValueError: size is not an integer >= 1.

    Example:
        >>> pairs, counts, where, order, index = route(tf.constant([[7, 3], [7, 9]],
        ...                                                        tf.int64), 2)
        >>> # pairs [3, 2], counts [2], where [3, 2], order [3], index [4]
    """
    with tf.device("/device:CPU:0"):
        return tuple(loader.op_library().mxrec_route(ids=ids, size=_ranks("route", size)))


def exchange_received(received: tf.Tensor, chunks: tf.Tensor, size: int) -> Tuple[
        tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The owner's side of the fused ID exchange in one op (MxrecExchangeReceived): the
    filled slots of `received` grouped by lookup.

    Args:
        received: [size * sum(chunks), 2] int64 (ID, occurrences), per peer the lookups'
            columns concatenated; empty slots have 0 occurrences.
        chunks: [L] int32, each lookup's columns per peer.
        size: the number of ranks (peers).

    Returns:
        (pairs, lookup, peer, valid, per_lookup), the values of
        mxrec.distributed.id_exchange._received_slots_reference: pairs [V, 2] int64 of the V
        filled slots, grouped by lookup and in peer-then-column order within one; lookup,
        peer and valid (the slot within the lookup's own [size * chunk] buffer) [V] int32;
        per_lookup [L] int32.

    Raises:
        ValueError: size is not an integer >= 1.

    Example:
        >>> received = tf.constant([[7, 1], [0, 0], [9, 2], [4, 1]], tf.int64)
        >>> pairs, lookup, peer, valid, per_lookup = exchange_received(
        ...     received, tf.constant([1, 1]), 2)
        >>> # pairs [[7, 1], [9, 2], [4, 1]], lookup [0, 0, 1], peer [0, 1, 1],
        >>> # valid [0, 1, 1], per_lookup [2, 1]
    """
    with tf.device("/device:CPU:0"):
        return tuple(loader.op_library().mxrec_exchange_received(
            received=received, chunks=chunks, size=_ranks("exchange_received", size)))


def pack_send(wheres: Sequence[tf.Tensor], pairs: Sequence[tf.Tensor], chunks: tf.Tensor,
              size: int) -> tf.Tensor:
    """The buffer of the ID all-to-all for several lookups in one op (MxrecPackSend).

    Args:
        wheres, pairs: per lookup its route's `where` [U, 2] int32 (owner, slot) and
            `pairs` [U, 2] int64 (ID, occurrences) (mxrec.distributed.routing.Route).
        chunks: [L] int32, each lookup's columns per peer.
        size: the number of ranks (peers).

    Returns:
        send [size, sum(chunks), 2] int64: per peer the lookups' columns concatenated, each
        unique ID's pair at (owner, the lookup's first column + slot), zeros elsewhere (the
        value of scatter_nd over all lookups' slots).

    Example:
        >>> send = pack_send([tf.constant([[1, 0]])], [tf.constant([[7, 2]], tf.int64)],
        ...                  tf.constant([1]), 2)
        >>> # send [[[0, 0]], [[7, 2]]]
    """
    with tf.device("/device:CPU:0"):
        return loader.op_library().mxrec_pack_send(
            where=list(wheres), pairs=list(pairs), chunks=chunks,
            size=_ranks("pack_send", size))


def send_positions(wheres: Sequence[tf.Tensor], orders: Sequence[tf.Tensor],
                   indices: Sequence[tf.Tensor], width: tf.Tensor, offset: tf.Tensor,
                   group_of: Sequence[int], num_groups: int) -> List[tf.Tensor]:
    """Each flat ID's row in the buffer of embeddings that comes back, for several lookups
    in one op (MxrecSendPositions).

    Args:
        wheres, orders, indices: per lookup its route's `where` [U, 2], `order` [U] and
            `index` [n] (int32; mxrec.distributed.routing.Route).
        width, offset: [L] int32, per lookup its buffer's rows per peer and its first row
            per peer in it.
        group_of: per lookup its output, in [0, num_groups).
        num_groups: the number of outputs.

    Returns:
        num_groups int32 vectors: output g holds, lookup after lookup in increasing order,
        the rows (owner * width + offset + slot of each flat ID's unique ID) of the lookups
        with group_of == g, the value of mxrec.distributed.send_back.positions.

    Example:
        >>> (position,) = send_positions([tf.constant([[0, 0], [1, 0]])], [tf.constant([1, 0])],
        ...                              [tf.constant([0, 1, 0])], tf.constant([2]),
        ...                              tf.constant([0]), [0], 1)
        >>> # position [2, 0, 2]: unique ID 0 is the second in owner order, (owner 1, slot 0)

    Raises:
        ValueError: num_groups is not in [1, len(wheres)] (an output per group of lookups;
            TensorFlow would try to allocate a list of that many outputs before the kernel
            could refuse it), or a group_of entry is outside [0, num_groups).
    """
    bad = [g for g in group_of if not 0 <= int(g) < int(num_groups)]
    if bad:
        raise ValueError(f"send_positions: group_of entries must be in [0, {num_groups}), got "
                         f"{bad[:5]}")
    if not 1 <= int(num_groups) <= max(1, len(wheres)):
        raise ValueError(f"send_positions: num_groups must be in [1, {max(1, len(wheres))}] "
                         f"(at most one output per lookup), got {num_groups}")
    with tf.device("/device:CPU:0"):
        return list(loader.op_library().mxrec_send_positions(
            where=list(wheres), order=list(orders), index=list(indices), width=width,
            offset=offset, group_of=[int(g) for g in group_of], num_groups=int(num_groups)))


def scatter_rows(emb: tf.Tensor, first: tf.Tensor, spots: tf.Tensor, rows) -> tf.Tensor:
    """[rows, dim]: zeros with emb[first[i]] added to row spots[i] (MxrecScatterRows; the
    value of scatter_nd(spots[:, None], gather(emb, first), [rows, dim])). Not
    differentiable: its users build the transpose themselves (gather_sum_rows)."""
    with tf.device("/device:CPU:0"):
        return loader.op_library().mxrec_scatter_rows(emb=emb, first=first, spots=spots,
                                                      rows=rows)


def gather_sum_rows(buffer: tf.Tensor, spots: tf.Tensor, first: tf.Tensor, owned,
                    scale: Optional[float] = None) -> tf.Tensor:
    """[owned, dim]: buffer[spots[i]] (times `scale` where given) summed into row first[i],
    in increasing i (MxrecGatherSumRows; the same floats as
    unsorted_segment_sum(gather(buffer * scale, spots), first, owned)). Not differentiable."""
    with tf.device("/device:CPU:0"):
        return loader.op_library().mxrec_gather_sum_rows(
            buffer=buffer, spots=spots, first=first, owned=owned,
            scale=tf.constant(1 if scale is None else scale, buffer.dtype),
            scaled=scale is not None)


for _name in ("MxrecPackSend", "MxrecSendPositions", "MxrecScatterRows", "MxrecGatherSumRows"):
    try:
        tf.no_gradient(_name)
    except KeyError:  # registered by an earlier import of this module
        pass


def _ranks(what: str, size) -> int:
    """`size` (a number of ranks) as an int, or ValueError naming `what` unless it is an
    integer >= 1."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ValueError(f"{what}: size (the number of ranks) must be an integer >= 1, "
                         f"got {size!r}")
    return int(size)

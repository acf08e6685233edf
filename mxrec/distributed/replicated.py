"""Tables replicated on every rank (`create_table(is_dp=True)` on several ranks).

Every rank holds the whole table and plans the whole global batch, so the replicas stay
identical without ever sending a row. A replicated lookup is the sharded lookup
(mxrec.distributed.routing) with every rank as the owner of every ID: `route` puts each
rank's unique IDs into the bucket of every peer, `id_exchange.exchange` and the owner's key
stage run unchanged, and `send_back` takes this rank's part of the result instead of
sending embeddings back:

    ids (this rank's) ─► unique, occurrence counts ─► the same bucket [chunk, 2] of (ID,
        count) to every peer (chunk: the largest local unique count of any rank)
        ─► id_exchange.exchange: every rank receives every rank's bucket, [N, chunk, 2], rank
           q's in row q ─► the IDs of the global batch in rank order, each repeated by its
           occurrences ─► the table's own key stage and lookup (admission counts every
           occurrence; every rank plans the same IDs in the same order, so every host
           table gives the same rows)
        ─► this rank's row of the result [U, dim] ─► its positions
    backward: each rank's gradient of its part goes to every rank by all-to-all (the
    transpose of taking one's part of a replicated result is summing every rank's part), so
    every replica gets the same gradient, the sum over the ranks (divided by N with
    `all2all_gradients_op="sum_gradients_and_div_by_ranksize"`), and makes the same update.

Because the pieces are the sharded lookup's, the graph modifier plans a replicated lookup
ahead of the step as it plans a sharded one (mxrec.distributed.sharded_pipeline: `route` in
the dataset's map, exchange and key stage in the planning subgraph).

A sharded table (is_dp=False) trains the same model with each ID's row on one rank; a
replicated one costs N times the memory and plans N times the IDs, and answers lookups with
no exchange of embeddings.
"""

from typing import Optional

import tensorflow as tf

from mxrec.distributed import communication, id_exchange, routing
from mxrec.util.gradients import custom_gradient


def route(ids: tf.Tensor, size: int) -> routing.Route:
    """Local dedupe and occurrence counts of `ids` (any rank >= 1), every unique ID in the
    bucket of every peer (no collective).

    The Route's `pairs` and `where` hold N x U entries, peer by peer (peer q's slot i is
    unique ID i); `order` is the identity (the unique IDs are not sorted by owner)."""
    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    uniq, index = tf.unique(flat, out_idx=tf.int32)
    num = tf.size(uniq)
    occurrences = tf.math.unsorted_segment_sum(tf.ones_like(index, tf.int64), index, num)
    pairs = tf.stack([uniq, occurrences], axis=1)
    peers = tf.repeat(tf.range(size), num)
    slots = tf.tile(tf.range(num), [size])
    return routing.Route(pairs=tf.tile(pairs, [size, 1]),
                         counts=tf.fill([size], num),
                         where=tf.stack([peers, slots], axis=1),
                         order=tf.range(num), index=index)


def send_back(table, owned_emb: tf.Tensor, exchanged: id_exchange.Exchange,
              routed: routing.Route, ids: tf.Tensor, grad_scale: Optional[float]) -> tf.Tensor:
    """This rank's part of the global batch's embeddings `owned_emb` [M, dim], spread over
    `ids`' positions: [*ids.shape, dim]. Differentiable in `owned_emb`: the gradient is the
    sum of every rank's (an all-to-all), times `grad_scale` where given."""
    size, rank = communication.get_rank_size(), communication.get_rank_id()
    dim = table.dim
    chunk = exchanged.chunk
    emb = tf.gather(owned_emb, exchanged.first)
    every = tf.reshape(tf.scatter_nd(exchanged.valid[:, None], emb,
                                     tf.stack([size * chunk, dim])),
                       tf.stack([size, chunk, dim]))
    # This rank's unique IDs, read off the route's `where` (N x U entries): the graph
    # modifier waits for the next batch's planning where a step reads the routing.
    count = tf.shape(routed.where, out_type=tf.int32)[0] // size

    @custom_gradient
    def own_part(replicated):
        def grad(d_own):
            # Every rank's gradient of its own part, to every rank: the sum over the ranks.
            own = tf.shape(routed.where, out_type=tf.int32)[0] // size
            padded = tf.pad(d_own, [[0, chunk - own], [0, 0]])
            tiled = tf.tile(padded[None], [size, 1, 1])
            d_every = communication.alltoall(tiled)
            if grad_scale is not None:
                d_every = d_every * grad_scale
            # Recorded so that the graph modifier fuses it with the step's other gradient
            # all-to-alls (mxrec.distributed.send_back.send_back_all).
            exchanged.peer_backward.append((tiled, d_every))
            return d_every

        return replicated[rank, :count], grad

    out = tf.gather(own_part(every), routed.index)
    out = tf.reshape(out, tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], 0))
    out.set_shape(ids.shape.concatenate([dim]))
    return out

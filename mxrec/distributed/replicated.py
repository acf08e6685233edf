"""Tables replicated on every rank (`create_table(is_dp=True)` on several ranks).

Every rank holds the whole table and plans the whole global batch, so the replicas stay
identical without ever sending a row:

    ids (this rank's) ─► [chunk, 2] of (ID, 1), padded (chunk: the largest batch of any rank)
        ─► the same buffer to every rank by all-to-all: [N, chunk, 2], rank q's IDs in row q
        ─► the global batch in rank order ─► the table's own key stage and lookup (admission
           counts every occurrence; every rank plans the same IDs in the same order, so every
           host table gives the same rows)
        ─► this rank's part of the result
    backward: each rank's gradient of its part goes to every rank by all-to-all (the
    transpose of taking one's part of a replicated result is summing every rank's part), so
    every replica gets the same gradient, the sum over the ranks (divided by N with
    `all2all_gradients_op="sum_gradients_and_div_by_ranksize"`), and makes the same update.

A sharded table (is_dp=False) trains the same model with each ID's row on one rank; a
replicated one costs N times the memory and plans N times the IDs, and answers lookups with
no exchange of embeddings.
"""

import zlib
from typing import Callable, Optional

import tensorflow as tf

from mxrec.distributed import communication, sharding


def _fingerprint(table, is_train: bool) -> int:
    text = (f"replicated|{table.table_name}|{table.dim}|{table.key_dtype.name}|{is_train}|"
            f"{table.all2all_gradients_op}")
    return zlib.crc32(text.encode()) & 0x3FFFFFFF


def lookup(table, ids: tf.Tensor, is_train: bool, grad_scale: Optional[float],
           lookup_global: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
    """The embeddings of `ids` (this rank's, any rank >= 1) from a replicated table.

    Args:
        table: the table (for messages and dim).
        grad_scale: factor on the summed gradients, or None.
        lookup_global: the table's lookup of the global batch's IDs (1-D) -> [n, dim].
    """
    size, rank = communication.get_rank_size(), communication.get_rank_id()
    dim = table.dim
    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    count = tf.size(flat)
    chunk = tf.maximum(sharding.agreed_max(table, count, _fingerprint(table, is_train),
                                           "table name, dim, key dtype, is_dp or is_train"), 1)
    pairs = tf.stack([flat, tf.ones_like(flat)], axis=1)
    pairs = tf.pad(pairs, [[0, chunk - count], [0, 0]])
    received = tf.reshape(communication.alltoall(tf.tile(pairs[None], [size, 1, 1])), [-1, 2])
    valid = tf.cast(tf.where(received[:, 1] > 0)[:, 0], tf.int32)
    emb = lookup_global(tf.gather(received[:, 0], valid))
    every = tf.reshape(tf.scatter_nd(valid[:, None], emb, tf.stack([size * chunk, dim])),
                       tf.stack([size, chunk, dim]))

    @tf.custom_gradient
    def own_part(replicated):
        def grad(d_own):
            # Every rank's gradient of its own part, to every rank: the sum over the ranks.
            padded = tf.pad(d_own, [[0, chunk - count], [0, 0]])
            d_every = communication.alltoall(tf.tile(padded[None], [size, 1, 1]))
            return d_every if grad_scale is None else d_every * grad_scale

        return replicated[rank, :count], grad

    out = tf.reshape(own_part(every), tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], 0))
    out.set_shape(ids.shape.concatenate([dim]))
    return out

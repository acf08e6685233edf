"""Multi-hot features: tf.SparseTensor and tf.RaggedTensor IDs, and combiners.

`sparse_lookup(table, ids, combiner=..., weights=...)` looks up the IDs of each
row and combines their rows into one, as `tf.nn.safe_embedding_lookup_sparse`
does:

    sum    sum_i w_i * e_i
    mean   sum_i w_i * e_i / sum_i w_i
    sqrtn  sum_i w_i * e_i / sqrt(sum_i w_i^2)

with w_i = 1 without weights; a row without IDs gives zeros, and with mean and
sqrtn an ID whose weight is <= 0 is dropped before the lookup (neither looked up
nor counted), as TensorFlow prunes such weights for those combiners (sum keeps
every weight, negative ones included).
Unlike TensorFlow's, negative IDs are ordinary IDs here (mxrec takes the whole
int64 range). The IDs themselves go through the ordinary lookup (direct, graph
modifier, serving export) as one flat tensor; the combination runs after it.

    SparseTensor [B, K]       -> [B, dim] (a combiner is required)
    RaggedTensor [B, (k)]     -> [B, dim], or with combiner=None [B, (k), dim]
    Tensor [*S, K], combiner  -> [*S, dim] (every position present)

Example:
    >>> ids = tf.ragged.constant([[3, 7], [], [9]], dtype=tf.int64)
    >>> emb = sparse_lookup(table, ids, combiner="mean")   # [3, dim]; row 1 is zeros
"""

from typing import Callable, Optional

import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")


def check_combiner(where: str, ids, combiner: Optional[str], weights) -> None:
    """Raises unless (ids, combiner, weights) is a combination this module takes."""
    if combiner is not None and combiner not in COMBINERS:
        raise ValueError(f"{where}: combiner must be None or one of {list(COMBINERS)}, got "
                         f"{combiner!r}")
    if isinstance(ids, tf.SparseTensor) and combiner is None:
        raise ValueError(f"{where}: a tf.SparseTensor of IDs needs a combiner "
                         f"({', '.join(COMBINERS)}); for one row per ID pass a tf.RaggedTensor "
                         "or a dense tensor")
    if weights is not None and combiner is None:
        raise ValueError(f"{where}: weights are combiner weights; pass a combiner too")
    if isinstance(ids, tf.RaggedTensor) and ids.ragged_rank != 1:
        raise ValueError(f"{where}: a tf.RaggedTensor of IDs must have ragged_rank 1 ([B, (k)]), "
                         f"got ragged_rank {ids.ragged_rank}")
    if isinstance(ids, tf.SparseTensor) and ids.shape.rank not in (None, 2):
        raise ValueError(f"{where}: a tf.SparseTensor of IDs must have rank 2 ([B, K]), got "
                         f"rank {ids.shape.rank}")


def _combine(emb: tf.Tensor, segments: tf.Tensor, weights: Optional[tf.Tensor],
             num_rows: tf.Tensor, combiner: str) -> tf.Tensor:
    """emb [N, dim] of IDs in rows `segments` [N] (sorted) -> [num_rows, dim]."""
    if weights is None:
        weights = tf.ones(tf.shape(segments), emb.dtype)
    weights = tf.cast(weights, emb.dtype)
    total = tf.math.unsorted_segment_sum(emb * tf.expand_dims(weights, 1), segments, num_rows)
    if combiner == "sum":
        return total
    if combiner == "mean":
        scale = tf.math.unsorted_segment_sum(weights, segments, num_rows)
    else:
        scale = tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, segments, num_rows))
    return tf.math.divide_no_nan(total, tf.expand_dims(scale, 1))


def _kept(values: tf.Tensor, segments: tf.Tensor, weights: Optional[tf.Tensor], combiner):
    """Drops the IDs whose weight is <= 0 for mean and sqrtn (TensorFlow's safe lookup
    prunes them for every combiner but sum)."""
    if weights is None or combiner == "sum":
        return values, segments, weights
    keep = weights > 0
    return (tf.boolean_mask(values, keep), tf.boolean_mask(segments, keep),
            tf.boolean_mask(weights, keep))


def lookup(ids, combiner: Optional[str], weights, flat_lookup: Callable[[tf.Tensor], tf.Tensor],
           where: str):
    """The multi-hot lookup of `ids`; `flat_lookup(values [N]) -> [N, dim]` is the table's.

    Args:
        ids: tf.SparseTensor [B, K], tf.RaggedTensor [B, (k)] or a dense tensor [*S, K].
        combiner: None (ragged or dense IDs only: no combination), sum, mean or sqrtn.
        weights: None, or per-ID weights of the same structure as `ids` (a SparseTensor
            with the same indices, a RaggedTensor with the same row splits, a dense tensor
            of the same shape).
        flat_lookup: looks up a 1-D tensor of IDs.
        where: the lookup, for messages.
    """
    if isinstance(ids, tf.SparseTensor):
        if weights is not None and not isinstance(weights, tf.SparseTensor):
            raise TypeError(f"{where}: weights of SparseTensor IDs must be a SparseTensor with "
                            f"the same indices, got {type(weights).__name__}")
        num_rows = tf.cast(ids.dense_shape[0], tf.int32)
        segments = tf.cast(ids.indices[:, 0], tf.int32)
        values, segments, w = _kept(ids.values, segments,
                                    None if weights is None else weights.values, combiner)
        return _combine(flat_lookup(values), segments, w, num_rows, combiner)
    if isinstance(ids, tf.RaggedTensor):
        if weights is not None and not isinstance(weights, tf.RaggedTensor):
            raise TypeError(f"{where}: weights of RaggedTensor IDs must be a RaggedTensor with "
                            f"the same row splits, got {type(weights).__name__}")
        if combiner is None:
            return ids.with_flat_values(flat_lookup(ids.flat_values))
        segments = tf.cast(ids.value_rowids(), tf.int32)
        values, segments, w = _kept(ids.flat_values, segments,
                                    None if weights is None else weights.flat_values, combiner)
        return _combine(flat_lookup(values), segments, w, tf.cast(ids.nrows(), tf.int32),
                        combiner)
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank == 0:
        raise ValueError(f"{where}: ids must have rank >= 1 (a batch), got a scalar")
    per_row = tf.shape(ids)[-1]
    outer = tf.shape(ids)[:-1]
    num_rows = tf.reduce_prod(outer)
    flat = tf.reshape(ids, [-1])
    segments = tf.range(tf.size(flat)) // tf.maximum(per_row, 1)
    w = None if weights is None else tf.reshape(tf.convert_to_tensor(weights), [-1])
    values, segments, w = _kept(flat, segments, w, combiner)
    combined = _combine(flat_lookup(values), segments, w, num_rows, combiner)
    dim = combined.shape[-1]
    out = tf.reshape(combined, tf.concat([outer, tf.shape(combined)[-1:]], axis=0))
    out.set_shape(ids.shape[:-1].concatenate([dim]))
    return out

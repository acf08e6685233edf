"""A small DLRM for the synthetic Criteo stream, and the training graphs built around it.

The model is the same whichever store holds the embeddings, so the demo and the
benchmark share it:

- `build_mxrec_training`: 26 mxrec tables addressed by raw IDs (`sparse_lookup`),
  trained by an mxrec hash optimizer; the dense part by Adam.
- `build_hashed_training`: the plain-TensorFlow baseline: each ID hashed into a
  fixed-size `tf.Variable` of the same row count and read with `tf.gather`,
  trained by the same sparse update as a TF1 optimizer; the dense part by Adam.

Example:
    >>> dense, sparse, labels = iterator.get_next()   # [B, 13], [B, 26], [B]
    >>> graph = build_mxrec_training(dense, sparse, labels, capacities=[100_000] * 26)
    >>> sess.run([graph.train_op, graph.loss])
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

EMBEDDING_DIM = 16
# Tuned on the demo's stream (1500 steps of 1024): held-out AUC about 0.76 and 0.73.
DEFAULT_SPARSE_LEARNING_RATES = {"lazy_adam": 0.01, "adagrad": 0.15}


@dataclasses.dataclass
class TrainConfig:
    """Hyper-parameters shared by both training graphs.

    Attributes:
        dim: embedding width (also the bottom MLP's output width: the DLRM dots them).
        sparse_optimizer: "adagrad" or "lazy_adam", for the embedding rows.
        sparse_learning_rate: learning rate of the sparse optimizer; None takes the
            optimizer's default in DEFAULT_SPARSE_LEARNING_RATES.
        dense_learning_rate: learning rate of Adam on the MLPs.
        bottom: hidden widths of the bottom MLP (the dense features).
        top: hidden widths of the top MLP (interactions -> logit).
        init_stddev: standard deviation of the embeddings' truncated normal initialiser.
        seed: seeds every initialiser.
        device_cache: share of each table's rows on the device; below 1 the rest lives in
            the host tier (and, with ssd_data_path, half of it on disk).
        min_device_rows: the device cache never gets fewer rows than this (it must hold a
            step's unique IDs and those of the prefetched batches).
        ssd_data_path: folder of the SSD tier's files.
    """

    dim: int = EMBEDDING_DIM
    sparse_optimizer: str = "lazy_adam"
    sparse_learning_rate: Optional[float] = None
    dense_learning_rate: float = 0.001
    bottom: Tuple[int, ...] = (64,)
    top: Tuple[int, ...] = (128, 64)
    init_stddev: float = 0.05
    seed: int = 0
    device_cache: float = 1.0
    min_device_rows: int = 0
    ssd_data_path: Optional[str] = None

    def __post_init__(self):
        if self.sparse_optimizer not in _SPARSE_OPTIMIZERS:
            raise ValueError(f"TrainConfig: sparse_optimizer must be one of "
                             f"{sorted(_SPARSE_OPTIMIZERS)}, got {self.sparse_optimizer!r}")
        if self.sparse_learning_rate is None:
            self.sparse_learning_rate = DEFAULT_SPARSE_LEARNING_RATES[self.sparse_optimizer]
        if self.dim < 1:
            raise ValueError(f"TrainConfig: dim must be >= 1, got {self.dim}")


@dataclasses.dataclass
class TrainGraph:
    """The tensors a training loop runs.

    Attributes:
        train_op: one step: the sparse and the dense update.
        loss: mean log loss of the batch.
        logits: [B] logits of the batch.
        labels: [B] labels of the batch.
        tables: the 26 embedding stores (mxrec tables or tf.Variables).
    """

    train_op: tf.Operation
    loss: tf.Tensor
    logits: tf.Tensor
    labels: tf.Tensor
    tables: List


def _mlp(x: tf.Tensor, widths: Sequence[int], seed: int, last_activation: bool) -> tf.Tensor:
    for i, width in enumerate(widths):
        fan_in = x.shape[-1]
        w = tf.compat.v1.get_variable(
            f"w{i}", [fan_in, width],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed + i))
        b = tf.compat.v1.get_variable(f"b{i}", [width], initializer=tf.zeros_initializer())
        x = tf.matmul(x, w) + b
        if last_activation or i + 1 < len(widths):
            x = tf.nn.relu(x)
    return x


def dlrm_logits(
    dense: tf.Tensor, embeddings: Sequence[tf.Tensor], config: TrainConfig
) -> tf.Tensor:
    """DLRM: bottom MLP on the dense features, pairwise dots, top MLP.

    Variables live under the variable scope "dlrm" and are reused on a second call,
    so a training and an evaluation branch share them.

    Args:
        dense: [B, 13] float32 dense features.
        embeddings: 26 tensors [B, dim], one per sparse feature.
        config: model widths and seed.

    Returns:
        [B] float32 logits.

    Example:
        >>> logits = dlrm_logits(dense, [sparse_lookup(t, sparse[:, i]) for i, t in ...],
        ...                      TrainConfig())    # [4096, 13], 26 x [4096, 16] -> [4096]
    """
    with tf.compat.v1.variable_scope("dlrm", reuse=tf.compat.v1.AUTO_REUSE):
        with tf.compat.v1.variable_scope("bottom"):
            bottom = _mlp(dense, list(config.bottom) + [config.dim], config.seed, True)
        # [B, 27, dim]: the dense summary is one more "feature" for the interactions.
        vectors = tf.stack([bottom] + list(embeddings), axis=1)
        dots = tf.matmul(vectors, vectors, transpose_b=True)
        count = len(embeddings) + 1
        # Each unordered pair once: the strict upper triangle of the [27, 27] dot matrix.
        upper = [i * count + j for i in range(count) for j in range(i + 1, count)]
        pairs = tf.gather(tf.reshape(dots, [-1, count * count]), upper, axis=1)
        with tf.compat.v1.variable_scope("top"):
            top_in = tf.concat([bottom, pairs], axis=1)
            logits = _mlp(top_in, list(config.top) + [1], config.seed + 100, False)
    return tf.squeeze(logits, axis=1)


def _log_loss(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


# mxrec.


def create_mxrec_tables(capacities: Sequence[int], config: TrainConfig) -> List:
    """One mxrec table per sparse feature, named c1..c26; call after `init()`."""
    from mxrec.core.embedding import create_table

    tables = []
    for i, capacity in enumerate(capacities):
        tiers = {}
        device_rows = int(capacity)
        if config.device_cache < 1.0:
            device_rows = min(device_rows, max(int(capacity * config.device_cache),
                                               config.min_device_rows))
            tiers["host_vocabulary_size"] = int(capacity)
            if config.ssd_data_path:
                tiers["host_vocabulary_size"] = max(int(capacity) // 2, 1)
                tiers["ssd_vocabulary_size"] = int(capacity)
                tiers["ssd_data_path"] = config.ssd_data_path
        tables.append(create_table(
            tf.int64, config.dim, f"c{i + 1}",
            tf.compat.v1.truncated_normal_initializer(stddev=config.init_stddev,
                                                      seed=config.seed + i),
            device_vocabulary_size=device_rows, **tiers))
    return tables


def mxrec_embeddings(
    tables: Sequence,
    sparse: tf.Tensor,
    is_train: bool,
    modify_graph: bool = False,
    access_and_evict_config: Optional[Dict[str, int]] = None,
) -> List[tf.Tensor]:
    """[B, 26] raw IDs -> 26 x [B, dim] through `sparse_lookup`.

    With is_train=False, no ID is inserted or counted and unseen IDs read zeros.

    Args:
        tables: the 26 mxrec tables.
        sparse: [B, 26] int64 raw IDs, from a tf.data iterator when modify_graph.
        is_train: training lookups (insert, count, admit) or evaluation lookups.
        modify_graph: let `modify_graph_and_start_emb_cache` move the key stages into
            the input pipeline.
        access_and_evict_config: admission and eviction policy of every table (see
            `sparse_lookup`); None for none.
    """
    from mxrec.core.embedding import sparse_lookup

    suffix = "" if is_train else "_eval"
    return [sparse_lookup(table, sparse[:, i], is_train=is_train,
                          name=f"{table.table_name}_lookup{suffix}",
                          modify_graph=modify_graph,
                          access_and_evict_config=access_and_evict_config)
            for i, table in enumerate(tables)]


def build_mxrec_training(
    dense: tf.Tensor,
    sparse: tf.Tensor,
    labels: tf.Tensor,
    capacities: Sequence[int],
    config: Optional[TrainConfig] = None,
    modify_graph: bool = False,
    access_and_evict_config: Optional[Dict[str, int]] = None,
) -> TrainGraph:
    """The DLRM on mxrec tables, in the default graph. Call after `init()`.

    With modify_graph, call `modify_graph_and_start_emb_cache()` after this (and after
    any other lookups) and run `get_initializer(True)` instead of the iterator's
    initializer.

    Args:
        dense: [B, 13] float32.
        sparse: [B, 26] int64 raw IDs.
        labels: [B] float32.
        capacities: device rows per table (26 ints); a table that fills up fails the step.
        config: hyper-parameters.
        modify_graph: build the lookups for the graph modifier (IDs from a tf.data
            iterator's get_next()).
        access_and_evict_config: admission/eviction policy of every table, as
            `sparse_lookup` takes it; declare the batch time (`add_timestamp`) before.

    Returns:
        The TrainGraph; its tables are the mxrec SparseEmbeddings.
    """
    from mxrec.util.variable import get_dense_and_sparse_variable

    config = config or TrainConfig()
    tables = create_mxrec_tables(capacities, config)
    embeddings = mxrec_embeddings(tables, sparse, True, modify_graph=modify_graph,
                                  access_and_evict_config=access_and_evict_config)
    logits = dlrm_logits(dense, embeddings, config)
    loss = _log_loss(logits, labels)
    dense_vars, sparse_vars = get_dense_and_sparse_variable()
    if getattr(tables[0], "is_dynamic", False):
        # Dynamic expansion: gradients of the looked-up rows, applied by address (the
        # mx_rec five-step flow).
        from mxrec.core.dynamic import (
            ASCEND_SPARSE_LOOKUP_ID_OFFSET,
            ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
        )

        local_embs = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        by_address = _BY_ADDRESS_OPTIMIZERS[config.sparse_optimizer](config.sparse_learning_rate)
        train_sparse = by_address.apply_gradients(
            list(zip(tf.gradients(loss, local_embs), addresses)))
    else:
        hash_optimizer = _SPARSE_OPTIMIZERS[config.sparse_optimizer][0](
            config.sparse_learning_rate)
        train_sparse = hash_optimizer.apply_gradients(
            zip(tf.gradients(loss, sparse_vars), sparse_vars))
    train_dense = tf.compat.v1.train.AdamOptimizer(config.dense_learning_rate).minimize(
        loss, var_list=dense_vars)
    return TrainGraph(tf.group(train_sparse, train_dense), loss, logits, labels, tables)


# Plain TensorFlow baseline.


def build_hashed_training(
    dense: tf.Tensor,
    sparse: tf.Tensor,
    labels: tf.Tensor,
    capacities: Sequence[int],
    config: Optional[TrainConfig] = None,
) -> TrainGraph:
    """The same DLRM on fixed-size tf.Variables indexed by `ID mod rows`.

    Hash collisions are the price of the fixed size; the IDs are already well mixed,
    so the modulus spreads them evenly. The sparse update is the same rule as the
    mxrec run's, as a plain TF1 optimizer (it sums repeated rows, then updates the
    touched rows only).

    Args:
        dense, sparse, labels, capacities, config: as `build_mxrec_training`.

    Returns:
        The TrainGraph; its tables are the tf.Variables [capacity, dim].
    """
    config = config or TrainConfig()
    tables, embeddings = [], []
    with tf.compat.v1.variable_scope("hashed"):
        for i, capacity in enumerate(capacities):
            table = tf.compat.v1.get_variable(
                f"c{i + 1}", [int(capacity), config.dim],
                initializer=tf.compat.v1.truncated_normal_initializer(
                    stddev=config.init_stddev, seed=config.seed + i),
                trainable=False, use_resource=True)
            rows = tf.math.floormod(sparse[:, i], tf.constant(int(capacity), tf.int64))
            tables.append(table)
            embeddings.append(tf.gather(table, rows))
    logits = dlrm_logits(dense, embeddings, config)
    loss = _log_loss(logits, labels)
    plain_optimizer = _SPARSE_OPTIMIZERS[config.sparse_optimizer][1](config.sparse_learning_rate)
    train_sparse = plain_optimizer.apply_gradients(zip(tf.gradients(loss, tables), tables))
    train_dense = tf.compat.v1.train.AdamOptimizer(config.dense_learning_rate).minimize(
        loss, var_list=tf.compat.v1.trainable_variables())
    return TrainGraph(tf.group(train_sparse, train_dense), loss, logits, labels, tables)


# Sparse optimizers: (mxrec hash optimizer, plain TF1 optimizer with the same update).


def _mxrec_adagrad(learning_rate):
    from mxrec.optimizers import adagrad

    return adagrad.create_hash_optimizer(learning_rate, initial_accumulator_value=0.9)


def _plain_adagrad(learning_rate):
    return tf.compat.v1.train.AdagradOptimizer(learning_rate, initial_accumulator_value=0.9)


def _mxrec_lazy_adam(learning_rate):
    from mxrec.optimizers import lazy_adam

    return lazy_adam.create_hash_optimizer(learning_rate)


def _plain_lazy_adam(learning_rate):
    # TF1's AdamOptimizer decays the moments of every row on a sparse update; the
    # baseline borrows mxrec's lazy update rule so both runs do the same work.
    from mxrec.optimizers.lazy_adam import CustomizedLazyAdam

    class PlainLazyAdam(tf.compat.v1.train.AdamOptimizer):
        _resource_apply_sparse = CustomizedLazyAdam._resource_apply_sparse

    return PlainLazyAdam(learning_rate)


def _by_address_adagrad(learning_rate):
    from mxrec.optimizers import adagrad_by_addr

    return adagrad_by_addr.create_hash_optimizer_by_address(learning_rate)


def _by_address_lazy_adam(learning_rate):
    from mxrec.optimizers import lazy_adam_by_addr

    return lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate)


_BY_ADDRESS_OPTIMIZERS: Dict[str, Callable] = {
    "adagrad": _by_address_adagrad,
    "lazy_adam": _by_address_lazy_adam,
}

_SPARSE_OPTIMIZERS: Dict[str, Tuple[Callable, Callable]] = {
    "adagrad": (_mxrec_adagrad, _plain_adagrad),
    "lazy_adam": (_mxrec_lazy_adam, _plain_lazy_adam),
}

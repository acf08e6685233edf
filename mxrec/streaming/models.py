"""Built-in CTR models for the streaming trainer: wide_deep, dlrm, dcn.

A model function takes the parser's feature dict and `is_train` and returns logits
[B]. It is called twice in the training graph (training and scoring branch: one
set of variables, one table per name) and once in each serving export graph, so
tables are made by `table(...)`, which creates a table on its first use in the
current mxrec runtime and returns it after.

All sparse features share one table of raw IDs (the parser salts each feature's
IDs, so features never share a row); wide_deep adds a one-wide table for its
linear part. Dense features enter as sign(x) * log(1 + |x|).

Example:
    >>> model_fn = make_model_fn(ModelConfig("dcn", dim=8, hidden=(64, 32)))
    >>> logits = model_fn({"dense": dense, "sparse": sparse}, is_train=True)   # [B]
"""

import dataclasses
from typing import Callable, Dict, Optional, Sequence

import tensorflow as tf

from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.util.config import get_config_initializer

MODELS = ("wide_deep", "dlrm", "dcn")
STORAGE_DTYPES = ("float32", "bfloat16", "float16")
# Plain TensorFlow bucket variables (ModelConfig.buckets): the trainer updates them with
# Adagrad at the sparse learning rate, as mxrec's tables.
BUCKET_VARIABLES = "mxrec_streaming_bucket_variables"
ModelFn = Callable[[Dict[str, tf.Tensor], bool], tf.Tensor]


@dataclasses.dataclass
class ModelConfig:
    """A built-in model and its table settings.

    Attributes:
        kind: "wide_deep", "dlrm" or "dcn".
        dim: embedding width.
        hidden: widths of the deep MLP (the top MLP of dlrm).
        cross_layers: cross layers of dcn.
        vocabulary: device rows of each table (`device_vocabulary_size`).
        init_stddev: standard deviation of new rows (truncated normal); 0 gives zeros.
        init_by_id: new IDs' first values drawn from the ID (create_table(init_by_id=
            True)): the same on 1 and N ranks, after a restart and after eviction, so
            that those runs train the same model; False: from the row the ID gets (which
            depends on the arrival order, the rank count and random-op state). No effect
            with init_stddev 0 (zeros for every ID) or with buckets.
        access_threshold: admission count (None: every ID gets a row at once).
        eviction_threshold: seconds of data time an ID may stay unseen (None: no eviction).
        seed: seeds every initializer.
        buckets: the plain-TensorFlow baseline instead of mxrec tables: each table is a
            tf.Variable of this many rows, an ID reads row ID mod buckets (collisions
            share a row); no admission or eviction.
        host_vocabulary: rows of each table in host memory for IDs past its `vocabulary`
            device rows (a host tier: the device rows become a cache); 0: none. Both are
            per rank on several ranks.
        storage_dtype: the dtype each table's rows rest in: "float32", "bfloat16" or
            "float16" (create_table(storage_dtype=...); in the device rows and the host
            tier alike; not with buckets).
    """

    kind: str = "wide_deep"
    dim: int = 8
    hidden: Sequence[int] = (64, 32)
    cross_layers: int = 2
    vocabulary: int = 200_000
    init_stddev: float = 0.01
    init_by_id: bool = True
    access_threshold: Optional[int] = None
    eviction_threshold: Optional[int] = None
    seed: int = 0
    buckets: Optional[int] = None
    host_vocabulary: int = 0
    storage_dtype: str = "float32"

    def __post_init__(self):
        if self.host_vocabulary < 0 or (self.host_vocabulary and self.buckets is not None):
            raise ValueError("model: host_vocabulary must be >= 0 and excludes buckets, got "
                             f"{self.host_vocabulary}")
        if self.buckets is not None and (self.buckets < 1 or self.access_threshold is not None
                                         or self.eviction_threshold is not None):
            raise ValueError("model: buckets must be >= 1 and excludes access_threshold and "
                             f"eviction_threshold, got {self.buckets}")
        if self.storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"model: storage_dtype must be one of {STORAGE_DTYPES}, got "
                             f"{self.storage_dtype!r}")
        if self.storage_dtype != "float32" and self.buckets is not None:
            raise ValueError(f"model: storage_dtype {self.storage_dtype} is for mxrec tables, "
                             "not the plain-TensorFlow baseline (buckets)")
        if self.kind not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.kind!r}")
        if self.dim < 1 or self.vocabulary < 1 or self.cross_layers < 0:
            raise ValueError(f"model: dim, vocabulary must be >= 1 and cross_layers >= 0, "
                             f"got {self.dim}, {self.vocabulary}, {self.cross_layers}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"model: hidden widths must be >= 1, got {list(self.hidden)}")
        if self.access_threshold is not None and self.access_threshold < 0:
            raise ValueError(f"model: access_threshold must be >= 0, got {self.access_threshold}")
        if self.eviction_threshold is not None and self.eviction_threshold < 1:
            raise ValueError("model: eviction_threshold must be >= 1 second, got "
                             f"{self.eviction_threshold}")


def table(name: str, dim: int, vocabulary: int, initializer, host_vocabulary: int = 0,
          init_by_id: bool = False, storage_dtype: str = "float32"):
    """The mxrec table `name` of the current runtime, created on first use (with a host
    tier of `host_vocabulary` rows when > 0; init_by_id, storage_dtype: create_table's)."""
    existing = get_config_initializer().tables.get(name)
    if existing is not None and existing.variable.graph is tf.compat.v1.get_default_graph():
        return existing
    return create_table(tf.int64, dim, name, initializer, device_vocabulary_size=vocabulary,
                        host_vocabulary_size=host_vocabulary, init_by_id=init_by_id,
                        storage_dtype=storage_dtype)


def _lookup_config(config: ModelConfig):
    if config.access_threshold is None and config.eviction_threshold is None:
        return None
    # eviction needs an access threshold in mxrec's config; 0 admits at once
    settings = {"access_threshold": int(config.access_threshold or 0)}
    if config.eviction_threshold is not None:
        settings["eviction_threshold"] = config.eviction_threshold
    return settings


def _initializer(config: ModelConfig, seed_offset: int):
    if config.init_stddev == 0:
        return tf.compat.v1.zeros_initializer()
    return tf.compat.v1.truncated_normal_initializer(stddev=config.init_stddev,
                                                     seed=config.seed + seed_offset)


def _dense_layer(x, units, name, seed, activation=None):
    kernel = tf.compat.v1.get_variable(
        f"{name}/kernel", [x.shape[-1], units],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
    bias = tf.compat.v1.get_variable(f"{name}/bias", [units], initializer=tf.zeros_initializer())
    out = tf.matmul(x, kernel) + bias
    return activation(out) if activation else out


def _mlp(x, widths, name, seed):
    for i, width in enumerate(widths):
        x = _dense_layer(x, width, f"{name}/layer{i}", seed + i, tf.nn.relu)
    return x


def _dense_input(features) -> Optional[tf.Tensor]:
    dense = features.get("dense")
    if dense is None:
        return None
    return tf.sign(dense) * tf.math.log1p(tf.abs(dense))


def _bucket_lookup(name: str, dim: int, buckets: int, initializer, ids: tf.Tensor):
    """The baseline: ids [B, S] -> rows of a [buckets, dim] variable at ID mod buckets."""
    graph = tf.compat.v1.get_default_graph()
    with tf.compat.v1.variable_scope("buckets", reuse=tf.compat.v1.AUTO_REUSE):
        variable = tf.compat.v1.get_variable(name, [buckets, dim], initializer=initializer)
    if variable.ref() not in {v.ref() for v in graph.get_collection(BUCKET_VARIABLES)}:
        graph.add_to_collection(BUCKET_VARIABLES, variable)
    return tf.gather(variable, tf.math.floormod(ids, buckets))


def _embed(config: ModelConfig, name: str, dim: int, initializer, sparse, is_train, access):
    if config.buckets is not None:
        return _bucket_lookup(name, dim, config.buckets, initializer, sparse)
    # Constant (zeros) initializers give every ID the same values: nothing to key.
    by_id = config.init_by_id and not isinstance(initializer, tf.compat.v1.zeros_initializer)
    return sparse_lookup(table(name, dim, config.vocabulary, initializer,
                               config.host_vocabulary, by_id, config.storage_dtype), sparse,
                         is_train=is_train, name=f"{name}_{'train' if is_train else 'eval'}",
                         access_and_evict_config=access)


def make_model_fn(config: ModelConfig) -> ModelFn:
    """A model function (features, is_train) -> logits [B] for a built-in model."""

    def model_fn(features: Dict[str, tf.Tensor], is_train: bool) -> tf.Tensor:
        sparse = features["sparse"]  # [B, S]
        num_sparse = sparse.shape[1]
        access = _lookup_config(config)
        emb = _embed(config, "embedding", config.dim, _initializer(config, 1), sparse,
                     is_train, access)  # [B, S, dim]
        if config.kind == "wide_deep":  # tables outside variable scopes: names as given
            wide = _embed(config, "wide", 1, tf.compat.v1.zeros_initializer(), sparse,
                          is_train, access)  # [B, S, 1]
        dense = _dense_input(features)
        with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
            flat = tf.reshape(emb, [-1, num_sparse * config.dim])
            deep_in = flat if dense is None else tf.concat([flat, dense], axis=1)
            if config.kind == "wide_deep":
                logits = tf.reduce_sum(wide, axis=[1, 2])
                if dense is not None:
                    logits += tf.squeeze(_dense_layer(dense, 1, "wide_dense", config.seed), 1)
                deep = _mlp(deep_in, config.hidden, "deep", config.seed + 10)
                logits += tf.squeeze(_dense_layer(deep, 1, "deep_out", config.seed + 20), 1)
            elif config.kind == "dlrm":
                vectors = emb
                if dense is not None:
                    bottom = _mlp(dense, [config.dim], "bottom", config.seed + 30)
                    vectors = tf.concat([tf.expand_dims(bottom, 1), emb], axis=1)
                count = vectors.shape[1]
                dots = tf.matmul(vectors, vectors, transpose_b=True)  # [B, n, n]
                upper = [i * count + j for i in range(count) for j in range(i + 1, count)]
                pairs = tf.gather(tf.reshape(dots, [-1, count * count]), upper, axis=1)
                top_in = tf.concat([tf.reshape(vectors, [-1, count * config.dim]), pairs], 1)
                top = _mlp(top_in, config.hidden, "top", config.seed + 40)
                logits = tf.squeeze(_dense_layer(top, 1, "top_out", config.seed + 50), 1)
            else:  # dcn
                x0 = deep_in
                x = x0
                width = x0.shape[-1]
                for i in range(config.cross_layers):
                    w = tf.compat.v1.get_variable(
                        f"cross{i}/w", [width, 1],
                        initializer=tf.compat.v1.glorot_uniform_initializer(
                            seed=config.seed + 60 + i))
                    b = tf.compat.v1.get_variable(f"cross{i}/b", [width],
                                                  initializer=tf.zeros_initializer())
                    x = x0 * tf.matmul(x, w) + b + x
                deep = _mlp(deep_in, config.hidden, "deep", config.seed + 70)
                logits = tf.squeeze(_dense_layer(tf.concat([x, deep], 1), 1, "out",
                                                 config.seed + 80), 1)
        return logits

    return model_fn


__all__ = ["MODELS", "BUCKET_VARIABLES", "ModelConfig", "make_model_fn", "table"]

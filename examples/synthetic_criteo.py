"""A synthetic, Criteo-like click stream: 13 dense features, 26 sparse features, a label.

Each sparse feature draws item ranks from a truncated power law (Zipf-like: a few
items are very frequent, most are rare). A rank becomes an ID through a fixed
bijective mix (splitmix64 of the feature and the item), so IDs cover the whole
signed 64-bit range, negatives included, as hashed production IDs do. The
stream is non-stationary in the way that matters to an embedding table: each
feature's vocabulary grows with the batch index, and the item behind a rank
can drift, so new IDs keep arriving.

Labels come from a hidden model: a logistic regression over a per-(feature, item)
weight, a linear term on the dense features and a factorisation-machine term over
small per-(feature, item) vectors. The hidden parameters are hashes of
(seed, feature, item), so nothing is stored and every batch is a pure function of
(seed, batch index): batches can be generated in any order, in any process.

Example:
    >>> gen = SyntheticCriteo(seed=7)
    >>> dense, sparse, labels = gen.batch(index=0, batch_size=4096)
    >>> dense.shape, dense.dtype      # ((4096, 13), float32), log1p of counts
    >>> sparse.shape, sparse.dtype    # ((4096, 26), int64), raw IDs over all of int64
    >>> labels.shape, labels.dtype    # ((4096,), float32), 0.0 or 1.0
"""

from typing import Optional, Sequence, Tuple, Union

import numpy as np

NUM_DENSE = 13
NUM_SPARSE = 26

# Cardinalities of the 26 categorical columns of the Criteo Kaggle (display
# advertising) data set; the generator caps them at `max_vocab`.
CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Salts of the two hash streams: item -> ID, and ID -> hidden parameters.
_SALT_ID = 0x1D
_SALT_PARAMS = 0x3B


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array: a bijection of the 64-bit integers.

    Args:
        x: uint64 array.

    Returns:
        uint64 array of the same shape; distinct inputs give distinct outputs.
    """
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _stream_key(seed: int, salt: int, feature: np.ndarray) -> np.ndarray:
    """A uint64 key per feature for one hash stream of one seed."""
    base = splitmix64(np.array([(seed * 0x100 + salt) & 0xFFFFFFFFFFFFFFFF], np.uint64))
    return splitmix64(base ^ np.asarray(feature, np.uint64))


class SyntheticCriteo:
    """Generator of the synthetic stream. Deterministic from `seed`.

    Args:
        seed: seeds the IDs, the hidden model and the samples.
        max_vocab: cap on each feature's final vocabulary (Criteo's cardinalities are
            used up to this cap).
        vocab_sizes: explicit final vocabulary per feature (26 ints); overrides the
            Criteo cardinalities and `max_vocab`.
        alpha: power-law exponent of the rank distribution (> 0; ~1.1 is Criteo-like),
            one for all features or one per feature.
        initial_vocab_fraction: share of the final vocabulary available at batch 0.
        growth_batches: batches over which the vocabulary grows linearly to its final size.
        drift_per_batch: items the rank-to-item mapping shifts per batch; > 0 brings new
            IDs in at the head too (popular items get replaced).
        linear_scale: standard deviation of the logit's term from per-item weights.
        interaction_scale: standard deviation of the logit's FM term (pairs of features).
        dense_scale: standard deviation of the logit's term from the dense features.
        bias: hidden intercept; sets the positive rate (about 23% by default; Criteo's is 26%).

    Example:
        >>> gen = SyntheticCriteo(seed=1, max_vocab=100_000)
        >>> dense, sparse, labels = gen.batch(3, 1024)   # [1024, 13], [1024, 26], [1024]
        >>> gen.distinct_id_bound(num_batches=500)        # [26] rows a table needs
    """

    def __init__(
        self,
        seed: int = 0,
        max_vocab: int = 200_000,
        vocab_sizes: Optional[Sequence[int]] = None,
        alpha: Union[float, Sequence[float]] = 1.1,
        initial_vocab_fraction: float = 0.5,
        growth_batches: int = 1000,
        drift_per_batch: float = 0.0,
        linear_scale: float = 1.0,
        interaction_scale: float = 0.8,
        dense_scale: float = 0.7,
        bias: float = -1.6,
    ):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"SyntheticCriteo: seed must be an int >= 0, got {seed!r}")
        if vocab_sizes is None:
            if max_vocab < 1:
                raise ValueError(f"SyntheticCriteo: max_vocab must be >= 1, got {max_vocab}")
            vocab_sizes = [min(c, max_vocab) for c in CRITEO_CARDINALITIES]
        vocab = np.asarray(vocab_sizes, np.int64)
        if vocab.shape != (NUM_SPARSE,) or (vocab < 1).any():
            raise ValueError(f"SyntheticCriteo: vocab_sizes must be {NUM_SPARSE} ints >= 1, "
                             f"got {vocab_sizes!r}")
        alpha = np.broadcast_to(np.asarray(alpha, np.float64), (NUM_SPARSE,)).copy()
        if (alpha <= 0).any():
            raise ValueError(f"SyntheticCriteo: alpha must be > 0, got {alpha.tolist()}")
        if not 0.0 < initial_vocab_fraction <= 1.0:
            raise ValueError("SyntheticCriteo: initial_vocab_fraction must be in (0, 1], "
                             f"got {initial_vocab_fraction}")
        if growth_batches < 1:
            raise ValueError(f"SyntheticCriteo: growth_batches must be >= 1, got {growth_batches}")
        if drift_per_batch < 0:
            raise ValueError(f"SyntheticCriteo: drift_per_batch must be >= 0, "
                             f"got {drift_per_batch}")
        self.seed = int(seed)
        self.vocab_sizes = vocab
        self.alpha = alpha
        self.initial_vocab_fraction = float(initial_vocab_fraction)
        self.growth_batches = int(growth_batches)
        self.drift_per_batch = float(drift_per_batch)
        self.linear_scale = float(linear_scale)
        self.interaction_scale = float(interaction_scale)
        self.bias = float(bias)

        features = np.arange(NUM_SPARSE, dtype=np.uint64)
        self._id_keys = _stream_key(self.seed, _SALT_ID, features)
        self._param_keys = _stream_key(self.seed, _SALT_PARAMS, features)
        # [26 * 4, 4]: sums lane j of every feature into column j.
        self._lane_sum = np.tile(np.eye(4, dtype=np.float32), (NUM_SPARSE, 1))
        # The dense features: count = floor(exp(mu + sigma * z)); the label sees z.
        rng = np.random.default_rng([self.seed, 0xDE])
        self._dense_mu = rng.uniform(0.0, 3.0, NUM_DENSE)
        self._dense_sigma = rng.uniform(0.5, 1.5, NUM_DENSE)
        weights = rng.standard_normal(NUM_DENSE)
        self._dense_weights = dense_scale * weights / np.linalg.norm(weights)
        # alpha == 1 has no power-law inverse CDF (1 - alpha = 0): those features take the
        # logarithmic one.
        self._one_minus_alpha = 1.0 - alpha
        self._log_branch = np.abs(self._one_minus_alpha) < 1e-9

    # The stream's shape over time.

    def vocab_at(self, index: int) -> np.ndarray:
        """[26] int64: the vocabulary of each feature at batch `index`."""
        grown = min(1.0, self.initial_vocab_fraction
                    + (1.0 - self.initial_vocab_fraction) * index / self.growth_batches)
        return np.maximum(1, np.ceil(self.vocab_sizes * grown)).astype(np.int64)

    def offset_at(self, index: int) -> int:
        """The item that rank 1 maps to at batch `index` (the drift)."""
        return int(self.drift_per_batch * index)

    def distinct_id_bound(self, num_batches: int, start: int = 0) -> np.ndarray:
        """[26] int64: at most this many distinct IDs per feature in batches [start, start+n).

        Sizes the tables: every such ID is the item of a rank in [1, vocab] shifted by
        the drift, so the items lie in [offset(start), offset(last) + vocab(last)).
        """
        last = start + max(num_batches, 1) - 1
        return self.vocab_at(last) + self.offset_at(last) - self.offset_at(start)

    # Samples.

    def _ranks(self, uniform: np.ndarray, vocab: np.ndarray) -> np.ndarray:
        """Inverse CDF of the continuous power law on [1, vocab + 1), floored to [1, vocab].

        Args:
            uniform: [B, 26] in [0, 1).
            vocab: [26].
        """
        top = (vocab + 1).astype(np.float64)
        if not self._log_branch.any():
            x = np.power((np.power(top, self._one_minus_alpha) - 1.0) * uniform + 1.0,
                         1.0 / self._one_minus_alpha)
        else:
            one_minus_alpha = np.where(self._log_branch, 1.0, self._one_minus_alpha)
            power = np.power((np.power(top, one_minus_alpha) - 1.0) * uniform + 1.0,
                             1.0 / one_minus_alpha)
            x = np.where(self._log_branch, np.power(top, uniform), power)
        return np.clip(np.floor(x), 1, vocab).astype(np.int64)

    def ids_of_items(self, items: np.ndarray) -> np.ndarray:
        """[B, 26] item numbers (>= 0) -> [B, 26] int64 IDs; a bijection per feature."""
        return splitmix64(items.astype(np.uint64) ^ self._id_keys).view(np.int64)

    def _hidden_logits(self, sparse: np.ndarray, dense_latent: np.ndarray) -> np.ndarray:
        """The hidden model's logit per sample: bias + linear + FM + dense terms.

        One 64-bit hash per (sample, feature) gives four 16-bit lanes: the item's
        weight and its 3-wide FM vector. Hashing the (already unique) ID again,
        rather than the item per lane, keeps the generator at a few ms per batch.
        """
        with np.errstate(over="ignore"):
            h = (sparse.view(np.uint64) ^ self._param_keys) * np.uint64(0xD6E8FEB86659FD93)
            h ^= h >> np.uint64(32)
            h *= np.uint64(0xD6E8FEB86659FD93)
            h ^= h >> np.uint64(29)
        # Four little-endian 16-bit lanes per hash, as uniforms on (-sqrt(3), sqrt(3)): unit
        # variance, cheaper than Gaussians. Lane 0 is the item's weight, lanes 1-3 its vector.
        lanes = h.astype("<u8").view("<u2").reshape(len(h), NUM_SPARSE * 4).astype(np.float32)
        lanes = lanes * np.float32(2.0 * np.sqrt(3.0) / 65536.0) - np.float32(np.sqrt(3.0))
        # Per-lane sums over the features as one matmul: strided reductions cost more.
        per_lane = (lanes @ self._lane_sum).astype(np.float64)
        linear = per_lane[:, 0] * (self.linear_scale / np.sqrt(NUM_SPARSE))
        logits = self.bias + linear + dense_latent @ self._dense_weights
        if self.interaction_scale > 0:
            # sum_{i<j} <v_i, v_j> = (|sum v|^2 - sum |v|^2) / 2 over the 26 features: a sum
            # of #pairs terms of variance 3, normalised to unit variance.
            summed = per_lane[:, 1:]
            squares = ((lanes * lanes) @ self._lane_sum[:, 1:].sum(axis=1)).astype(np.float64)
            pairs = 0.5 * ((summed * summed).sum(axis=1) - squares)
            num_pairs = NUM_SPARSE * (NUM_SPARSE - 1) / 2
            logits = logits + self.interaction_scale * pairs / np.sqrt(3.0 * num_pairs)
        return logits

    def batch(
        self, index: int, batch_size: int, return_logits: bool = False
    ) -> Tuple[np.ndarray, ...]:
        """Batch number `index` of the stream.

        Args:
            index: batch number (>= 0); the batch depends only on (seed, index).
            batch_size: samples in the batch.
            return_logits: also return the hidden model's logits (the Bayes-optimal scores).

        Returns:
            dense float32 [B, 13] (log1p of counts), sparse int64 [B, 26] (raw IDs),
            labels float32 [B] (0 or 1) and, with return_logits, float64 [B].
        """
        if index < 0 or batch_size < 1:
            raise ValueError(f"SyntheticCriteo.batch: need index >= 0 and batch_size >= 1, "
                             f"got index={index}, batch_size={batch_size}")
        rng = np.random.default_rng([self.seed, 0xBA7C, int(index)])
        ranks = self._ranks(rng.random((batch_size, NUM_SPARSE)), self.vocab_at(index))
        items = ranks - 1 + self.offset_at(index)
        sparse = self.ids_of_items(items)

        dense_latent = rng.standard_normal((batch_size, NUM_DENSE))
        counts = np.floor(np.exp(self._dense_mu + self._dense_sigma * dense_latent))
        dense = np.log1p(counts).astype(np.float32)

        logits = self._hidden_logits(sparse, dense_latent)
        labels = (rng.random(batch_size) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        if return_logits:
            return dense, sparse, labels, logits
        return dense, sparse, labels

    def batches(self, start: int, num_batches: int, batch_size: int):
        """Yields `batch(i, batch_size)` for i in [start, start + num_batches)."""
        for index in range(start, start + num_batches):
            yield self.batch(index, batch_size)

    def stacked(self, start: int, num_batches: int, batch_size: int) -> Tuple[np.ndarray, ...]:
        """Batches [start, start+n) stacked: dense [n, B, 13], sparse [n, B, 26], labels [n, B]."""
        parts = list(zip(*self.batches(start, num_batches, batch_size)))
        return tuple(np.stack(p) for p in parts)

    def dataset(self, start: int, num_batches: int, batch_size: int):
        """A tf.data.Dataset of batches [start, start+n), generated as it is read.

        Returns:
            Dataset of (dense [B, 13] float32, sparse [B, 26] int64, labels [B] float32).
        """
        import tensorflow as tf

        signature = (
            tf.TensorSpec([batch_size, NUM_DENSE], tf.float32),
            tf.TensorSpec([batch_size, NUM_SPARSE], tf.int64),
            tf.TensorSpec([batch_size], tf.float32),
        )
        return tf.data.Dataset.from_generator(
            lambda: self.batches(start, num_batches, batch_size), output_signature=signature)


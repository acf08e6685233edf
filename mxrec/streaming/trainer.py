"""The streaming trainer: each ready partition once, in time order, with delivery.

Per partition (ElasticCTR's loop, PaddlePaddle's day/pass structure):

    first partition of a new day: evict/shrink the tables (per-day shrink)
    score the partition with the current model (progressive validation: AUC, log loss,
        calibration), before any update from it
    train one pass over it
    save a checkpoint version (full on the first partition of a day, or every N; else delta)
    write a serving version EXPORT_BASE/<step> (full: a fresh SavedModel; delta: the
        previous version with the changed rows and the dense variables applied)
    append a donefile line (atomically)

Exactly once: the donefile line is written last, so after a crash (at any point) a
restart restores the checkpoint version of the donefile's last line, deletes the
checkpoint and serving versions written after it, and continues with the partition
after the last one recorded. Training is deterministic for a fixed data order, so the
model equals that of a run that never stopped.

Several ranks (`python -m mxrec.launch -n N -m mxrec.streaming train ...` or `mpirun -n N
python -m mxrec.streaming train ...`, the same flags): the tables are sharded over the ranks
(mxrec.distributed, whichever engine); each global batch of `batch_size` lines, as one
process reads it, is cut into N contiguous slices, rank r parsing only its slice
(parsers.make_dataset), so every rank runs the same steps (a slice may be empty) and the ranks
together train what one process trains. The loss is the sum over the rank's rows divided by
the global batch's rows (an all-reduce), the dense gradients are summed over the ranks, the
tables' gradients meet at their owners. Rank 0 decides which partition comes next and tells
the others (an all-reduce), so ranks that list the data root at different moments still
agree. Progressive validation gathers every rank's labels and logits (all-reduces of
fixed-size chunks) and computes one AUC per partition. The checkpoint is mxrec's sharded
Saver (a collective save; a restore on another rank count reshards); rank 0 alone cleans
what a crash left, builds the serving version from the sharded checkpoint, and appends the
donefile line, once every rank's shard is saved.

Faults for tests: the environment variable MXREC_STREAMING_FAULT="<stage>:<step>[:<rank>]"
(stage one of after_train, after_checkpoint, after_export, after_donefile) kills the process
(on several ranks: every rank, or only rank <rank>) with SIGKILL at that point of that step.

Example:
    >>> config = StreamConfig(data="/data/stream", workdir="/ckpt", export_base="/serving/ctr")
    >>> StreamingTrainer(config, make_model_fn(ModelConfig("wide_deep"))).run()
"""

import dataclasses
import functools
import json
import os
import posixpath
import re
import signal
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import config_pb2

from mxrec import initialize
from mxrec.core.embedding import add_timestamp
from mxrec.distributed import communication
from mxrec.export import quantize as quantizer
from mxrec.export import saved_model
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.saver import manifest as checkpoint_manifest
from mxrec.saver.checkpoint import NonFiniteError, Saver
from mxrec.saver.manifest import list_versions as checkpoint_versions
from mxrec.serving import versions as serving_versions
from mxrec.serving.predictor import DELTA_FILE, write_delta
from mxrec.streaming import donefile, metrics, ownership
from mxrec.streaming.feed import PartitionFeed
from mxrec.streaming.models import BUCKET_VARIABLES
from mxrec.streaming.parsers import (
    BadLineCounter,
    MalformedDataError,
    Schema,
    features_from_raw,
    raw_feature_inputs,
)
from mxrec.streaming.partitions import (
    DONE_MARKER,
    Partition,
    list_partitions,
    of_granularity,
    partition_at,
)
from mxrec.util import shared_dirs
from mxrec.util.variable import get_dense_and_sparse_variable

FAULT_ENV = "MXREC_STREAMING_FAULT"
# The serving signatures of each exported version: pre-hashed IDs (the default) and the
# columns as they appear in the data, hashed inside the graph as the parser does.
DEFAULT_SIGNATURE = "serving_default"
RAW_SIGNATURE = "raw"
VALIDATION_MODES = ("partition", "batch", "none")
NONFINITE_ACTIONS = ("stop", "skip")
# Several ranks: labels and logits are gathered in chunks of this many rows (one all-reduce
# of a fixed shape per chunk), and per-partition counts in one all-reduce of this many values
# (plus one per rank).
GATHER_CHUNK = 16384
_SCALARS = 64
# What each step reports besides its results: the batch's malformed lines and lines read.
_REPORT = ("bad_file", "bad_line", "bad_column", "lines")


@dataclasses.dataclass
class StreamConfig:
    """What the streaming trainer reads, writes and how often.

    Attributes:
        data: the data root (ROOT/yyyyMMdd/hh or ROOT/yyyyMMdd partitions).
        schema: the records' schema (parsers.CRITEO_TSV, ...).
        workdir: checkpoints (`workdir/checkpoints`), the donefile (`workdir/donefile.jsonl`),
            TensorBoard scalars (`workdir/tensorboard`).
        export_base: where serving versions go (EXPORT_BASE/<step>); None: no export.
        batch_size: lines per batch.
        done_marker: the file that marks a partition ready.
        validation: "partition" (score the whole partition before training on it),
            "batch" (each batch's logits before its update: no extra pass), or "none".
        full_every: "day" (a full version on a day's first partition) or a number of
            partitions between full versions; the others are deltas.
        shrink_days: on a new day, remove IDs unseen for this many days of shrink calls
            (PaddlePaddle's shrink); None: no shrink.
        evict_daily: on a new day, evict IDs older than their table's eviction_threshold
            (data time: the records' time column, else the partition's start).
        max_bad_lines: malformed lines allowed per partition; more stop the run.
        watch: keep polling for new partitions; otherwise stop when none is left.
        poll_interval: seconds between polls in watch mode.
        deadline: in watch mode, stop at this time.time() when idle; None: never.
        max_partitions: stop after training this many partitions in this run (None: all).
        dense_learning_rate, sparse_learning_rate: Adam on dense, Adagrad on tables.
        keep_full_versions: full checkpoint versions kept (with their deltas).
        progress: print a progress line per partition.
        tensorboard: write per-partition scalars.
        threads: intra/inter op threads of the session (0: TensorFlow's default).
        granularity: "daily" trains only ROOT/yyyyMMdd partitions, "hourly" only
            ROOT/yyyyMMdd/hh ones; None (default) both.
        on_nonfinite: what a partition whose trained model holds a NaN or an infinity (in
            a dense weight, or a table row or slot the checkpoint would write) does: "stop"
            (the run ends with an error naming the partition; nothing of it is saved or
            delivered) or "skip" (the model goes back to the last good checkpoint, the
            partition is recorded as skipped in the donefile, the stream goes on). Either
            way no version of it is delivered: the predictor keeps the last good one.
        delta_export: a delta partition's serving version holds "savedmodel" (a complete
            SavedModel, the previous one with the delta applied: TF Serving loads it; costs
            in proportion to the table) or "delta_only" (only the changed rows and the dense
            values: costs in proportion to the rows changed; mxrec's predictor applies it
            in place, TF Serving cannot load it). Both hold the delta file.
        serving_quantize: None (serving versions hold float32 rows) or "int8" (each row as
            uint8 codes with its own scale and offset, dequantized in the graph; deltas and
            the delta file in the same form: mxrec.export.quantize).
    """

    data: str
    schema: Schema
    workdir: str
    export_base: Optional[str] = None
    batch_size: int = 512
    done_marker: str = DONE_MARKER
    validation: str = "partition"
    full_every: object = "day"
    shrink_days: Optional[int] = None
    evict_daily: bool = False
    max_bad_lines: int = 0
    watch: bool = False
    poll_interval: float = 60.0
    deadline: Optional[float] = None
    max_partitions: Optional[int] = None
    dense_learning_rate: float = 0.001
    sparse_learning_rate: float = 0.05
    keep_full_versions: Optional[int] = 3
    progress: bool = True
    tensorboard: bool = True
    threads: int = 0
    delta_export: str = "savedmodel"
    granularity: Optional[str] = None
    on_nonfinite: str = "stop"
    serving_quantize: Optional[str] = None

    def __post_init__(self):
        quantizer.check_quantize(self.serving_quantize, "StreamConfig.serving_quantize")
        if self.granularity not in (None, "daily", "hourly"):
            raise ValueError("granularity must be None, 'daily' or 'hourly', got "
                             f"{self.granularity!r}")
        if self.delta_export not in ("savedmodel", "delta_only"):
            raise ValueError("delta_export must be 'savedmodel' or 'delta_only', got "
                             f"{self.delta_export!r}")
        if self.on_nonfinite not in NONFINITE_ACTIONS:
            raise ValueError(f"on_nonfinite must be one of {NONFINITE_ACTIONS}, got "
                             f"{self.on_nonfinite!r}")
        if self.validation not in VALIDATION_MODES:
            raise ValueError(f"validation must be one of {VALIDATION_MODES}, got "
                             f"{self.validation!r}")
        if self.full_every != "day" and (not isinstance(self.full_every, int)
                                         or self.full_every < 1):
            raise ValueError(f"full_every must be 'day' or an int >= 1, got {self.full_every!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.shrink_days is not None and self.shrink_days < 1:
            raise ValueError(f"shrink_days must be >= 1, got {self.shrink_days}")
        if self.max_bad_lines < 0:
            raise ValueError(f"max_bad_lines must be >= 0, got {self.max_bad_lines}")
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {self.poll_interval}")
        if not tf.io.gfile.isdir(self.data):
            raise FileNotFoundError(f"data root {self.data!r} is not a folder")

    @property
    def checkpoint_dir(self) -> str:
        return posixpath.join(self.workdir, "checkpoints")

    @property
    def donefile(self) -> str:
        return posixpath.join(self.workdir, "donefile.jsonl")


def _fault(stage: str, step: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec and spec.count(":") == 2:  # "<stage>:<step>:<rank>": only that rank
        spec, _, rank = spec.rpartition(":")
        if rank != str(communication.get_rank_id()):
            return
    if spec and spec == f"{stage}:{step}":
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _serving_inputs(schema: Schema) -> Dict[str, tf.Tensor]:
    inputs = {"sparse": tf.compat.v1.placeholder(tf.int64, [None, schema.num_sparse],
                                                 name="sparse")}
    if schema.num_dense:
        inputs["dense"] = tf.compat.v1.placeholder(tf.float32, [None, schema.num_dense],
                                                   name="dense")
    return inputs


class StreamingTrainer:
    """Trains a model function on a stream of partitions; see the module docstring.

    Args:
        config: a StreamConfig.
        model_fn: (features, is_train) -> logits [B]; features has "sparse" int64 [B, S]
            and, when the schema has dense columns, "dense" float32 [B, D]. It is called
            for training, for scoring and twice in each serving export (the pre-hashed and
            the raw signature), so it must reuse its variables and tables on a later call in
            the same graph (see models.make_model_fn).
    """

    def __init__(self, config: StreamConfig, model_fn: Callable):
        self.config = config
        self.model_fn = model_fn
        self.entries: List[Dict] = []

    # ------------------------------------------------------------------ graph

    def _build(self):
        """The run's graph: the scoring branch, the training step, the ranks' collectives,
        the Saver; then finalized."""
        cfg = self.config
        self._build_scoring()
        self._build_training()
        self._runtime = initialize.get_config_initializer()
        self._saver = Saver(cfg.checkpoint_dir, max_to_keep=cfg.keep_full_versions)
        if self._size > 1:
            with tf.name_scope("mxrec_streaming/ranks"):
                self._scalars_in = tf.compat.v1.placeholder(tf.float64,
                                                            [_SCALARS + self._size])
                self._scalars_out = communication.allreduce(self._scalars_in, "sum")
                self._gather_in = tf.compat.v1.placeholder(tf.float64, [2, GATHER_CHUNK])
                self._gather_out = communication.allreduce(self._gather_in, "sum")
        feeds = [f for f in (self._train_feed, self._eval_feed) if f is not None]
        self._init_op = tf.group(tf.compat.v1.global_variables_initializer(),
                                 *[f.initializer for f in feeds])
        self._close_feeds = tf.group(*[f.close_op for f in feeds])
        tf.compat.v1.get_default_graph().finalize()

    def _build_scoring(self) -> None:
        """The progressive-validation branch (validation "partition"): built first, since
        lookups stamp IDs with the newest add_timestamp and scoring must not read the
        training pipeline."""
        cfg = self.config
        # One pipeline each for the whole run (feed.PartitionFeed): no per-partition
        # iterator set-up. The training batches carry the data time of eviction.
        self._train_feed = PartitionFeed(cfg.schema, cfg.batch_size, self._rank, self._size,
                                         stamp_time=not cfg.schema.has_time, name="train_feed")
        self._eval_feed = self._eval_fetch = None
        if cfg.validation != "partition":
            return
        self._eval_feed = PartitionFeed(cfg.schema, cfg.batch_size, self._rank, self._size,
                                        name="eval_feed")
        eval_batch = self._eval_feed.get_next()
        eval_logits = self.model_fn({k: eval_batch[k] for k in ("sparse", "dense")
                                     if k in eval_batch}, False)
        self._eval_fetch = {k: eval_batch[k] for k in _REPORT}
        self._eval_fetch.update(logits=eval_logits, label=eval_batch["label"])

    def _build_training(self) -> None:
        """The training step: the loss over the global batch, its gradients, the updates."""
        batch = self._train_feed.get_next()
        features = {k: batch[k] for k in ("sparse", "dense") if k in batch}
        add_timestamp(batch["time"])
        logits = self.model_fn(features, True)
        labels = batch["label"]
        losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        if self._size == 1:
            loss = tf.reduce_mean(losses)
        else:  # this rank's share of the global batch's mean loss
            # The rows counted from the labels (as many as the losses): the all-reduce can
            # run as soon as the batch is there, beside the forward pass, not after it.
            rows = communication.allreduce(tf.cast(tf.size(labels), tf.float32), "sum")
            loss = tf.reduce_sum(losses) / tf.maximum(rows, 1.0)
        self._train_fetch = dict({k: batch[k] for k in _REPORT}, train=self._updates(loss))
        self._train_fetch_scored = dict(self._train_fetch, logits=logits, label=labels)

    def _updates(self, loss: tf.Tensor) -> tf.Operation:
        """Adam on the dense variables (gradients summed over the ranks), Adagrad on the
        tables (and on the plain-TensorFlow baseline's bucket variables)."""
        cfg = self.config
        dense_vars, sparse_vars = get_dense_and_sparse_variable()
        buckets = tf.compat.v1.get_collection(BUCKET_VARIABLES)
        if buckets and self._size > 1:
            raise ValueError("streaming trainer: the plain-TensorFlow baseline (--buckets) runs "
                             f"in one process only, not on {self._size} ranks; drop --buckets "
                             "(mxrec's tables shard over the ranks)")
        bucket_refs = {v.ref() for v in buckets}
        dense_vars = [v for v in dense_vars if v.ref() not in bucket_refs]
        grads = tf.gradients(loss, dense_vars + sparse_vars + buckets)
        dense_grads = grads[:len(dense_vars)]
        sparse_grads = grads[len(dense_vars):len(dense_vars) + len(sparse_vars)]
        if self._size > 1:
            dense_grads = _summed_over_ranks(dense_grads)
        updates = [tf.compat.v1.train.AdamOptimizer(cfg.dense_learning_rate).apply_gradients(
            zip(dense_grads, dense_vars))]
        if sparse_vars:
            updates.append(create_hash_optimizer(cfg.sparse_learning_rate).apply_gradients(
                zip(sparse_grads, sparse_vars)))
        if buckets:  # the plain-TF baseline's tables: Adagrad as mxrec's (same accumulator)
            updates.append(tf.compat.v1.train.AdagradOptimizer(
                cfg.sparse_learning_rate, initial_accumulator_value=0.9).apply_gradients(
                zip(grads[len(dense_vars) + len(sparse_vars):], buckets)))
        return tf.group(*updates)

    # --------------------------------------------------------------- resuming

    def _clean_after(self, step: int) -> None:
        """Removes what a crash left after `step` (the donefile's last): the checkpoint
        version of the partition that was in progress and the serving version this model
        wrote for it, and this model's unfinished staging folders. `_check_model_dir` made
        sure that nothing later exists; serving versions of another writer stay."""
        cfg = self.config
        if tf.io.gfile.isdir(cfg.checkpoint_dir):
            for kind, saved in checkpoint_versions(cfg.checkpoint_dir):
                if saved > step:
                    logging.warning("streaming: removing checkpoint %s-%d, written after the "
                                    "donefile's last step %d (a partition in progress when "
                                    "the trainer stopped)", kind, saved, step)
                    tf.io.gfile.rmtree(posixpath.join(cfg.checkpoint_dir,
                                                      checkpoint_manifest.version_name(
                                                          kind, saved)))
        if cfg.export_base and tf.io.gfile.isdir(cfg.export_base):
            mine = self._identity["model_id"]
            for version in serving_versions.list_versions(cfg.export_base):
                if version > step and ownership.version_owner(cfg.export_base,
                                                              version) == mine:
                    logging.warning("streaming: removing serving version %d, delivered after "
                                    "the donefile's last step %d and never recorded",
                                    version, step)
                    tf.io.gfile.rmtree(posixpath.join(cfg.export_base, str(version)))
            # Staging folders: only this model writes into its base, and the model dir's
            # lock says no other trainer of it is running.
            for entry in tf.io.gfile.listdir(cfg.export_base):
                if entry.startswith(".tmp-"):
                    tf.io.gfile.rmtree(posixpath.join(cfg.export_base, entry.rstrip("/")))

    def _check_model_dir(self) -> List[Dict]:
        """Rank 0, before anything is built: locks the model dir, reads the donefile, checks
        that it agrees with the checkpoints and the export base (or refuses, changing
        nothing), claims the export base; returns the donefile's entries."""
        cfg = self.config
        self._lock = ownership.ModelDirLock(cfg.workdir)
        try:
            entries = donefile.read(cfg.donefile)
        except ValueError as error:
            raise ownership.OwnershipError(
                f"{error}; nothing was changed: restore {cfg.donefile} from a backup") from error
        saved = sorted({s for _, s in checkpoint_versions(cfg.checkpoint_dir)}) \
            if tf.io.gfile.isdir(cfg.checkpoint_dir) else []
        exists = tf.io.gfile.exists(cfg.donefile)
        if not exists and saved:
            raise ownership.OwnershipError(
                f"{cfg.donefile} is missing, but {cfg.checkpoint_dir} holds checkpoint "
                f"versions up to step {saved[-1]}: nothing was deleted. Restore the donefile "
                "from a backup to resume; to train this model anew, move the model dir aside "
                "(and give the new run an empty one)")
        last = entries[-1]["step"] if entries else 0
        if last and last not in saved:
            raise ownership.OwnershipError(
                f"{cfg.donefile} ends at step {last} (partition {entries[-1]['partition']}), "
                f"but {cfg.checkpoint_dir} has no checkpoint of that step (it has "
                f"{saved[-5:] or 'none'}): nothing was deleted. Restore the checkpoint folder, "
                "or a donefile that matches it")
        # A crash leaves at most the partition in progress: step last + 1.
        later = [s for s in saved if s > last + 1]
        if later:
            raise ownership.OwnershipError(
                f"{cfg.donefile} ends at step {last}, but {cfg.checkpoint_dir} holds later "
                f"checkpoints {later[:5]}: the donefile is older than the checkpoints (restored "
                "from an old backup?). Nothing was deleted. Restore the donefile that goes with "
                "the checkpoints, or move the newer checkpoints aside")
        self._identity = ownership.model_identity(cfg.workdir)
        if not exists:  # the donefile exists from the model's first start on
            donefile.create(cfg.donefile)
        if cfg.export_base:
            ownership.claim_export_base(
                cfg.export_base, self._identity, cfg.workdir,
                {e["export_version"] for e in entries if e.get("export_version") is not None})
            mine = self._identity["model_id"]
            later = [v for v in serving_versions.list_versions(cfg.export_base)
                     if v > last + 1 and ownership.version_owner(cfg.export_base, v) == mine]
            if later:
                raise ownership.OwnershipError(
                    f"{cfg.donefile} ends at step {last}, but this model delivered later "
                    f"serving versions {later[:5]} to {cfg.export_base}: the donefile is older "
                    "than the export base. Nothing was deleted. Restore the donefile that goes "
                    "with them")
        return entries

    def _resume(self, sess) -> Optional[Dict]:
        """Reads the donefile, cleans what a crash left, restores the last good checkpoint;
        returns the donefile's last entry (None: a new model)."""
        cfg = self.config
        self.entries = donefile.read(cfg.donefile)
        last = self.entries[-1] if self.entries else None
        good = _last_trained(self.entries)
        step = good["step"] if good else 0
        if self._size > 1:  # every rank must resume from the same line
            agreed, _ = self._sum_over_ranks(
                sess, [step, len(self.entries)] if self._rank == 0 else [0, 0])
            if (int(agreed[0]), int(agreed[1])) != (step, len(self.entries)):
                raise RuntimeError(
                    f"streaming trainer: rank {self._rank} reads {len(self.entries)} lines of "
                    f"{cfg.donefile} (step {step}), rank 0 {int(agreed[1])} (step "
                    f"{int(agreed[0])}): every rank must see the same --model_dir (a shared "
                    "filesystem)")
        if self._rank == 0:
            self._clean_after(step)
        self._barrier(sess)  # no rank reads a version before rank 0 has cleaned up
        saved = {s for _, s in checkpoint_versions(cfg.checkpoint_dir)} \
            if tf.io.gfile.isdir(cfg.checkpoint_dir) else set()
        if step == 0 and cfg.on_nonfinite == "skip" and 0 not in saved:
            # The state a skip of the first partitions goes back to.
            self._saver.save(sess, 0, kind="full")
            saved.add(0)
        if step > 0 or (last is not None and 0 in saved):
            restored = self._saver.restore(sess, version=step)
            logging.info("streaming: resumed at step %d after partition %s", restored,
                         last["partition"])
        if cfg.export_base and good and good.get("export_version") is not None \
                and self._rank == 0:
            # Checked now so the log says at once; the next export checks again.
            if self._good_base(good["export_version"]) is None:
                logging.warning("streaming: the next partition's serving version will be "
                                "full (the last one, %d, cannot be built on)",
                                good["export_version"])
        return last

    # --------------------------------------------------------------- one pass

    def _run_pass(self, sess, feed, step, files, partition, counter, collect, counted):
        """One pass over the partition's files: (lines, labels, logits, (steps, lines
        counted)); `counted` None: the feed counts the files' lines while its pipeline reads
        the first batches."""
        steps, expected = feed.start(sess, files, partition.timestamp, counted)
        labels, logits = [], []
        lines = 0
        for _ in range(steps):
            out = step()
            lines += int(out["lines"])
            if counter is not None:
                counter.add(out["bad_file"], out["bad_line"], out["bad_column"])
            if collect:
                labels.append(out["label"])
                logits.append(out["logits"])
        if lines != expected:
            raise RuntimeError(
                f"streaming trainer: partition {partition.name}'s files held {expected} lines "
                f"(for this rank) when counted and {lines} when read: a ready partition's "
                "files must not change")
        if collect and labels:
            return lines, np.concatenate(labels), np.concatenate(logits), (steps, expected)
        return lines, np.zeros([0]), np.zeros([0]), (steps, expected)

    def _table_rows(self) -> Dict[str, int]:
        return {name: int(t.stats().get("rows_in_use", 0))
                for name, t in sorted(self._runtime.tables.items())}

    def _new_day_maintenance(self) -> int:
        cfg = self.config
        removed = 0
        for t in self._runtime.tables.values():
            if cfg.evict_daily and t.eviction_threshold is not None:
                removed += t.evict(t.eviction_threshold)
            if cfg.shrink_days is not None:
                removed += t.shrink(cfg.shrink_days)
        return removed

    # ------------------------------------------------------------------ ranks

    def _sum_over_ranks(self, sess, values: List[float], mine: float = 0.0):
        """(the sums over the ranks of `values`, every rank's `mine` by rank): one
        all-reduce; NumPy in one process."""
        if len(values) > _SCALARS:
            raise ValueError(f"streaming trainer: {len(values)} counts to add over the ranks, "
                             f"more than {_SCALARS} (one per table and a few): too many tables")
        vector = np.zeros([_SCALARS + self._size], np.float64)
        vector[:len(values)] = values
        vector[_SCALARS + self._rank] = mine
        if self._size > 1:
            vector = sess.run(self._scalars_out, {self._scalars_in: vector})
        return vector[:len(values)], vector[_SCALARS:]

    def _gather(self, sess, labels: np.ndarray, logits: np.ndarray):
        """Every rank's labels and logits, rank 0's first (on every rank)."""
        if self._size == 1:
            return labels, logits
        _, counts = self._sum_over_ranks(sess, [], float(len(labels)))
        counts = counts.astype(np.int64)
        total, offset = int(counts.sum()), int(counts[:self._rank].sum())
        mine = np.stack([np.asarray(labels, np.float64).reshape(-1),
                         np.asarray(logits, np.float64).reshape(-1)])
        out = np.empty([2, total], np.float64)
        for start in range(0, total, GATHER_CHUNK):
            chunk = np.zeros([2, GATHER_CHUNK], np.float64)
            low, high = max(start, offset), min(start + GATHER_CHUNK, offset + len(labels))
            if low < high:
                chunk[:, low - start:high - start] = mine[:, low - offset:high - offset]
            got = sess.run(self._gather_out, {self._gather_in: chunk})
            end = min(start + GATHER_CHUNK, total)
            out[:, start:end] = got[:, :end - start]
        return out[0], out[1]

    def _check_shared_folders(self, sess) -> None:
        """Several ranks, once a run, before any rank reads the donefile: every rank sees
        the model dir, the export base and the data root that rank 0 sees
        (mxrec.util.shared_dirs; a data root rank 0 cannot write into stays unchecked, and
        `_next` still finds a rank that does not see rank 0's next partition)."""
        cfg = self.config
        folders = [("the model dir (--model-dir)", cfg.workdir)]
        if cfg.export_base:
            folders.append(("the export base (--export-base)", cfg.export_base))
        folders.append(("the data root (--data)", cfg.data))
        shared_dirs.check(folders, self._rank, self._size,
                          functools.partial(self._sum_over_ranks, sess),
                          may_be_read_only=[cfg.data])
        self._folders_checked = True

    def _barrier(self, sess) -> None:
        """Returns once every rank has called it (nothing in one process)."""
        if self._size > 1:
            _, arrived = self._sum_over_ranks(sess, [], 1.0)
            if arrived.sum() != self._size:
                raise RuntimeError(f"streaming trainer: the barrier counted {arrived.sum()} of "
                                   f"{self._size} ranks")

    # ----------------------------------------------------------------- export

    def _good_base(self, version: Optional[int]) -> Optional[str]:
        """The folder of serving version `version` if a delta can build on it: present,
        verified against its manifest (a damaged one is logged and skipped) and, for a
        SavedModel delta, holding a SavedModel."""
        cfg = self.config
        if version is None:
            return None
        folder = posixpath.join(cfg.export_base, str(version))
        if not tf.io.gfile.exists(folder):
            logging.warning("streaming: serving version %d is gone; delivering a full "
                            "version", version)
            return None
        if ownership.version_owner(cfg.export_base, version) not in (
                None, self._identity["model_id"]):
            logging.error("streaming: serving version %d was written by another model; "
                          "delivering a full version instead of a delta on it", version)
            return None
        try:
            manifest = serving_versions.verify(folder)
        except serving_versions.DamagedVersionError as error:
            logging.error("streaming: serving version %d is damaged (%s); delivering a full "
                          "version instead of a delta on it", version, error)
            return None
        if manifest.get("quantize") != cfg.serving_quantize:
            logging.warning("streaming: serving version %d holds %s rows, this run delivers "
                            "%s (serving_quantize); delivering a full version", version,
                            manifest.get("quantize") or "float32",
                            cfg.serving_quantize or "float32")
            return None
        if cfg.delta_export == "savedmodel" and not tf.io.gfile.exists(
                posixpath.join(folder, "saved_model.pb")):
            logging.warning("streaming: serving version %d has no SavedModel to apply a delta "
                            "to; delivering a full version", version)
            return None
        return folder

    def _export(self, step: int, kind: str, previous_version: Optional[int]) -> int:
        """Writes serving version `step`: a delta on the previous version when it is good
        (verified), otherwise a full SavedModel from the checkpoint version just saved."""
        cfg = self.config
        tf.io.gfile.makedirs(cfg.export_base)
        staging = serving_versions.staging_dir(cfg.export_base, step)
        previous_dir = self._good_base(previous_version) if kind == "delta" else None
        if previous_dir is not None:
            _, arrays = checkpoint_manifest.read_version(cfg.checkpoint_dir, "delta", step,
                                                         only=["dense.npz"])
            tables, dense = self._saver.serving_delta(step), arrays["dense.npz"]
            if cfg.delta_export == "savedmodel":
                saved_model.apply_delta(previous_dir, tables, staging, dense=dense)
            else:
                tf.io.gfile.makedirs(staging)
            if cfg.serving_quantize is not None:  # the delta file in the export's form
                tables = quantizer.quantize_delta(tables)
            write_delta(posixpath.join(staging, DELTA_FILE), tables, dense)
            info = {"kind": "delta", "base": previous_version}
        else:
            # From the version just saved (a full save, or a delta folded onto its chain).
            version = posixpath.join(cfg.checkpoint_dir, checkpoint_manifest.version_name(
                kind, step))
            schema = cfg.schema

            def build():
                inputs = _serving_inputs(schema)
                logits = self.model_fn(dict(inputs), False)
                raw = raw_feature_inputs(schema)
                raw_logits = self.model_fn(features_from_raw(raw, schema), False)
                return {DEFAULT_SIGNATURE: (inputs, {"prob": tf.sigmoid(logits),
                                                     "logits": logits}),
                        RAW_SIGNATURE: (raw, {"prob": tf.sigmoid(raw_logits),
                                              "logits": raw_logits})}

            saved_model.export_saved_model(staging, version, build,
                                           quantize=cfg.serving_quantize)
            info = {"kind": "full", "base": None}
        if cfg.serving_quantize is not None:  # a delta builds only on a version of its form
            info["quantize"] = cfg.serving_quantize
        ownership.check_export_owner(cfg.export_base, self._identity)
        info["model_id"] = self._identity["model_id"]
        serving_versions.publish(staging, cfg.export_base, step, info)
        return step

    # ------------------------------------------------------------------ loop

    def _train_partition(self, sess, partition: Partition, step: int, previous: Optional[Dict],
                         writer) -> Dict:
        """One partition: the new day's maintenance, the passes, the checkpoint, the serving
        version, the donefile line; returns the line."""
        cfg = self.config
        start = time.monotonic()
        new_day = previous is None or previous["day"] != partition.day
        evicted = self._new_day_maintenance() if new_day and previous is not None else 0
        counter = BadLineCounter(partition.files, cfg.schema, cfg.max_bad_lines)
        lines, scored, seconds = self._passes(sess, partition, counter)
        counts = self._counts(sess, partition, lines, counter, evicted)
        _fault("after_train", step)
        if cfg.full_every == "day":
            kind = "full" if new_day else "delta"
        else:
            kind = "full" if previous is None or (step - 1) % cfg.full_every == 0 else "delta"
        save_start = time.monotonic()
        try:  # the check: no version of a NaN model is saved, so none is delivered
            self._saver.save(sess, step, kind=kind, check_finite=True)
        except NonFiniteError as error:
            self._non_finite(sess, partition, step, previous, error, dict(
                lines=counts["lines"], bad_lines=counts["bad_lines"],
                bad_line_examples=counter.messages[:5], metrics=scored))
        seconds["save"] = time.monotonic() - save_start
        _fault("after_checkpoint", step)
        # Several ranks: the save returns once every rank's shard is in the version;
        # rank 0 alone delivers and records the partition.
        export_start = time.monotonic()
        if cfg.export_base and self._rank == 0:
            self._export(step, kind, previous.get("export_version") if previous else None)
        seconds["export"] = time.monotonic() - export_start
        _fault("after_export", step)
        entry = dict(counts, partition=partition.name, day=partition.day, step=step,
                     checkpoint=kind, export_version=step if cfg.export_base else None,
                     metrics=scored, rows=counts["lines"] - counts["bad_lines"],
                     bad_line_examples=counter.messages[:5], ranks=self._size,
                     exchange=None if self._size == 1 else (
                         "mpi" if communication.uses_mpi() else "grpc"),
                     train_seconds=round(seconds.pop("train"), 4),
                     # where the rest of the partition's time went (this rank's clock)
                     stage_seconds={k: round(v, 4) for k, v in seconds.items()},
                     seconds=round(time.monotonic() - start, 4), time=time.time())
        self._record(entry, writer)
        return entry

    def _passes(self, sess, partition: Partition, counter: BadLineCounter):
        """The validation pass (if scored by partition) and the training pass: (lines read
        by this rank, the progressive metrics, {"validation", "train": seconds})."""
        cfg = self.config
        scored = None
        # The lines of the files (the passes' steps) are counted by the first pass, after
        # its feed has the files, so the count overlaps the pipeline's first batches; its
        # time is that pass's (the validation pass, with --validation partition).
        counted = None
        validation_start = time.monotonic()
        if cfg.validation == "partition":
            _, labels, logits, counted = self._run_pass(
                sess, self._eval_feed, self._eval_step, partition.files, partition, counter,
                True, None)
            scored = metrics.evaluate(*self._gather(sess, labels, logits))
        train_start = time.monotonic()
        lines, labels, logits, _ = self._run_pass(
            sess, self._train_feed, self._train_step,
            partition.files, partition, None if cfg.validation == "partition" else counter,
            cfg.validation == "batch", counted)
        seconds = {"validation": train_start - validation_start,
                   "train": time.monotonic() - train_start}
        if cfg.validation == "batch":
            scored = metrics.evaluate(*self._gather(sess, labels, logits))
        return lines, scored, seconds

    def _counts(self, sess, partition: Partition, lines: int, counter: BadLineCounter,
                evicted: int) -> Dict:
        """The partition's lines, bad lines, evicted IDs and rows per table (sums over the
        ranks); more bad lines than allowed over the ranks stop the run."""
        cfg = self.config
        table_rows = self._table_rows()
        if self._size == 1:
            return dict(lines=lines, bad_lines=counter.count, evicted=int(evicted),
                        table_rows=table_rows)
        sums, _ = self._sum_over_ranks(sess, [lines, counter.count, evicted]
                                       + list(table_rows.values()))
        lines, bad_lines, evicted = (int(v) for v in sums[:3])
        if bad_lines > cfg.max_bad_lines:
            raise MalformedDataError(
                f"more than {cfg.max_bad_lines} malformed lines in partition "
                f"{partition.name} over the {self._size} ranks ({bad_lines}; set "
                f"--max_bad_lines to allow more); this rank's: {counter.messages[:5]}")
        return dict(lines=lines, bad_lines=bad_lines, evicted=evicted,
                    table_rows=dict(zip(table_rows, (int(v) for v in sums[3:]))))

    def _record(self, entry: Dict, writer) -> None:
        """The donefile line (rank 0; written last: the partition is done), scalars and the
        progress line."""
        if self._rank == 0:
            donefile.append(self.config.donefile, entry)
        _fault("after_donefile", entry["step"])
        if writer is not None:
            self._write_scalars(writer, entry)
        if self.config.progress and self._rank == 0:
            self._print_progress(entry)

    def _non_finite(self, sess, partition: Partition, step: int, previous: Optional[Dict],
                    error: NonFiniteError, counts: Dict) -> None:
        """A partition trained the model into NaN/inf (the Saver refused to save it): stop,
        or record it as skipped and roll back to the last good checkpoint (a _RollBack
        that `run` answers like a restart)."""
        cfg = self.config
        good = previous["step"] if previous else 0
        served = previous.get("export_version") if previous else None
        if cfg.on_nonfinite == "stop":
            raise NonFiniteModelError(
                f"streaming trainer: partition {partition.name} (step {step}) trained the model "
                f"into non-finite values; nothing of it was saved or delivered"
                f"{f' (serving version {served} stays the newest)' if served else ''}. "
                f"{error} Look at the partition's data (a value the parser accepts but the "
                "model cannot take: --dense-limit bounds dense values); to train past it, "
                f"restart with --on-nonfinite skip (back to step {good}, the partition "
                "recorded as skipped)") from error
        logging.error("streaming: partition %s trained the model into non-finite values (%s); "
                      "skipping it and going back to step %d", partition.name, error, good)
        entry = {"partition": partition.name, "day": partition.day, "step": good,
                 "checkpoint": None, "export_version": served,
                 "skipped": f"non-finite model: {error}", "rows": 0, "evicted": 0,
                 "table_rows": previous.get("table_rows", {}) if previous else {},
                 "ranks": self._size, "time": time.time(), **counts}
        if self._rank == 0:
            donefile.append(cfg.donefile, entry)
        self._barrier(sess)  # every rank reads the donefile with the skip when it resumes
        raise _RollBack(entry)

    @staticmethod
    def _write_scalars(writer, entry: Dict) -> None:
        values = [tf.compat.v1.Summary.Value(tag=f"progressive/{k}", simple_value=float(v))
                  for k, v in (entry["metrics"] or {}).items() if v == v]
        values += [tf.compat.v1.Summary.Value(tag=f"table_rows/{k}", simple_value=float(v))
                   for k, v in entry["table_rows"].items()]
        values.append(tf.compat.v1.Summary.Value(
            tag="train/samples_per_second",
            simple_value=entry["rows"] / max(entry["train_seconds"], 1e-9)))
        values.append(tf.compat.v1.Summary.Value(tag="train/bad_lines",
                                                 simple_value=float(entry["bad_lines"])))
        writer.add_summary(tf.compat.v1.Summary(value=values), entry["step"])
        writer.flush()

    @staticmethod
    def _print_progress(entry: Dict) -> None:
        m = entry["metrics"] or {}
        auc, loss = m.get("auc", float("nan")), m.get("logloss", float("nan"))
        print(f"[{entry['step']:>5}] {entry['partition']:<12} {entry['checkpoint']:<5} "
              f"rows {entry['rows']:>8}  auc {auc:.4f}  logloss {loss:.4f}"
              f"  calib {m.get('calibration', float('nan')):.3f}  table rows "
              f"{sum(entry['table_rows'].values()):>8}  bad {entry['bad_lines']}  "
              f"{entry['rows'] / max(entry['train_seconds'], 1e-9):,.0f} samples/s  "
              f"export {entry['export_version']}", flush=True)

    def _pending(self, last: Optional[Dict]) -> List[Partition]:
        ready = of_granularity(list_partitions(self.config.data, self.config.done_marker),
                               self.config.granularity)
        if last is None:
            return ready
        done_key = _name_key(last["partition"])
        late = [p.name for p in ready if p.sort_key <= done_key and
                p.name not in {e["partition"] for e in self.entries}]
        if late:
            logging.warning("streaming: partitions %s became ready after later ones were "
                            "trained; they are not trained", late)
        return [p for p in ready if p.sort_key > done_key]

    def _next(self, sess, last: Optional[Dict]):
        """(the partition to train next or None, whether to stop): rank 0's choice, which
        every rank follows (one all-reduce)."""
        cfg = self.config
        code = 0  # 0: wait, -1: stop, else the partition's key
        if self._rank == 0:
            pending = self._pending(last)
            if pending:
                code = int(pending[0].day) * 100 + (0 if pending[0].hour is None
                                                    else pending[0].hour + 1)
            elif not cfg.watch or (cfg.deadline is not None and time.time() >= cfg.deadline):
                code = -1
            if self._size == 1:
                return (pending[0] if pending else None), code == -1
        agreed, _ = self._sum_over_ranks(sess, [code if self._rank == 0 else 0])
        code = int(agreed[0])
        if code <= 0:
            return None, code == -1
        day, hour = divmod(code, 100)
        name = f"{day:08d}" if hour == 0 else f"{day:08d}/{hour - 1:02d}"
        if self._rank == 0:
            return pending[0], False
        partition = partition_at(cfg.data, name, cfg.done_marker)
        if partition is None:
            raise RuntimeError(f"streaming trainer: rank 0 trains partition {name} next, but "
                               f"rank {self._rank} does not see it ready under {cfg.data} "
                               "(every rank must see the same data root)")
        return partition, False

    def run(self) -> List[Dict]:
        """Trains every pending partition (and, in watch mode, those that arrive); returns
        the donefile entries of this run."""
        done_now: List[Dict] = []
        owns_runtime = False
        if not initialize.is_initialized():
            initialize.init()
            owns_runtime = True
        self._rank, self._size = communication.get_rank_id(), communication.get_rank_size()
        self._lock, self._identity = None, None
        self._folders_checked = False
        try:
            if self._rank == 0:
                self._check_model_dir()
            while True:
                try:
                    self._run_graph(done_now)
                    return done_now
                except _RollBack as rolled:
                    # A partition was skipped: a new graph and session, resumed from the
                    # donefile as a restart would (the tables' host state is replaced by the
                    # restore, the variables start afresh).
                    done_now.append(rolled.entry)
                    self.entries.append(rolled.entry)
        finally:
            if self._lock is not None:
                self._lock.release()
            if owns_runtime:
                initialize.terminate_config_initializer()

    def _run_graph(self, done_now: List[Dict]) -> None:
        """Builds the graph, resumes, and trains partitions until the run is over (or a
        _RollBack)."""
        cfg = self.config
        graph = tf.Graph()
        session_config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=cfg.threads, inter_op_parallelism_threads=cfg.threads)
        with graph.as_default():
            self._build()
            with tf.compat.v1.Session(graph=graph, **communication.session_kwargs(
                    session_config)) as sess:
                sess.run(self._init_op)
                # The passes' steps and the feeds' enqueues, prepared now: the first
                # partition's training time holds no graph set-up (about 0.15 s, 0.2 s on
                # ranks).
                self._train_step = prepared_step(
                    sess, self._train_fetch_scored if cfg.validation == "batch"
                    else self._train_fetch)
                self._eval_step = (None if self._eval_fetch is None
                                   else prepared_step(sess, self._eval_fetch))
                for feed in (self._train_feed, self._eval_feed):
                    if feed is not None:
                        feed.prepare(sess)
                if not self._folders_checked:
                    self._check_shared_folders(sess)
                last = self._resume(sess)
                writer = (tf.compat.v1.summary.FileWriter(
                    posixpath.join(cfg.workdir, "tensorboard"))
                    if cfg.tensorboard and self._rank == 0 else None)
                try:
                    self._loop(sess, last, writer, done_now)
                finally:
                    if writer is not None:
                        writer.close()
                    # The pipelines wait on their queues for the next partition.
                    sess.run(self._close_feeds)

    def _loop(self, sess, last: Optional[Dict], writer, done_now: List[Dict]) -> None:
        cfg = self.config
        good = _last_trained(self.entries)
        while cfg.max_partitions is None or len(done_now) < cfg.max_partitions:
            partition, stop = self._next(sess, last)
            if partition is not None:
                step = (good["step"] if good else 0) + 1
                last = good = self._train_partition(sess, partition, step, good, writer)
                self.entries.append(last)
                done_now.append(last)
                continue
            if stop:
                return
            wait = cfg.poll_interval
            if cfg.deadline is not None:
                wait = max(0.0, min(wait, cfg.deadline - time.time()))
            time.sleep(wait)


class NonFiniteModelError(RuntimeError):
    """A partition trained the model into NaN or infinite values; nothing of it was saved
    or delivered (StreamConfig.on_nonfinite="stop")."""


class _RollBack(Exception):
    """A partition was recorded as skipped; the trainer resumes from the last good
    checkpoint."""

    def __init__(self, entry: Dict):
        super().__init__(entry["partition"])
        self.entry = entry


def _last_trained(entries: List[Dict]) -> Optional[Dict]:
    """The newest donefile entry of a trained partition (not a skipped one), or None."""
    return next((e for e in reversed(entries) if not e.get("skipped")), None)


_NAME_RE = re.compile(r"^(\d{8})(?:/(\d{2}))?$")


def _name_key(name: str):
    match = _NAME_RE.match(name)
    if not match:
        raise ValueError(f"donefile names partition {name!r}, not yyyyMMdd[/hh]")
    return (match.group(1), -1 if match.group(2) is None else int(match.group(2)))


def summary(entries: List[Dict]) -> str:
    """A one-line JSON summary of a run's entries: partitions (trained and skipped), rows,
    bad lines, mean progressive AUC."""
    aucs = [e["metrics"]["auc"] for e in entries if e.get("metrics")
            and e["metrics"]["auc"] == e["metrics"]["auc"]]
    return json.dumps({"partitions": len(entries), "rows": sum(e["rows"] for e in entries),
                       "bad_lines": sum(e.get("bad_lines", 0) for e in entries),
                       "skipped": [e["partition"] for e in entries if e.get("skipped")],
                       "mean_progressive_auc": float(np.mean(aucs)) if aucs else None})


def prepared_step(sess, fetch: Dict):
    """A function running `fetch` (a dict of tensors and ops) with no arguments, returning
    a dict of its tensors' values, whose executors the session builds now (graph rewrites,
    partitioning, kernels) rather than at its first call: Session.make_callable defers
    them. Where the session lacks the callable API, a plain Session.run."""
    others = sorted(k for k, v in fetch.items()
                    if not isinstance(v, (tf.Tensor, tf.Operation)))
    if others:
        raise TypeError(f"streaming trainer: a step fetches tensors and operations only, not "
                        f"{others}")
    tensors = {k: v for k, v in fetch.items() if isinstance(v, tf.Tensor)}
    targets = [v for v in fetch.values() if isinstance(v, tf.Operation)]
    make = getattr(sess, "_make_callable_from_options", None)
    if make is None:  # the same dict: the tensors' values, the ops run
        return lambda: sess.run((tensors, targets))[0]
    call = make(config_pb2.CallableOptions(fetch=[t.name for t in tensors.values()],
                                           target=[op.name for op in targets]))
    names = list(tensors)
    return lambda: dict(zip(names, call()))


def _summed_over_ranks(grads: List) -> List:
    """The dense gradients summed over the ranks: one all-reduce of them all, flattened."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return grads
    values = [tf.convert_to_tensor(grads[i]) for i in present]
    flat = communication.allreduce(tf.concat([tf.reshape(v, [-1]) for v in values], 0), "sum")
    pieces = tf.split(flat, [v.shape.num_elements() for v in values])
    out = list(grads)
    for i, value, piece in zip(present, values, pieces):
        out[i] = tf.reshape(piece, value.shape)
    return out


__all__ = ["StreamConfig", "StreamingTrainer", "NonFiniteModelError", "FAULT_ENV",
           "VALIDATION_MODES", "NONFINITE_ACTIONS", "summary",
           "prepared_step",
           "DEFAULT_SIGNATURE", "RAW_SIGNATURE"]


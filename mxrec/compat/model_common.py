"""mx_rec's `mx_rec.util.model_common`: the helpers RecSDK's later model examples share.

RecSDK's later releases moved what each example's main_mxrec.py defined for itself (its
Config, learning-rate schedule, Criteo input pipeline, evaluation, FeatureSpecs) into one
module that ships inside mx_rec; a script sets `MODEL_NAME`, `logger`, `train_steps` and
`eval_steps` on the module and calls these. This is mxrec's own version for CPUs and GPUs,
answering the same path (`mxrec.compat.MODULES`):

- `Config`, `LearningRateScheduler`, `CacheModeEnum`, `SSD_DATA_PATH`: as RecSDK's, with the
  rank and rank count from mxrec's ranks (`init()` first, as the examples do).
- `make_batch_and_iterator`: the Criteo TFRecords, shuffled before `Dataset.shard` with
  the same seed on every rank, so that N ranks train on the global batches one process
  trains on (RecSDK shuffles each rank's shard; one process reads the same either way);
  the files in sorted order (glob's is the file system's).
- `evaluate`, `evaluate_fix`: the AUC and mean log loss over the evaluation data.
- `sess_config`: a CPU/GPU session config; RecSDK's configures the NPU's graph compiler.

Refused, naming why (Ascend NPU only): `get_npu_run_config` (mxrec.compat.REFUSED_NAMES: its
import raises), `sess_config(dump_data=True)`,
`USE_SHM_SWAP=1`, `HUGE_TLB_ENABLE=1`. `USE_DP` is read as RecSDK's (scripts pass it to
`create_table(is_dp=...)`). Not available: a `MODEL_NAME` other than DLRM or DCNv2 (their
inputs differ; the functions that depend on it say so).

Example:
    >>> import mxrec.util.model_common as cm
    >>> cm.MODEL_NAME = "DLRM"
    >>> cfg = cm.Config()  # after init(); CACHE_MODE, TRAIN_RANK_SIZE from the environment
    >>> specs = cm.create_feature_spec_list(cfg)
    >>> batch, iterator = cm.make_batch_and_iterator(cfg, specs, is_training=True,
    ...                                              dump_graph=False)
    >>> batch["sparse_feature"].shape  # each rank's batch: cfg.batch_size samples of 26 IDs
    TensorShape([8192, 26])
"""

import os
import random
import time
from enum import Enum
from glob import glob

import numpy as np
import tensorflow.compat.v1 as tf

from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func
from mxrec.distributed import hccl_ops
from mxrec.streaming.metrics import roc_auc
from mxrec.util.config import ConfigInitializer
from mxrec.util.log import logger as _mxrec_logger
from mxrec.util.ops import import_host_pipeline_ops

NPU_ONLY = "Ascend NPU only"

MODEL_NAME = None
SSD_DATA_PATH = ["ssd_data"]
SHUFFLE_SEED = 128
# As RecSDK's module does on import: a script drawing from `random` afterwards gets its draws.
random.seed(SHUFFLE_SEED)
logger = _mxrec_logger  # a script sets its own (RecSDK's starts as None)

train_steps = 0
eval_steps = 0
max_train_steps = 0

rank_id = int(os.getenv("RANK_ID")) if os.getenv("RANK_ID") else None
rank_size = int(os.getenv("TRAIN_RANK_SIZE")) if os.getenv("TRAIN_RANK_SIZE") else None
interval = int(os.getenv("INTERVAL")) if os.getenv("INTERVAL") else None

_SWITCHES = ("USE_DYNAMIC_EXPANSION", "USE_MULTI_LOOKUP", "USE_MODIFY_GRAPH", "USE_DP",
             "USE_FAAE", "USE_SHM_SWAP", "HUGE_TLB_ENABLE")


def _switch(name: str) -> bool:
    value = os.getenv(name, "0")
    if value not in ("0", "1"):
        raise ValueError(f"mxrec.util.model_common: {name}={value!r}; only 0 or 1 is supported "
                         f"(the switches: {', '.join(_SWITCHES)})")
    return value == "1"


use_dynamic_expansion = _switch("USE_DYNAMIC_EXPANSION")
use_multi_lookup = _switch("USE_MULTI_LOOKUP")
MODIFY_GRAPH_FLAG = _switch("USE_MODIFY_GRAPH")
USE_DP = _switch("USE_DP")
use_faae = _switch("USE_FAAE")
use_shm_swap = _switch("USE_SHM_SWAP")
huge_tle_enable = _switch("HUGE_TLB_ENABLE")

_REFUSED_SWITCHES = {
    "USE_SHM_SWAP": (use_shm_swap, f"{NPU_ONLY}: the host-device swap through a PCIe "
                     "shared-memory queue (init(use_shm_swap=True)); mxrec's host tier swaps "
                     "in the step's own ops"),
    "HUGE_TLB_ENABLE": (huge_tle_enable, f"{NPU_ONLY}: huge pages for the host-device "
                        "transfer buffers of mx_rec's host pipeline"),
}
for _name, (_on, _why) in _REFUSED_SWITCHES.items():
    if _on:
        raise ValueError(f"mxrec.util.model_common: {_name}=1 is not supported on mxrec: {_why}")

# The Criteo layout of the models whose input this module reads: (sparse, dense) per sample.
_LAYOUTS = {"DLRM": (26, 13), "DCNv2": (26, 13)}


def _layout():
    if MODEL_NAME not in _LAYOUTS:
        raise ValueError(
            f"mxrec.util.model_common: MODEL_NAME={MODEL_NAME!r}; mxrec's model_common reads "
            f"the input of {sorted(_LAYOUTS)} (26 sparse IDs and 13 dense features per "
            "sample); RecSDK's WideDeep, DCNv2_multihot and MMOE layouts are not available")
    return _LAYOUTS[MODEL_NAME]


class CacheModeEnum(Enum):
    HBM = "HBM"
    DDR = "DDR"
    SSD = "SSD"


class LearningRateScheduler:
    """RecSDK's schedule: linear warm-up, constant, then polynomial (power 2) decay.

    `calc(global_step)` gives (dense, sparse) learning-rate tensors; for MODEL_NAME "DLRM"
    and "DCNv2" the sparse one is clipped to [0, 10], as RecSDK's.
    """

    def __init__(self, base_lr_dense, base_lr_sparse, warmup_steps, decay_start_step,
                 decay_steps):
        self.warmup_steps = tf.constant(warmup_steps, dtype=tf.int32)
        self.decay_start_step = tf.constant(decay_start_step, dtype=tf.int32)
        self.decay_steps = tf.constant(decay_steps)
        self.decay_end_step = decay_start_step + decay_steps
        self.poly_power = 2.0
        self.base_lr_dense = base_lr_dense
        self.base_lr_sparse = base_lr_sparse

    def _factor(self, global_step):
        warmup = 1 - tf.cast(self.warmup_steps - global_step, tf.float32) * tf.cast(
            1 / self.warmup_steps, tf.float32)
        decay = tf.cast(tf.math.pow((self.decay_end_step - global_step) / self.decay_steps,
                                    self.poly_power), tf.float32)
        after_decay = tf.cast(1 / self.decay_steps, tf.float32)
        decay = tf.cond(global_step < self.decay_end_step, lambda: decay, lambda: after_decay)
        poly = tf.cond(global_step < self.decay_start_step, lambda: tf.constant(1.0),
                       lambda: decay)
        return tf.cond(global_step < self.warmup_steps, lambda: warmup, lambda: poly)

    def calc(self, global_step):
        factor = self._factor(global_step)
        lr_sparse = self.base_lr_sparse * factor
        lr_dense = self.base_lr_dense * factor
        if MODEL_NAME in ("DLRM", "DCNv2"):
            lr_sparse = tf.math.minimum(tf.math.maximum(lr_sparse, 0.0), 10.0)
        return lr_dense, lr_sparse


class Config:
    """The example's settings; CACHE_MODE, TRAIN_RANK_SIZE and DLRM_CRITEO_DATA_PATH from the
    environment, as RecSDK's. Build it after `init()`: the rank is mxrec's."""

    def __init__(self):
        tmp = os.getenv("TRAIN_RANK_SIZE")
        if tmp is None:
            raise ValueError("please export TRAIN_RANK_SIZE")
        self.rank_size = int(tmp)
        if self.rank_size != hccl_ops.get_rank_size():
            raise ValueError(f"Config: TRAIN_RANK_SIZE={self.rank_size}, but "
                             f"{hccl_ops.get_rank_size()} ranks run (start N ranks with "
                             "`python -m mxrec.launch -n N`)")
        self.rank_id = hccl_ops.get_rank_id()
        self.data_path = os.getenv("DLRM_CRITEO_DATA_PATH")
        self.train_file_pattern = "train"
        self.test_file_pattern = "test"
        self.batch_size = 8192
        self.line_per_sample = 1024
        self.train_epoch = 3
        self.test_epoch = 1
        self.perform_shuffle = False
        self.key_type = tf.int64
        self.label_type = tf.float32
        self.value_type = tf.int64
        self.feat_cnt = 26
        self._set_emb_table_size()
        self.field_num = 26
        self.send_count = 46000 // self.rank_size
        self.emb_dim = 128
        self.hashtable_threshold = 1
        self.USE_PIPELINE_TEST = False
        if MODEL_NAME == "DLRM":
            self.use_lazy_adam_optimizer = False
            self.use_fusion_optim = False
        global_batch_size = 8192 * 8
        schedule = [int(steps * 55296 / global_batch_size) for steps in (2750, 49315, 27772)]
        self.global_step = tf.Variable(0, trainable=False)
        self.learning_rate = LearningRateScheduler(28.443, 33.71193, *schedule).calc(
            self.global_step)

    def _set_emb_table_size(self):
        self.cache_mode = os.getenv("CACHE_MODE")
        if self.cache_mode is None:
            raise ValueError("please export CACHE_MODE environment variable, "
                             "support:[HBM, DDR, SSD]")
        if self.cache_mode == CacheModeEnum.HBM.value:
            self.dev_vocab_size = 24_000_000 * self.rank_size
            self.host_vocab_size = 0
        elif self.cache_mode == CacheModeEnum.DDR.value:
            self.dev_vocab_size = 500_000 * self.rank_size
            self.host_vocab_size = 24_000_000 * self.rank_size
        elif self.cache_mode == CacheModeEnum.SSD.value:
            self.dev_vocab_size = 100_000 * self.rank_size
            self.host_vocab_size = 2_000_000 * self.rank_size
            self.ssd_vocab_size = 24_000_000 * self.rank_size
        else:
            raise ValueError(f"get CACHE_MODE:{self.cache_mode}, expect in [HBM, DDR, SSD]")

    def get_emb_table_cfg(self) -> dict:
        """create_table's vocabulary arguments for the cache mode."""
        table = {"device_vocabulary_size": self.dev_vocab_size}
        if self.cache_mode in (CacheModeEnum.DDR.value, CacheModeEnum.SSD.value):
            table["host_vocabulary_size"] = self.host_vocab_size
        if self.cache_mode == CacheModeEnum.SSD.value:
            table.update(ssd_vocabulary_size=self.ssd_vocab_size, ssd_data_path=SSD_DATA_PATH)
        return table


def sess_config(dump_data=False, dump_path="./dump_output", dump_steps="0|1|2"):
    """A session config for CPUs and GPUs (RecSDK's configures the NPU's graph compiler).

    One inter-op thread (MXREC_INTER_OP_THREADS, default 1): the examples read TF1 ref
    variables in the same run that updates them, and one thread runs a step's ops in a fixed
    order, so one process's runs repeat exactly.

    Raises:
        ValueError: dump_data=True (the NPU's dump of every op's data, with dump_path and
            dump_steps).
    """
    if dump_data:
        raise ValueError(f"sess_config(dump_data=True) is not available on mxrec: {NPU_ONLY} "
                         f"(the NPU compiler's op data dump to {dump_path!r}, steps "
                         f"{dump_steps!r}); TensorFlow's tf.debugging.experimental."
                         "enable_dump_debug_info dumps a CPU/GPU graph")
    config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=False,
                            inter_op_parallelism_threads=int(
                                os.getenv("MXREC_INTER_OP_THREADS", "1")))
    config.gpu_options.allow_growth = True
    return config


def add_timestamp_func(batch):
    """Adds the batch's "timestamp" (now, in seconds), for admission and eviction."""
    batch["timestamp"] = import_host_pipeline_ops().return_timestamp(
        tf.cast(batch["label"], dtype=tf.int64))
    return batch


def get_extract_fn(config):
    """Parses one TFRecord of `config.line_per_sample` samples."""
    sparse, dense = _layout()
    rows = config.line_per_sample

    def extract_fn(data_record):
        features = {
            "label": tf.FixedLenFeature(shape=(rows,), dtype=tf.int64),
            "sparse_feature": tf.FixedLenFeature(shape=(sparse * rows,), dtype=tf.int64),
            "dense_feature": tf.FixedLenFeature(shape=(dense * rows,), dtype=tf.float32),
        }
        return tf.parse_single_example(data_record, features)

    return extract_fn


def reshape_fn(batch):
    """A batch of records as [samples, features]; the dense features as log(x + 3)."""
    sparse, dense = _layout()
    batch["label"] = tf.reshape(batch["label"], [-1, 1])
    batch["dense_feature"] = tf.math.log(tf.reshape(batch["dense_feature"], [-1, dense]) + 3.0)
    batch["sparse_feature"] = tf.reshape(batch["sparse_feature"], [-1, sparse])
    return batch


def make_batch_and_iterator(config, feature_spec_list, is_training, dump_graph,
                            is_use_faae=False):
    """(batch, initializable iterator) of the training or evaluation records.

    Every rank shuffles all training records in the same order (SHUFFLE_SEED) and keeps its
    share (`Dataset.shard`), so step k of N ranks trains on the records of one process's step
    k with N times their batch; with the graph modifier off, the FeatureSpecs' insert
    function runs in the pipeline.
    """
    num_parallel = 1 if config.USE_PIPELINE_TEST else 8
    pattern = config.train_file_pattern if is_training else config.test_file_pattern
    files_list = sorted(glob(os.path.join(config.data_path, pattern) + "/*.tfrecord"))
    if not files_list:
        raise ValueError(f"make_batch_and_iterator: no *.tfrecord under "
                         f"{os.path.join(config.data_path, pattern)!r} (DLRM_CRITEO_DATA_PATH)")
    records_per_batch = config.batch_size // config.line_per_sample
    dataset = tf.data.TFRecordDataset(files_list, num_parallel_reads=num_parallel)
    if is_training:
        dataset = dataset.shuffle(records_per_batch * config.rank_size * 1000,
                                  seed=SHUFFLE_SEED)
    dataset = dataset.shard(config.rank_size, config.rank_id)
    dataset = dataset.repeat(config.train_epoch if is_training else config.test_epoch)
    dataset = dataset.map(get_extract_fn(config), num_parallel_calls=num_parallel).batch(
        records_per_batch, drop_remainder=True)
    dataset = dataset.map(reshape_fn, num_parallel_calls=num_parallel)
    if is_use_faae:
        dataset = dataset.map(add_timestamp_func)
    if not MODIFY_GRAPH_FLAG:
        dataset = dataset.map(get_asc_insert_func(tgt_key_specs=feature_spec_list,
                                                  is_training=is_training,
                                                  dump_graph=dump_graph))
    iterator = tf.data.make_initializable_iterator(dataset.prefetch(100))
    return iterator.get_next(), iterator


def _eval_start(eval_model, eval_iterator):
    """Rewinds the evaluation data; the label tensor to read beside the model's outputs."""
    if not MODIFY_GRAPH_FLAG:
        eval_label = eval_model.get("label")
        initializer = eval_iterator.initializer
    else:
        # The graph modifier replaced the evaluation dataset: its batch holds the labels.
        params = ConfigInitializer.get_instance().train_params_config
        eval_label = params.get_target_batch(False).get("label")
        initializer = params.get_initializer(False)
    return eval_label, initializer


def _eval_loop(sess, eval_model, eval_iterator, cfg):
    eval_label, initializer = _eval_start(eval_model, eval_iterator)
    sess.run([initializer])
    losses, preds, labels = [], [], []
    current = 0
    logger.info("eval begin")
    while True:
        try:
            current += 1
            start = time.time()
            loss, pred, label = sess.run([eval_model.get("loss"), eval_model.get("pred"),
                                          eval_label])
        except tf.errors.OutOfRangeError:
            break
        qps = cfg.batch_size * cfg.rank_size / max(time.time() - start, 1e-9)
        losses += list(np.reshape(loss, -1))
        preds += list(np.reshape(pred, -1))
        labels += list(np.reshape(label, -1))
        logger.info(f"eval current_steps: {current}, qps: {qps}")
        if current == eval_steps:
            break
    return np.asarray(labels), np.asarray(preds), float(np.mean(losses))


def evaluate(sess, eval_model, eval_iterator, cfg):
    """(AUC, mean log loss) over this rank's evaluation records (at most `eval_steps`
    batches)."""
    labels, preds, mean_log_loss = _eval_loop(sess, eval_model, eval_iterator, cfg)
    return roc_auc(labels, preds), mean_log_loss


def evaluate_fix(step, sess, eval_model, eval_iterator, cfg=None):
    """evaluate(), and this rank's labels and predictions saved as NumPy files, as RecSDK's:
    ./interval_{INTERVAL}/numpy_{step}/label_{rank}.npy and pred_{rank}.npy (rank: mxrec's).

    RecSDK's also writes flag_{rank}.txt and polls until every rank's flag exists; this one
    writes no flag files and does not wait: a reader of every rank's files waits for them.
    """
    cfg = cfg if cfg is not None else _RankOnly()
    labels, preds, mean_log_loss = _eval_loop(sess, eval_model, eval_iterator, cfg)
    folder = os.path.join(os.path.abspath("."), f"interval_{interval}", f"numpy_{step}")
    os.makedirs(folder, exist_ok=True)
    rank = hccl_ops.get_rank_id()
    np.save(os.path.join(folder, f"label_{rank}.npy"), labels)
    np.save(os.path.join(folder, f"pred_{rank}.npy"), preds)
    return roc_auc(labels, preds), mean_log_loss


class _RankOnly:
    """What the evaluation loop reads of a Config to log its rate, when none is given."""
    batch_size = 0
    rank_size = 1


def create_feature_spec_list(cfg, use_timestamp=False):
    """The FeatureSpecs of the "sparse_embeddings" table (twice with USE_MULTI_LOOKUP=1);
    with timestamps, admission after 1000 accesses, eviction after 180 s, as RecSDK's."""
    _layout()
    thresholds = {"access_threshold": 1000, "eviction_threshold": 180} if use_timestamp else {
        "access_threshold": None, "eviction_threshold": None}
    lookups = 2 if use_multi_lookup else 1
    specs = [FeatureSpec("sparse_feature", table_name="sparse_embeddings",
                         batch_size=cfg.batch_size, **thresholds) for _ in range(lookups)]
    if use_timestamp:
        specs.append(FeatureSpec("timestamp", is_timestamp=True))
    return specs


def clear_saved_model() -> None:
    """Makes the SSD tier's folders (SSD_DATA_PATH, in the working directory) in SSD mode.

    RecSDK's also deletes the NPU's logs and compile caches (/root/ascend/log, kernel*,
    model_dir_rank*, op_cache) and empties the SSD folders; mxrec writes none of the
    former, and deletes nothing it did not write in this run.
    """
    if os.getenv("CACHE_MODE", "") != CacheModeEnum.SSD.value:
        return
    for sub_path in SSD_DATA_PATH:
        os.makedirs(sub_path, mode=0o750, exist_ok=True)

# coding=utf-8
# Copyright 2024. Huawei Technologies Co.,Ltd. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
# mxrec port of RecSDK examples/dlrm/model (Ascend/RecSDK); every change is marked
# "mxrec port:". Every `mxrec` import was `mx_rec` (the renaming mxrec asks for).
# (this file: RecSDK examples/dlrm/model/config.py, Ascend/RecSDK commit 89075b7e)

import enum
import os

import tensorflow.compat.v1 as tf  # mxrec port: TF's migration recipe
# mxrec port: removed `from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig`
# and `from npu_bridge.estimator.npu.npu_config import NPURunConfig` (NPU only)

SSD_DATA_PATH = ["ssd_data"]


def _env_int(name, default):  # mxrec port: sizes from the environment (tests run small)
    return int(os.getenv(name, default))


class LearningRateScheduler:
    """
    LR Scheduler combining Polynomial Decay with Warmup at the beginning.
    TF-based cond operations necessary for performance in graph mode.
    """

    def __init__(self, base_lr_dense, base_lr_sparse, warmup_steps, decay_start_step, decay_steps):
        self.warmup_steps = tf.constant(warmup_steps, dtype=tf.int32)
        self.decay_start_step = tf.constant(decay_start_step, dtype=tf.int32)
        self.decay_steps = tf.constant(decay_steps)
        self.decay_end_step = decay_start_step + decay_steps  # 65041
        self.poly_power = 2.0
        self.base_lr_dense = base_lr_dense
        self.base_lr_sparse = base_lr_sparse

    def calc(self, global_step):
        # used for the warmup stage
        warmup_step = tf.cast(1 / self.warmup_steps, tf.float32)
        lr_factor_warmup = 1 - tf.cast(self.warmup_steps - global_step, tf.float32) * warmup_step
        lr_factor_warmup = tf.cast(lr_factor_warmup, tf.float32)
        # used for the constant stage
        lr_factor_constant = tf.cast(1.0, tf.float32)

        # used for the decay stage
        lr_factor_decay = (self.decay_end_step - global_step) / self.decay_steps
        lr_factor_decay = tf.math.pow(lr_factor_decay, self.poly_power)
        lr_factor_decay = tf.cast(lr_factor_decay, tf.float32)
        sparse_after_decay = tf.cast(1 / self.decay_steps, tf.float32)

        lr_factor_decay_sparse = tf.cond(
            global_step < self.decay_end_step,
            lambda: lr_factor_decay,
            lambda: sparse_after_decay,
        )

        lr_factor_decay_dense = tf.cond(
            global_step < self.decay_end_step,
            lambda: lr_factor_decay,
            lambda: sparse_after_decay,
        )

        poly_schedule_sparse = tf.cond(
            global_step < self.decay_start_step,
            lambda: lr_factor_constant,
            lambda: lr_factor_decay_sparse,
        )

        poly_schedule_dense = tf.cond(
            global_step < self.decay_start_step,
            lambda: lr_factor_constant,
            lambda: lr_factor_decay_dense,
        )

        lr_factor_sparse = tf.cond(
            global_step < self.warmup_steps, lambda: lr_factor_warmup, lambda: poly_schedule_sparse
        )

        lr_factor_dense = tf.cond(
            global_step < self.warmup_steps, lambda: lr_factor_warmup, lambda: poly_schedule_dense
        )

        lr_sparse = self.base_lr_sparse * lr_factor_sparse
        lr_dense = self.base_lr_dense * lr_factor_dense
        return lr_dense, lr_sparse


class CacheModeEnum(enum.Enum):
    HBM = "HBM"
    DDR = "DDR"
    SSD = "SSD"


class Config:
    def __init__(self, ):
        self.rank_id = int(os.getenv("OMPI_COMM_WORLD_RANK")) if os.getenv("OMPI_COMM_WORLD_RANK") else None
        tmp = os.getenv("TRAIN_RANK_SIZE")
        if tmp is None:
            raise ValueError("please export TRAIN_RANK_SIZE")
        self.rank_size = int(tmp)
        if self.rank_id is None:  # mxrec port: one process has no OMPI rank; dataset.shard needs one
            self.rank_id = 0

        self.data_path = os.getenv("DLRM_CRITEO_DATA_PATH")
        self.train_file_pattern = "train"
        self.test_file_pattern = "test"

        self.batch_size = _env_int("ZOO_BATCH_SIZE", 8192)  # mxrec port: was 8192
        self.line_per_sample = _env_int("ZOO_LINE_PER_SAMPLE", 1024)  # mxrec port: was 1024
        self.train_epoch = _env_int("ZOO_TRAIN_EPOCH", 3)  # mxrec port: was 3
        self.test_epoch = 1
        self.perform_shuffle = False

        self.key_type = tf.int64
        self.label_type = tf.float32
        self.value_type = tf.int64

        self.feat_cnt = 26
        self.__set_emb_table_size()

        self.field_num = 26
        self.send_count = _env_int("ZOO_SEND_COUNT", 46000) // self.rank_size  # mxrec port: was 46000

        self.emb_dim = 128
        self.hashtable_threshold = 1

        self.USE_PIPELINE_TEST = False
        # mxrec port: optimizer.py reads it; RecSDK's later examples/model_common.py Config
        # sets it (False) for DLRM, this config.py lacks it
        self.use_lazy_adam_optimizer = False

        # 动态学习率
        GLOBAL_BATCH_SIZE = 8192 * 8
        # mxrec port: ZOO_LR_STEPS_SCALE shrinks the warmup and decay steps for short runs
        scale = float(os.getenv("ZOO_LR_STEPS_SCALE", "1"))
        LR_SCHEDULE_STEPS = [
            max(1, int(2750 * 55296 / GLOBAL_BATCH_SIZE * scale)),
            max(1, int(49315 * 55296 / GLOBAL_BATCH_SIZE * scale)),
            max(1, int(27772 * 55296 / GLOBAL_BATCH_SIZE * scale)),
        ]
        self.global_step = tf.Variable(0, trainable=False)
        # mxrec port: ZOO_LR_SCALE scales both base learning rates (default 1: the original's)
        lr_scale = float(os.getenv("ZOO_LR_SCALE", "1"))
        _lr_scheduler = LearningRateScheduler(
            28.443 * lr_scale,
            33.71193 * lr_scale,
            LR_SCHEDULE_STEPS[0],
            LR_SCHEDULE_STEPS[1],
            LR_SCHEDULE_STEPS[2],
        )
        self.learning_rate = _lr_scheduler.calc(self.global_step)

    def __set_emb_table_size(self):
        self.cache_mode = os.getenv("CACHE_MODE")
        if self.cache_mode is None:
            raise ValueError("please export CACHE_MODE environment variable, support:[HBM, DDR, SSD]")
        # mxrec port: the vocabulary sizes from the environment (defaults: the original's)
        if self.cache_mode == CacheModeEnum.HBM.value:
            self.dev_vocab_size = _env_int("ZOO_HBM_DEV_VOCAB", 24_000_000) * self.rank_size
            self.host_vocab_size = 0
        elif self.cache_mode == CacheModeEnum.DDR.value:
            self.dev_vocab_size = _env_int("ZOO_DDR_DEV_VOCAB", 500_000) * self.rank_size
            self.host_vocab_size = _env_int("ZOO_DDR_HOST_VOCAB", 24_000_000) * self.rank_size
        elif self.cache_mode == CacheModeEnum.SSD.value:
            self.dev_vocab_size = _env_int("ZOO_SSD_DEV_VOCAB", 100_000) * self.rank_size
            self.host_vocab_size = _env_int("ZOO_SSD_HOST_VOCAB", 2_000_000) * self.rank_size
            self.ssd_vocab_size = _env_int("ZOO_SSD_SSD_VOCAB", 24_000_000) * self.rank_size
        else:
            raise ValueError(f"get CACHE_MODE:{self.cache_mode}, expect in [HBM, DDR, SSD]")

    def get_emb_table_cfg(self) -> dict:
        if self.cache_mode == CacheModeEnum.HBM.value:
            return {"device_vocabulary_size": self.dev_vocab_size}
        elif self.cache_mode == CacheModeEnum.DDR.value:
            return {"device_vocabulary_size": self.dev_vocab_size,
                    "host_vocabulary_size": self.host_vocab_size}
        elif self.cache_mode == CacheModeEnum.SSD.value:
            return {"device_vocabulary_size": self.dev_vocab_size,
                    "host_vocabulary_size": self.host_vocab_size,
                    "ssd_vocabulary_size": self.ssd_vocab_size,
                    "ssd_data_path": SSD_DATA_PATH}
        else:
            raise RuntimeError(f"get CACHE_MODE:{self.cache_mode}, check Config.__set_emb_table_size implementation")


def sess_config(dump_data=False, dump_path="./dump_output", dump_steps="0|1|2"):
    # mxrec port: the NPU session config (NpuOptimizer custom optimizer, dump options) is
    # NPU only; a plain session config instead
    from zoo_port import session_config
    return session_config()

# mxrec port: removed get_npu_run_config (NPURunConfig, NPU only; the Session script does
# not use it)

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
# mxrec port of RecSDK examples/WideDeep/model (Ascend/RecSDK); every change is marked
# "mxrec port:". Every `mxrec` import was `mx_rec` (the renaming mxrec asks for).
# (this file: RecSDK examples/WideDeep/model/main_mxrec.py, Ascend/RecSDK commit 5bd6d681)
#
# mxrec port: run as run.sh runs it, with its environment: USE_DYNAMIC, CACHE_MODE,
# USE_FAAE, USE_DYNAMIC_EXPANSION, USE_MULTI_LOOKUP, USE_MODIFY_GRAPH, TRAIN_RANK_SIZE,
# DLRM_CRITEO_DATA_PATH; the sizes of config.py from ZOO_* (tests run small). Added by
# the port (marked): ZOO_DIRECT=1 (tensor IDs, modify_graph=False: the reference the
# tests compare every mode with), ZOO_TRAIN_STEPS / ZOO_EVAL_STEPS, ZOO_DROPOUT_RATE, a
# save at the end of training and, when ./saved-model/sparse-model-0 exists (the script's
# own IF_LOAD), a restore and an evaluation only; the results go to ZOO_RESULT (JSON) when set.

import os
import shutil
import collections
import time
import warnings
import random
from glob import glob

import tensorflow.compat.v1 as tf  # mxrec port: TF's migration recipe
# mxrec port: roc_auc_score of scikit-learn (not an mxrec dependency) -> zoo_port's
from zoo_port import roc_auc_score, step_gradient_ops, ModelSaver
import numpy as np

from optimizer import get_dense_and_sparse_optimizer
from config import sess_config, Config, SSD_DATA_PATH, CacheModeEnum
from model import MyModel
from mxrec.constants.constants import ASCEND_SPARSE_LOOKUP_LOCAL_EMB, ASCEND_SPARSE_LOOKUP_ID_OFFSET
from mxrec.core.asc.helper import FeatureSpec, get_asc_insert_func
from mxrec.core.asc.manager import start_asc_pipeline
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.core.feature_process import EvictHook
from mxrec.graph.modifier import modify_graph_and_start_emb_cache, GraphModifierHook
from mxrec.constants.constants import ASCEND_TIMESTAMP, LIBREC_EOS_OPS_SO
from mxrec.util.initialize import ConfigInitializer, init, terminate_config_initializer
from mxrec.util.ops import import_host_pipeline_ops
import mxrec.util as mxrec_util
from mxrec.util.variable import get_dense_and_sparse_variable
from mxrec.util.log import logger
# mxrec port: removed `from npu_bridge.npu_init import *` (NPU only); of what it gave the
# script, hccl_ops comes from mx_rec's adapter
from mxrec.util.tf_version_adapter import hccl_ops

tf.disable_v2_behavior()  # mxrec port: TF's migration recipe
# mxrec port: removed npu_plugin.set_device_sat_mode(0) (NPU only)

dense_hashtable_seed = 128
sparse_hashtable_seed = 128
shuffle_seed = 128
random.seed(shuffle_seed)
DIRECT_FLAG = os.getenv("ZOO_DIRECT", "0") not in ("", "0")  # mxrec port: the reference mode
# mxrec port: ZOO_INIT_BY_ID=1 draws a new ID's first values from the ID (create_table's
# init_by_id), so that N ranks start every ID as one process does (each rank hands out rows
# of its own shard); the tests compare the tables of N ranks with one process's this way
ZOO_TABLE_ARGS = {"init_by_id": True} if os.getenv("ZOO_INIT_BY_ID", "0") not in ("", "0") else {}


def _direct_faae():  # mxrec port: the FeatureSpecs' admission/eviction, for tensor IDs
    # (ZOO_DIRECT=modify_graph: none, as the example's modify_graph lookups pass None)
    if not (DIRECT_FLAG and use_faae) or os.getenv("ZOO_DIRECT") == "modify_graph":
        return None
    return {"access_threshold": int(os.getenv("ZOO_ACCESS_THRESHOLD", "1000")),
            "eviction_threshold": 180}


def add_timestamp_func(batch):
    timestamp = import_host_pipeline_ops().return_timestamp(tf.cast(batch['label'], dtype=tf.int64))
    batch["timestamp"] = timestamp
    return batch


def make_batch_and_iterator(config, feature_spec_list, is_training, dump_graph, is_use_faae=False, **kwargs):
    if config.USE_PIPELINE_TEST:
        num_parallel = 1
    else:
        num_parallel = 8

    def extract_fn(data_record):
        features = {
            # Extract features using the keys set during creation
            'label': tf.compat.v1.FixedLenFeature(shape=(config.line_per_sample,), dtype=tf.int64),
            'sparse_feature': tf.compat.v1.FixedLenFeature(shape=(26 * config.line_per_sample,), dtype=tf.int64),
            'dense_feature': tf.compat.v1.FixedLenFeature(shape=(13 * config.line_per_sample,), dtype=tf.int64),
        }
        sample = tf.compat.v1.parse_single_example(data_record, features)
        return sample

    def reshape_fn(batch):
        batch['label'] = tf.reshape(batch['label'], [-1, 1])
        batch['dense_feature'] = tf.reshape(batch['dense_feature'], [-1, 13])
        batch['sparse_feature'] = tf.reshape(batch['sparse_feature'], [-1, 26])
        return batch

    if is_training:
        files_list = glob(os.path.join(config.data_path, config.train_file_pattern) + '/*.tfrecord')
    else:
        files_list = glob(os.path.join(config.data_path, config.test_file_pattern) + '/*.tfrecord')
    files_list = sorted(files_list)  # mxrec port: glob's order is the file system's; sorted, every run reads alike
    dataset = tf.data.TFRecordDataset(files_list, num_parallel_reads=num_parallel)
    batch_size = config.batch_size // config.line_per_sample

    # mxrec port: the shuffle before the shard (RecSDK shuffles each rank's shard): with the
    # same seed every rank draws the same order of all records and keeps its share, so N
    # ranks train on the global batches one process trains on (one process: unchanged)
    if is_training:
        dataset = dataset.shuffle(batch_size * config.rank_size * 1000, seed=shuffle_seed)
    dataset = dataset.shard(config.rank_size, config.rank_id)
    if is_training:
        dataset = dataset.repeat(config.train_epoch)
    else:
        dataset = dataset.repeat(config.test_epoch)
    dataset = dataset.map(extract_fn, num_parallel_calls=num_parallel).batch(batch_size,
                                                                             drop_remainder=True)
    dataset = dataset.map(reshape_fn, num_parallel_calls=num_parallel)

    def map_fn(batch):
        new_batch = batch
        new_batch['sparse_feature'] = tf.concat([batch['dense_feature'], batch['sparse_feature']], axis=1)
        return new_batch
    dataset = dataset.map(map_fn, num_parallel_calls=num_parallel)

    if is_use_faae:
        dataset = dataset.map(add_timestamp_func)

    if not MODIFY_GRAPH_FLAG and not DIRECT_FLAG:  # mxrec port: DIRECT_FLAG

        # Enable EOSDataset manually.
        librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
        channel_id = 0 if is_training else 1
        # 此处eos_map的调用必须先于insert_func,避免多卡数据不均匀的情况
        dataset = dataset.eos_map(librec, channel_id, kwargs.get("max_train_steps", max_train_steps),
                                  kwargs.get("max_eval_steps", eval_steps))
        insert_fn = get_asc_insert_func(tgt_key_specs=feature_spec_list, is_training=is_training, dump_graph=dump_graph)
        dataset = dataset.map(insert_fn)

    dataset = dataset.prefetch(100)

    iterator = dataset.make_initializable_iterator()
    batch = iterator.get_next()
    return batch, iterator


def model_forward(model_args):
    feature_list = model_args.feature_list
    wide_hash_table_list = model_args.wide_hash_table_list
    deep_hash_table_list = model_args.deep_hash_table_list
    batch = model_args.batch
    is_train = model_args.is_train
    modify_graph = model_args.modify_graph
    is_use_faae = model_args.is_use_faae

    wide_embedding_list = []
    deep_embedding_list = []
    wide_feature_list = []
    deep_feature_list = []
    if is_use_faae:
        feature_list_copy = feature_list[:-1]
    else:
        feature_list_copy = feature_list

    for index, item in enumerate(feature_list_copy):
        if index % 2 == 0:
            wide_feature_list.append(item)
        else:
            deep_feature_list.append(item)

    logger.debug(f"In model_forward function, is_train: {is_train}, feature_list: {len(feature_list)}, "
                 f"wide_hash_table_list: {len(wide_hash_table_list)}, "
                 f"deep_hash_table_list: {len(deep_hash_table_list)}")

    # wide
    for wide_feature, wide_hash_table in zip(wide_feature_list, wide_hash_table_list):
        if MODIFY_GRAPH_FLAG or DIRECT_FLAG:  # mxrec port: DIRECT_FLAG
            wide_feature = batch["sparse_feature"]
        wide_embedding = sparse_lookup(wide_hash_table, wide_feature, cfg.send_count, dim=None, is_train=is_train,
                                  name="wide_embedding_lookup", modify_graph=modify_graph, batch=batch,
                                  access_and_evict_config=_direct_faae())  # mxrec port: was None
        wide_embedding_list.append(wide_embedding)

    # deep
    for deep_feature, deep_hash_table in zip(deep_feature_list, deep_hash_table_list):
        if MODIFY_GRAPH_FLAG or DIRECT_FLAG:  # mxrec port: DIRECT_FLAG
            deep_feature = batch["sparse_feature"]
        deep_embedding = sparse_lookup(deep_hash_table, deep_feature, cfg.send_count, dim=None, is_train=is_train,
                                  name="deep_embedding_lookup", modify_graph=modify_graph, batch=batch,
                                  access_and_evict_config=_direct_faae())  # mxrec port: was None
        deep_embedding_list.append(deep_embedding)

    if len(wide_embedding_list) == 1:
        wide_emb = wide_embedding_list[0]
        deep_emb = deep_embedding_list[0]
    elif len(wide_embedding_list) > 1:
        wide_emb = tf.reduce_sum(wide_embedding_list, axis=0, keepdims=False)
        deep_emb = tf.reduce_sum(deep_embedding_list, axis=0, keepdims=False)
    else:
        raise ValueError("the length of embedding_list must be greater than or equal to 1.")
    my_model = MyModel()

    BuildModel = collections.namedtuple("BuildModel", ["wide_embedding", "deep_embedding", "label", "is_training",
                                                       "seed", "dropout_rate", "batch_norm"])
    # mxrec port: ZOO_DROPOUT_RATE (default the example's 0.5; 0 turns dropout off). Dropout's
    # draws depend on each graph's op seeds and batch shape, so N ranks never draw one
    # process's masks; the tests that compare rows and losses with one process run without it
    dropout_rate = float(os.getenv("ZOO_DROPOUT_RATE", "0.5"))
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"ZOO_DROPOUT_RATE={dropout_rate}: a rate in [0, 1) (0: no dropout)")
    build_model_args = BuildModel(wide_emb, deep_emb, batch["label"], is_train, dense_hashtable_seed, dropout_rate, False)
    model_output = my_model.build_model(build_model_args)
    return model_output


def evaluate():
    print("read_test dataset")
    if not MODIFY_GRAPH_FLAG:
        eval_label = eval_model.get("label")
        sess.run([eval_iterator.initializer])
    else:
        # 在sess run模式下，若还是使用原来batch中的label去sess run，则会出现getnext超时报错，需要使用新数据集中的batch
        eval_label = ConfigInitializer.get_instance().train_params_config.get_target_batch(False).get("label")
        sess.run([ConfigInitializer.get_instance().train_params_config.get_initializer(False)])
    log_loss_list = []
    pred_list = []
    label_list = []
    eval_current_steps = 0
    finished = False
    print("eval begin")

    while not finished:
        try:
            eval_current_steps += 1
            eval_start = time.time()
            eval_loss, pred, label = sess.run([eval_model.get("loss"), eval_model.get("pred"), eval_label])
            eval_cost = time.time() - eval_start
            qps_eval = (1 / eval_cost) * rank_size * cfg.batch_size
            log_loss_list += list(eval_loss.reshape(-1))
            pred_list += list(pred.reshape(-1))
            label_list += list(label.reshape(-1))
            print(f"eval current_steps: {eval_current_steps}, qps: {qps_eval}")
            if eval_current_steps == eval_steps:
                finished = True
        except tf.errors.OutOfRangeError:
            finished = True
    auc = roc_auc_score(label_list, pred_list)
    mean_log_loss = np.mean(log_loss_list)
    return auc, mean_log_loss

# mxrec port: evaluate_fix (INTERVAL set: per-rank .npy files and flag files polled for
# horovodrun's ranks) left out; one process evaluates with evaluate()


def create_feature_spec_list(use_timestamp=False):
    access_threshold = None
    eviction_threshold = None
    if use_timestamp:
        access_threshold = int(os.getenv("ZOO_ACCESS_THRESHOLD", "1000"))  # mxrec port: was 1000
        eviction_threshold = 180

    feature_spec_list = [FeatureSpec("sparse_feature", table_name="wide_embeddings", batch_size=cfg.batch_size,
                                     access_threshold=access_threshold, eviction_threshold=eviction_threshold),
                         FeatureSpec("sparse_feature", table_name="deep_embeddings", batch_size=cfg.batch_size,
                                     access_threshold=access_threshold, eviction_threshold=eviction_threshold)]

    if use_multi_lookup:
        feature_spec_list.extend([FeatureSpec("sparse_feature", table_name="wide_embeddings",
                                             batch_size=cfg.batch_size,
                                             access_threshold=access_threshold,
                                             eviction_threshold=eviction_threshold),
                                  FeatureSpec("sparse_feature", table_name="deep_embeddings",
                                             batch_size=cfg.batch_size,
                                             access_threshold=access_threshold,
                                             eviction_threshold=eviction_threshold)])
    if use_timestamp:
        feature_spec_list.append(FeatureSpec("timestamp", is_timestamp=True))
    return feature_spec_list


def _del_related_dir(del_path: str) -> None:
    if not os.path.isabs(del_path):
        del_path = os.path.join(os.getcwd(), del_path)
    dirs = glob(del_path)
    for sub_dir in dirs:
        shutil.rmtree(sub_dir, ignore_errors=True)
        logger.info(f"delete dir:{sub_dir}")


def _clear_saved_model() -> None:
    # mxrec port: removed the deletion of the NPU's logs and kernel caches
    # (/root/ascend/log/*, kernel*, model_dir_rank*, op_cache)
    if os.getenv("CACHE_MODE", "") != CacheModeEnum.SSD.value:
        return
    if glob("./saved-model/sparse-model-0"):  # mxrec port: a restore reads the SSD files
        return
    logger.info("current cache mode is SSD, and file overwrite is not allowed in SSD mode, deleting exist directory"
                " then create empty directory for this use case.")
    for sub_path in SSD_DATA_PATH:
        _del_related_dir(sub_path)
        os.makedirs(sub_path, mode=0o750, exist_ok=True)  # mxrec port: was 0o550 (mxrec writes there)
        logger.info(f"mkdir dir:{sub_path}")


if __name__ == "__main__":
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    warnings.filterwarnings("ignore")
    _clear_saved_model()

    rank_id = int(os.getenv("RANK_ID")) if os.getenv("RANK_ID") else None
    rank_size = int(os.getenv("TRAIN_RANK_SIZE")) if os.getenv("TRAIN_RANK_SIZE") else None
    interval = int(os.getenv("INTERVAL")) if os.getenv("INTERVAL") else None
    max_train_steps = int(os.getenv("ZOO_MAX_TRAIN_STEPS", "1270"))  # mxrec port: was 1270
    train_steps = int(os.getenv("ZOO_TRAIN_STEPS", "1120"))  # mxrec port: was 1120
    eval_steps = int(os.getenv("ZOO_EVAL_STEPS", "1080"))  # mxrec port: was 1080

    try:
        use_dynamic_expansion = bool(int(os.getenv("USE_DYNAMIC_EXPANSION", 0)))
        use_multi_lookup = bool(int(os.getenv("USE_MULTI_LOOKUP", 0)))
        MODIFY_GRAPH_FLAG = bool(int(os.getenv("USE_MODIFY_GRAPH", 0)))
        use_faae = bool(int(os.getenv("USE_FAAE", 0)))
    except ValueError as err:
        raise ValueError("please correctly config USE_DYNAMIC_EXPANSION or USE_MULTI_LOOKUP or USE_FAAE "
                         "or USE_MODIFY_GRAPH only 0 or 1 is supported.") from err

    use_dynamic = bool(int(os.getenv("USE_DYNAMIC", 0)))
    logger.info(f"USE_DYNAMIC:{use_dynamic}")
    init(train_steps=train_steps, eval_steps=eval_steps,
         use_dynamic=use_dynamic, use_dynamic_expansion=use_dynamic_expansion)
    IF_LOAD = False
    rank_id = mxrec_util.communication.hccl_ops.get_rank_id()
    filelist = glob(f"./saved-model/sparse-model-0")
    if filelist:
        IF_LOAD = True
    ConfigInitializer.get_instance().if_load = IF_LOAD

    cfg = Config()
    feature_spec_list_train = None
    feature_spec_list_eval = None
    if use_faae:
        feature_spec_list_train = create_feature_spec_list(use_timestamp=True)
        feature_spec_list_eval = create_feature_spec_list(use_timestamp=True)
    else:
        feature_spec_list_train = create_feature_spec_list(use_timestamp=False)
        feature_spec_list_eval = create_feature_spec_list(use_timestamp=False)

    train_batch, train_iterator = make_batch_and_iterator(cfg, feature_spec_list_train, is_training=True,
                                                          dump_graph=False, is_use_faae=use_faae,  # mxrec port: dump_graph was True (writes export_graph/)
                                                          max_train_steps=max_train_steps, max_eval_steps=eval_steps)
    eval_batch, eval_iterator = make_batch_and_iterator(cfg, feature_spec_list_eval, is_training=False,
                                                        dump_graph=False, is_use_faae=use_faae,
                                                        max_train_steps=max_train_steps, max_eval_steps=eval_steps)
    logger.info(f"train_batch: {train_batch}")

    if use_faae:
        cfg.dev_vocab_size = cfg.dev_vocab_size // 2

    optimizer_list = [get_dense_and_sparse_optimizer(cfg)]

    # 创表操作
    wide_emb_initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=sparse_hashtable_seed)
    deep_emb_initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=sparse_hashtable_seed)

    sparse_hashtable_wide = create_table(
        key_dtype=cfg.key_type,
        dim=tf.TensorShape([cfg.emb_dim]),
        name="wide_embeddings",
        emb_initializer=wide_emb_initializer,
        **cfg.get_emb_table_cfg(),
        **ZOO_TABLE_ARGS,  # mxrec port: ZOO_INIT_BY_ID
    )

    sparse_hashtable_deep = create_table(
        key_dtype=cfg.key_type,
        dim=tf.TensorShape([cfg.emb_dim]),
        name="deep_embeddings",
        emb_initializer=deep_emb_initializer,
        **cfg.get_emb_table_cfg(),
        **ZOO_TABLE_ARGS,  # mxrec port: ZOO_INIT_BY_ID
    )

    if use_faae:
        tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, train_batch["timestamp"])

    # 一表多查
    wide_hashtable_list = [sparse_hashtable_wide, sparse_hashtable_wide] if use_multi_lookup else \
                          [sparse_hashtable_wide]
    deep_hashtable_list = [sparse_hashtable_deep, sparse_hashtable_deep] if use_multi_lookup else \
                          [sparse_hashtable_deep]


    Forward = collections.namedtuple("Forward", ["feature_list", "wide_hash_table_list", "deep_hash_table_list",
                                                 "batch", "is_train", "modify_graph", "is_use_faae"])
    train_forward_args = Forward(feature_spec_list_train, wide_hashtable_list, deep_hashtable_list, train_batch,
                                True, MODIFY_GRAPH_FLAG, use_faae)
    eval_forward_args = Forward(feature_spec_list_eval, wide_hashtable_list, deep_hashtable_list, eval_batch,
                                False, MODIFY_GRAPH_FLAG, use_faae)
    train_model = model_forward(train_forward_args)
    eval_model = model_forward(eval_forward_args)

    train_variables, emb_variables = get_dense_and_sparse_variable()

    rank_size = mxrec_util.communication.hccl_ops.get_rank_size()
    train_ops = []
    # multi task training
    for loss, (model_optimizer, emb_optimizer) in zip([train_model.get("loss")], optimizer_list):
        # do model optimization
        grads = model_optimizer.compute_gradients(loss, var_list=train_variables)
        # mxrec port: the embeddings' gradients are built before any update (they were built
        # after the dense update), so that every update can wait for every gradient of the
        # step (see step_gradient_ops in zoo_port.py; the original leaves this order to the
        # scheduler, which on ranks moves with the collectives' timing)
        if use_dynamic_expansion:
            train_address_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
            train_emb_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
            sparse_grads = emb_optimizer.compute_gradients(loss, train_emb_list)  # local_embedding
            sparse_targets = train_address_list
        else:
            sparse_grads = emb_optimizer.compute_gradients(loss, emb_variables)
            print("sparse_grads_tensor:", sparse_grads)
            sparse_targets = emb_variables
        step_grads = step_gradient_ops(list(grads) + [(grad, None) for grad in sparse_grads])
        with tf.control_dependencies(step_grads):  # mxrec port: see above
            avg_grads = []
            for grad, var in grads:
                if rank_size > 1:
                    grad = hccl_ops.allreduce(grad, "sum") if grad is not None else None
                if grad is not None:
                    avg_grads.append((grad / 8.0, var))
            # apply gradients: update variables
            train_ops.append(model_optimizer.apply_gradients(avg_grads))

            # do embedding optimization (by addr with dynamic expansion)
            grads_and_vars = [(grad, target) for grad, target in zip(sparse_grads, sparse_targets)]
            train_ops.append(emb_optimizer.apply_gradients(grads_and_vars))

    # 动态学习率更新
    # mxrec port: the step counter moves after the step's updates, so step k trains with the
    # learning rate of step k (see step_gradient_ops in zoo_port.py; was unordered)
    with tf.control_dependencies(train_ops):
        step_increment = cfg.global_step.assign(cfg.global_step + 1)
    train_ops.extend([step_increment, cfg.learning_rate[0], cfg.learning_rate[1]])

    with tf.control_dependencies(train_ops):
        train_ops = tf.no_op()
        cfg.learning_rate = [cfg.learning_rate[0], cfg.learning_rate[1]]

    saver = tf.train.Saver()
    model_saver = ModelSaver(saver, rank_size)  # mxrec port: the save the tests read
    if MODIFY_GRAPH_FLAG:
        modify_graph_and_start_emb_cache(dump_graph=False)  # mxrec port: dump_graph was True
    else:
        start_asc_pipeline()

    hook_list = []
    if use_faae:
        hook_evict = EvictHook(evict_enable=True, evict_time_interval=120)
        hook_list.append(hook_evict)
        if MODIFY_GRAPH_FLAG:  # 该场景添加hook处理校验问题
            hook_list.append(GraphModifierHook(modify_graph=False))

    # with tf.compat.v1.Session(config=sess_config(dump_data=False)) as sess:
    if use_faae:
        sess = tf.compat.v1.train.MonitoredTrainingSession(
            hooks=hook_list,
            config=sess_config(dump_data=False)
        )
        sess.graph._unsafe_unfinalize()
        if not MODIFY_GRAPH_FLAG:
            sess.run(train_iterator.initializer)
        else:
            sess.run(ConfigInitializer.get_instance().train_params_config.get_initializer(True))
    else:
        sess = tf.compat.v1.Session(config=sess_config(dump_data=False))
        sess.run(tf.compat.v1.global_variables_initializer())
        if not MODIFY_GRAPH_FLAG:
            sess.run(train_iterator.initializer)
        else:
            sess.run(ConfigInitializer.get_instance().train_params_config.get_initializer(True))

    epoch = 0
    cost_sum = 0
    qps_sum = 0
    best_auc = 0
    # mxrec port: one step per session run: util.set_iteration_per_loop (npu_bridge's loop
    # of 10 steps on the device) is NPU only, so iteration_per_loop is 1 (was 10)
    iteration_per_loop = 1
    results = {"auc": [], "steps": 0}  # mxrec port: what the tests read

    if IF_LOAD:  # mxrec port: restore what the training run saved, evaluate only
        model_saver.restore(sess)  # mxrec port
        test_auc, test_mean_log_loss = evaluate()
        results["auc"].append(float(test_auc))
        results["restored_step"] = int(sess.run(cfg.global_step))

    # for i in range(1, TRAIN_STEPS):
    i = 0
    while not IF_LOAD:  # mxrec port: was `while True` (a restored run evaluates only)
        i += 1
        logger.info(f"################    training at step {i * iteration_per_loop}    ################")
        start_time = time.time()

        try:
            grad, loss = sess.run([train_ops, train_model.get("loss")])
            lr = sess.run(cfg.learning_rate)
            global_step = sess.run(cfg.global_step)
        except tf.errors.OutOfRangeError:
            logger.info(f"Encounter the end of Sequence for training.")
            break

        end_time = time.time()
        cost_time = end_time - start_time
        qps = (1 / cost_time) * rank_size * cfg.batch_size * iteration_per_loop
        cost_sum += cost_time
        logger.info(f"step: {i * iteration_per_loop}; training loss: {loss}")
        logger.info(f"step: {i * iteration_per_loop}; grad: {grad}")
        logger.info(f"step: {i * iteration_per_loop}; lr: {lr}")
        logger.info(f"global step: {global_step}")
        logger.info(f"step: {i * iteration_per_loop}; current sess cost time: {cost_time:.10f}; current QPS: {qps}")
        logger.info(f"training at step:{i * iteration_per_loop}, "
                    f"table[{sparse_hashtable_wide.table_name}], "
                    f"table size:{sparse_hashtable_wide.size()}, table capacity:{sparse_hashtable_wide.capacity()}, "
                    f"table[{sparse_hashtable_deep.table_name}], "
                    f"table size:{sparse_hashtable_deep.size()}, table capacity:{sparse_hashtable_deep.capacity()}")
        results["steps"] = i  # mxrec port
        results.setdefault("losses", []).append(float(loss))  # mxrec port

        if i % (train_steps // iteration_per_loop) == 0:
            if interval is not None:
                raise NotImplementedError("mxrec port: INTERVAL (evaluate_fix) is left out")  # mxrec port
            else:
                test_auc, test_mean_log_loss = evaluate()
            print("Test auc: {}; log_loss: {} ".format(test_auc, test_mean_log_loss))
            best_auc = max(best_auc, test_auc)
            logger.info(f"training step: {i * iteration_per_loop}, best auc: {best_auc}")
            results["auc"].append(float(test_auc))  # mxrec port

    if not IF_LOAD:  # mxrec port: save what training made (the original builds a Saver and never saves)
        results["saved_step"] = int(sess.run(cfg.global_step))
        model_saver.save(sess, results["saved_step"])
        results["table_size"] = int(sparse_hashtable_deep.size())
    sess.close()

    terminate_config_initializer()
    logger.info("Demo done!")
    if os.getenv("ZOO_RESULT"):  # mxrec port
        import json
        # mxrec port: "{rank}" in ZOO_RESULT is this rank's id (several ranks share a folder)
        with open(os.environ["ZOO_RESULT"].replace("{rank}", str(rank_id)), "w") as out:
            json.dump(results, out)

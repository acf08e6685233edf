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
# mxrec port of a later RecSDK examples/dlrm/model/main_mxrec.py (SimmerChan/RecSDK, commit
# 0863e3c7), which takes its Config, input pipeline, evaluation and FeatureSpecs from
# mx_rec.util.model_common (mxrec's own: mxrec/compat/model_common.py). Every change is
# marked "mxrec port:"; every `mxrec` import was `mx_rec` (the renaming mxrec asks for).
# model.py, optimizer.py and delay_loss_scale.py are the earlier port's (examples/mx_rec_zoo/
# dlrm, after this folder on PYTHONPATH).
#
# mxrec port: run as run.sh runs it, with its environment (USE_DYNAMIC, CACHE_MODE, USE_FAAE,
# USE_DYNAMIC_EXPANSION, USE_MULTI_LOOKUP, USE_MODIFY_GRAPH, TRAIN_RANK_SIZE,
# DLRM_CRITEO_DATA_PATH). Added by the port (marked): the sizes from ZOO_* (the earlier
# port's names; tests run small), ZOO_INIT_BY_ID, a save at the end of training and, when
# ./saved-model/sparse-model-0 exists (the script's own IF_LOAD), a restore and an
# evaluation only; the results go to ZOO_RESULT (JSON) when set.

import os
import time
import warnings
from glob import glob

import tensorflow.compat.v1 as tf  # mxrec port: TF's migration recipe (was: import tensorflow as tf)

from mxrec.constants.constants import ASCEND_SPARSE_LOOKUP_LOCAL_EMB, ASCEND_SPARSE_LOOKUP_ID_OFFSET
from mxrec.core.asc.manager import start_asc_pipeline
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.core.feature_process import EvictHook
from mxrec.graph.modifier import modify_graph_and_start_emb_cache, GraphModifierHook
from mxrec.constants.constants import ASCEND_TIMESTAMP
from mxrec.util.initialize import ConfigInitializer, init, terminate_config_initializer
import mxrec.util as mxrec_util
from mxrec.util.variable import get_dense_and_sparse_variable
import mxrec.util.model_common as cm
from mxrec.util.model_common import (
    sess_config, Config,
    create_feature_spec_list, clear_saved_model, evaluate, evaluate_fix, make_batch_and_iterator
)
# mxrec port: removed `from npu_bridge.npu_init import *` (NPU only); of what it gave the
# script, hccl_ops comes from mx_rec's adapter
from mxrec.util.tf_version_adapter import hccl_ops
from zoo_port import step_gradient_ops, ModelSaver  # mxrec port: the ordered step, the save
from optimizer import get_dense_and_sparse_optimizer
from demo_logger import logger
from model import MyModel

tf.disable_v2_behavior()  # mxrec port: TF's migration recipe
# mxrec port: removed npu_plugin.set_device_sat_mode(0) (NPU only)

dense_hashtable_seed = 128
sparse_hashtable_seed = 128
cm.MODEL_NAME = "DLRM"
cm.logger = logger
# mxrec port: ZOO_INIT_BY_ID=1 draws a new ID's first values from the ID (create_table's
# init_by_id), so that N ranks start every ID as one process does
ZOO_TABLE_ARGS = {"init_by_id": True} if os.getenv("ZOO_INIT_BY_ID", "0") not in ("", "0") else {}


def _zoo_sizes(cfg):  # mxrec port: model_common's sizes from ZOO_* (tests run small)
    def env_int(name, default):
        return int(os.getenv(name, default))

    cfg.batch_size = env_int("ZOO_BATCH_SIZE", cfg.batch_size)
    cfg.line_per_sample = env_int("ZOO_LINE_PER_SAMPLE", cfg.line_per_sample)
    cfg.train_epoch = env_int("ZOO_TRAIN_EPOCH", cfg.train_epoch)
    cfg.send_count = env_int("ZOO_SEND_COUNT", 46000) // cfg.rank_size
    rows = {"HBM": ("dev_vocab_size",), "DDR": ("dev_vocab_size", "host_vocab_size"),
            "SSD": ("dev_vocab_size", "host_vocab_size", "ssd_vocab_size")}[cfg.cache_mode]
    for field in rows:
        name = f"ZOO_{cfg.cache_mode}_{field.split('_')[0].upper()}_VOCAB"
        if os.getenv(name):
            setattr(cfg, field, env_int(name, 0) * cfg.rank_size)
    # the schedule of model_common's Config, its steps and base rates scaled
    scale, lr_scale = float(os.getenv("ZOO_LR_STEPS_SCALE", "1")), float(os.getenv("ZOO_LR_SCALE", "1"))
    steps = [max(1, int(n * 55296 / (8192 * 8) * scale)) for n in (2750, 49315, 27772)]
    cfg.learning_rate = cm.LearningRateScheduler(28.443 * lr_scale, 33.71193 * lr_scale,
                                                 *steps).calc(cfg.global_step)


def model_forward(feature_list, hash_table_list, batch, is_train, modify_graph):
    embedding_list = []
    logger.debug(f"In model_forward function, is_train: {is_train}, feature_list: {len(feature_list)}, "
                 f"hash_table_list: {len(hash_table_list)}")
    for feature, hash_table in zip(feature_list, hash_table_list):
        if cm.MODIFY_GRAPH_FLAG:
            feature = batch["sparse_feature"]
        embedding = sparse_lookup(hash_table, feature, cfg.send_count, dim=None, is_train=is_train,
                                  name="user_embedding_lookup", modify_graph=modify_graph, batch=batch,
                                  access_and_evict_config=None)
        embedding_list.append(embedding)

    if len(embedding_list) == 1:
        emb = embedding_list[0]
    elif len(embedding_list) > 1:
        emb = tf.reduce_sum(embedding_list, axis=0, keepdims=False)
    else:
        raise ValueError("the length of embedding_list must be greater than or equal to 1.")
    my_model = MyModel()
    model_output = my_model.build_model(embedding=emb,
                                        dense_feature=batch["dense_feature"],
                                        label=batch["label"],
                                        is_training=is_train,
                                        seed=dense_hashtable_seed)
    return model_output


if __name__ == "__main__":
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    warnings.filterwarnings("ignore")
    clear_saved_model()

    cm.train_steps = int(os.getenv("ZOO_TRAIN_STEPS", "10000"))  # mxrec port: was 10000
    cm.eval_steps = int(os.getenv("ZOO_EVAL_STEPS", "1360"))  # mxrec port: was 1360

    use_dynamic = bool(int(os.getenv("USE_DYNAMIC", 0)))
    logger.info(f"USE_DYNAMIC:{use_dynamic}")
    init(train_steps=cm.train_steps, eval_steps=cm.eval_steps,
         use_dynamic=use_dynamic, use_dynamic_expansion=cm.use_dynamic_expansion)
    IF_LOAD = False
    rank_id = mxrec_util.communication.hccl_ops.get_rank_id()
    filelist = glob(f"./saved-model/sparse-model-0")
    if filelist:
        IF_LOAD = True
    ConfigInitializer.get_instance().if_load = IF_LOAD

    cfg = Config()
    _zoo_sizes(cfg)  # mxrec port
    feature_spec_list_train = None
    feature_spec_list_eval = None
    if cm.use_faae:
        feature_spec_list_train = create_feature_spec_list(cfg, use_timestamp=True)
        feature_spec_list_eval = create_feature_spec_list(cfg, use_timestamp=True)
    else:
        feature_spec_list_train = create_feature_spec_list(cfg, use_timestamp=False)
        feature_spec_list_eval = create_feature_spec_list(cfg, use_timestamp=False)

    train_batch, train_iterator = make_batch_and_iterator(cfg, feature_spec_list_train, is_training=True,
                                                          dump_graph=False, is_use_faae=cm.use_faae)  # mxrec port: dump_graph was True (writes export_graph/)
    eval_batch, eval_iterator = make_batch_and_iterator(cfg, feature_spec_list_eval, is_training=False,
                                                        dump_graph=False, is_use_faae=cm.use_faae)
    logger.info(f"train_batch: {train_batch}")

    if cm.use_faae:
        cfg.dev_vocab_size = cfg.dev_vocab_size // 2

    optimizer_list = [get_dense_and_sparse_optimizer(cfg)]

    # note: variance_scaling_initializer only support HBM mode
    emb_initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=sparse_hashtable_seed) \
        if cfg.cache_mode != "HBM" or cm.use_dynamic_expansion else \
        tf.compat.v1.variance_scaling_initializer(mode="fan_avg", distribution='normal', seed=sparse_hashtable_seed)
    sparse_hashtable = create_table(
        key_dtype=cfg.key_type,
        dim=tf.TensorShape([cfg.emb_dim]),
        name="sparse_embeddings",
        emb_initializer=emb_initializer,
        **cfg.get_emb_table_cfg(),
        **ZOO_TABLE_ARGS,  # mxrec port: ZOO_INIT_BY_ID
    )
    if cm.use_faae:
        tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, train_batch["timestamp"])

    sparse_hashtable_list = [sparse_hashtable, sparse_hashtable] if cm.use_multi_lookup else [sparse_hashtable]
    train_model = model_forward(feature_spec_list_train, sparse_hashtable_list, train_batch,
                                is_train=True, modify_graph=cm.MODIFY_GRAPH_FLAG)
    eval_model = model_forward(feature_spec_list_eval, sparse_hashtable_list, eval_batch,
                               is_train=False, modify_graph=cm.MODIFY_GRAPH_FLAG)

    dense_variables, sparse_variables = get_dense_and_sparse_variable()
    trainable_varibles = []
    trainable_varibles.extend(dense_variables)
    if cm.use_dynamic_expansion:
        trainable_varibles.append(tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)[0])
    else:
        trainable_varibles.extend(sparse_variables)
    rank_size = mxrec_util.communication.hccl_ops.get_rank_size()
    train_ops = []
    # multi task training
    for loss, (dense_optimizer, sparse_optimizer) in zip([train_model.get("loss")], optimizer_list):
        # do dense optimization
        grads = dense_optimizer.compute_gradients(loss, var_list=trainable_varibles)
        # mxrec port: every update waits for every gradient of the step (see
        # step_gradient_ops in zoo_port.py; the original leaves this order to the scheduler)
        with tf.control_dependencies(step_gradient_ops(grads)):
            avg_grads = []
            for grad, var in grads[:-1]:
                if rank_size > 1:
                    grad = hccl_ops.allreduce(grad, "sum") if grad is not None else None
                if grad is not None:
                    avg_grads.append((grad / 8.0, var))
            # apply gradients: update variables
            train_ops.append(dense_optimizer.apply_gradients(avg_grads))

            if cm.use_dynamic_expansion:
                train_address_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
                # do sparse optimization by addr
                sparse_grads = list(grads[-1])  # local_embedding
                grads_and_vars = [(grad, address) for grad, address in zip(sparse_grads, train_address_list)]
                train_ops.append(sparse_optimizer.apply_gradients(grads_and_vars))
            else:
                # do sparse optimization
                sparse_grads = list(grads[-1])
                print("sparse_grads_tensor:", sparse_grads)
                grads_and_vars = [(grad, variable) for grad, variable in zip(sparse_grads, sparse_variables)]
                train_ops.append(sparse_optimizer.apply_gradients(grads_and_vars))

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
    if cm.MODIFY_GRAPH_FLAG:
        modify_graph_and_start_emb_cache(dump_graph=False)  # mxrec port: dump_graph was True
    else:
        start_asc_pipeline()

    hook_list = []
    if cm.use_faae:
        hook_evict = EvictHook(evict_enable=True, evict_time_interval=120)
        hook_list.append(hook_evict)
        if cm.MODIFY_GRAPH_FLAG:  # 该场景添加hook处理校验问题
            hook_list.append(GraphModifierHook(modify_graph=False))

    # Disable dumping data during session: set dump_data=False in sess_config:
    if cm.use_faae:
        sess = tf.compat.v1.train.MonitoredTrainingSession(
            hooks=hook_list,
            config=sess_config(dump_data=False)
        )
        sess.graph._unsafe_unfinalize()
        if not cm.MODIFY_GRAPH_FLAG:
            sess.run(train_iterator.initializer)
        else:
            sess.run(ConfigInitializer.get_instance().train_params_config.get_initializer(True))
    else:
        sess = tf.compat.v1.Session(config=sess_config(dump_data=False))
        sess.run(tf.compat.v1.global_variables_initializer())
        if not cm.MODIFY_GRAPH_FLAG:
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
        test_auc, test_mean_log_loss = evaluate(sess, eval_model, eval_iterator, cfg)  # mxrec port
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
        logger.info(f"training at step:{i * iteration_per_loop}, table[{sparse_hashtable.table_name}], "
                    f"table size:{sparse_hashtable.size()}, table capacity:{sparse_hashtable.capacity()}")
        results["steps"] = i  # mxrec port
        results.setdefault("losses", []).append(float(loss))  # mxrec port

        if i % (cm.train_steps // iteration_per_loop) == 0:
            if cm.interval is not None:
                test_auc, test_mean_log_loss = evaluate_fix(i * iteration_per_loop, sess, eval_model, eval_iterator)
            else:
                test_auc, test_mean_log_loss = evaluate(sess, eval_model, eval_iterator, cfg)
            print("Test auc: {}; log_loss: {} ".format(test_auc, test_mean_log_loss))
            best_auc = max(best_auc, test_auc)
            logger.info(f"training step: {i * iteration_per_loop}, best auc: {best_auc}")
            results["auc"].append(float(test_auc))  # mxrec port

    if not IF_LOAD:  # mxrec port: save what training made (the original builds a Saver and never saves)
        results["saved_step"] = int(sess.run(cfg.global_step))
        model_saver.save(sess, results["saved_step"])
        results["table_size"] = int(sparse_hashtable.size())
    sess.close()

    terminate_config_initializer()
    logger.info("Demo done!")
    if os.getenv("ZOO_RESULT"):  # mxrec port
        import json
        # mxrec port: "{rank}" in ZOO_RESULT is this rank's id (several ranks share a folder)
        with open(os.environ["ZOO_RESULT"].replace("{rank}", str(rank_id)), "w") as out:
            json.dump(results, out)

"""An mx_rec Session script, as an mx_rec user writes it, running on mxrec.

It follows the structure of mx_rec's public `little_demo` (Session mode): two
tables (user, item), the same user feature looked up several times
("multi-lookup"), two label heads, a train mode that evaluates and saves
`./saved-model/model-<rank>-<step>` with `tf.compat.v1.train.Saver`, and a predict
mode that finds the sparse checkpoint folder `./saved-model/sparse-model-<rank>-*`
and restores from it. Only what exists on Ascend NPUs alone is absent (the NPU
session optimizer, the HCCL rank table); every import is mx_rec's path with
`mx_rec` renamed to `mxrec`.

Environment (as mx_rec's run script sets it):
    USE_MODE            train | predict
    CACHE_MODE          HBM | DDR | SSD
    USE_MODIFY_GRAPH    1: graph modifier; 0: FeatureSpec path
    USE_TIMESTAMP       1: timestamps, admission and eviction thresholds, set_threshold
    USE_DYNAMIC_EXPANSION, USE_ONE_SHOT, USE_MULTI_LOOKUP, MULTI_LOOKUP_TIMES, USE_DYNAMIC
    APPLY_GRADIENTS_STRATEGY  direct_apply | sum_same_id_gradients_and_apply

Run from a scratch directory (it writes ./saved-model and ./ssd_data):

    USE_MODE=train CACHE_MODE=DDR PYTHONPATH=/path/to/mxrec python little_demo.py
    USE_MODE=predict CACHE_MODE=DDR PYTHONPATH=/path/to/mxrec python little_demo.py
"""

import glob
import math
import os
import re
import shutil

import numpy as np
import tensorflow as tf

from mxrec.constants.constants import ASCEND_TIMESTAMP, ApplyGradientsStrategy, BaseEnum
from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func
from mxrec.core.asc.manager import start_asc_pipeline
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.graph.modifier import modify_graph_and_start_emb_cache
from mxrec.optimizers.lazy_adam import create_hash_optimizer
from mxrec.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from mxrec.util.communication.hccl_ops import get_rank_size as hccl_rank_size
from mxrec.util.initialize import (
    ConfigInitializer,
    clear_channel,
    get_host_pipeline_ops,
    get_initializer,
    get_rank_id,
    get_rank_size,
    get_use_dynamic_expansion,
    init,
    set_if_load,
    terminate_config_initializer,
)
from mxrec.util.log import logger
from mxrec.util.tf_version_adapter import hccl_ops
from mxrec.util.variable import get_dense_and_sparse_variable

SSD_SAVE_PATH = ["ssd_data"]


class UseMode(BaseEnum):
    TRAIN = "train"
    PREDICT = "predict"


class Config:
    """Sizes of the demo (small: the suite runs it in many modes)."""

    def __init__(self):
        rank_size = hccl_rank_size()
        self.batch_size = 32
        self.user_feat_cnt, self.item_feat_cnt = 4, 6
        self.user_range, self.item_range = 3000 * rank_size, 2000 * rank_size
        self.user_dim, self.item_dim = 8, 4
        self.access_threshold, self.eviction_threshold = 2, 2
        self.user_send_cnt = min(int(self.batch_size * self.user_feat_cnt * 1.1),
                                 math.ceil(self.user_range / rank_size))
        self.item_send_cnt = min(int(self.batch_size * self.item_feat_cnt * 1.1),
                                 math.ceil(self.item_range / rank_size))
        self.learning_rate = 0.01


def data_generator(cfg, batch_number, seed):
    def generate():
        rng = np.random.default_rng(seed)
        for _ in range(batch_number):
            yield {"user_ids": rng.integers(0, cfg.user_range, (cfg.batch_size, cfg.user_feat_cnt)),
                   "item_ids": rng.integers(0, cfg.item_range, (cfg.batch_size, cfg.item_feat_cnt)),
                   "label_0": rng.integers(0, 2, cfg.batch_size).astype(np.float32),
                   "label_1": rng.integers(0, 2, cfg.batch_size).astype(np.float32)}
    return generate


def add_timestamp_func(batch):
    batch["timestamp"] = get_host_pipeline_ops().return_timestamp(
        tf.cast(batch["label_0"], tf.int64))
    return batch


def generate_dataset(cfg, use_timestamp, batch_number, seed):
    dataset = tf.compat.v1.data.Dataset.from_generator(
        data_generator(cfg, batch_number, seed),
        output_types={"user_ids": tf.int64, "item_ids": tf.int64, "label_0": tf.float32,
                      "label_1": tf.float32},
        output_shapes={"user_ids": [cfg.batch_size, cfg.user_feat_cnt],
                       "item_ids": [cfg.batch_size, cfg.item_feat_cnt],
                       "label_0": [cfg.batch_size], "label_1": [cfg.batch_size]})
    if use_timestamp:
        dataset = dataset.map(add_timestamp_func)
    if get_rank_size() > 1:
        dataset = dataset.shard(get_rank_size(), get_rank_id())
    return dataset


class MyModel:
    """An MLP over the summed embeddings with two heads, one loss each."""

    def __init__(self):
        self.loss_list, self.predict_list = [], []

    @staticmethod
    def dense(x, width, name):
        uniform = tf.compat.v1.random_uniform_initializer(-0.1, 0.1)
        w = tf.compat.v1.get_variable(f"{name}_w", [x.shape[-1], width], initializer=uniform)
        b = tf.compat.v1.get_variable(f"{name}_b", [width], initializer=tf.zeros_initializer())
        return tf.matmul(x, w) + b

    def __call__(self, embedding_list, label_0, label_1):
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
            hidden = tf.concat(embedding_list, axis=1)
            for i, width in enumerate([16, 8]):
                hidden = tf.nn.relu(self.dense(hidden, width, f"h{i}"))
            for head, label in enumerate((label_0, label_1)):
                logit = tf.reshape(self.dense(hidden, 1, f"head{head}"), [-1])
                self.predict_list.append(tf.sigmoid(logit))
                self.loss_list.append(tf.reduce_mean(
                    tf.nn.sigmoid_cross_entropy_with_logits(logits=logit, labels=label)))


def create_feature_spec_list(cfg, use_timestamp, multi_lookup_times):
    access = cfg.access_threshold if use_timestamp else None
    evict = cfg.eviction_threshold if use_timestamp else None
    specs = [FeatureSpec("user_ids", table_name="user_table", access_threshold=access,
                         eviction_threshold=evict, faae_coefficient=1),
             FeatureSpec("item_ids", table_name="item_table", access_threshold=access,
                         eviction_threshold=evict, faae_coefficient=4)]
    for _ in range(multi_lookup_times):
        specs.append(FeatureSpec("user_ids", table_name="user_table", access_threshold=access,
                                 eviction_threshold=evict, faae_coefficient=1))
    if use_timestamp:
        specs.append(FeatureSpec("timestamp", is_timestamp=True))
    return specs


class Demo:
    def __init__(self, env):
        self.env = env
        self.cfg = Config()
        self.modify_graph = env["modify_graph"]
        self.use_timestamp = env["use_timestamp"]
        self.one_shot = env["one_shot"]
        self.lookup_times = env["multi_lookup_times"] if env["multi_lookup"] else 0
        self.max_train_steps, self.train_interval, self.eval_steps = 12, 6, 3
        self.saving_interval = 6
        self.session = tf.compat.v1.Session()
        self.train_ops = []

    def make_batch_and_iterator(self, is_training, specs, batch_number):
        dataset = generate_dataset(self.cfg, self.use_timestamp, batch_number,
                                   seed=1 if is_training else 2)
        if not self.modify_graph:
            dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs,
                                                      is_training=is_training))
        dataset = dataset.prefetch(10)
        if self.one_shot:
            iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
        else:
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        return iterator.get_next(), iterator

    def build_graph(self, tables, is_train, specs, access_and_evict, batch_number):
        batch, iterator = self.make_batch_and_iterator(is_train, specs, batch_number)
        user_table, item_table = tables
        if self.modify_graph:
            features = [batch["user_ids"], batch["item_ids"]]
            features += [batch["user_ids"]] * self.lookup_times
            if self.use_timestamp:
                tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, batch["timestamp"])
        else:
            features = [s for s in specs if not s.is_timestamp]
        table_list = [user_table, item_table] + [user_table] * self.lookup_times
        send_counts = ([self.cfg.user_send_cnt, self.cfg.item_send_cnt]
                       + [self.cfg.user_send_cnt] * self.lookup_times)
        is_grads = [True, True] + [False] * self.lookup_times
        embedding_list = []
        for feature, table, send_count, is_grad in zip(features, table_list, send_counts,
                                                       is_grads):
            config = access_and_evict.get(table.table_name) if access_and_evict else None
            embedding = sparse_lookup(
                table, feature, send_count, is_train=is_train, access_and_evict_config=config,
                is_grad=is_grad, name=table.table_name + "_lookup",
                modify_graph=self.modify_graph, batch=batch,
                serving_default_value=tf.ones([table.dim], tf.float32) * 2)
            embedding_list.append(tf.reduce_sum(embedding, axis=1))
        model = MyModel()
        model(embedding_list, batch["label_0"], batch["label_1"])
        return iterator, model

    def set_train_ops(self, model, dense_optimizer, sparse_optimizer):
        dense_variables, sparse_variables = get_dense_and_sparse_variable()
        for loss in model.loss_list:
            grads = dense_optimizer.compute_gradients(loss, var_list=dense_variables)
            averaged = []
            for grad, var in grads:
                if get_rank_size() > 1 and grad is not None:
                    grad = hccl_ops.allreduce(grad, "sum")
                if grad is not None:
                    averaged.append((grad, var))
            self.train_ops.append(dense_optimizer.apply_gradients(averaged))
            if get_use_dynamic_expansion():
                from mxrec.constants.constants import (
                    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
                    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
                    ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS,
                )
                emb_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
                strategy = ApplyGradientsStrategy.mapping(
                    os.getenv("APPLY_GRADIENTS_STRATEGY", "direct_apply"))
                if strategy == ApplyGradientsStrategy.SUM_SAME_ID_GRADIENTS_AND_APPLY:
                    addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)
                else:
                    addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
                local_grads = tf.gradients(loss, emb_list)
                self.train_ops.append(sparse_optimizer.apply_gradients(
                    [(g, a) for g, a in zip(local_grads, addresses)]))
            else:
                sparse_grads = tf.gradients(loss, sparse_variables)
                self.train_ops.append(sparse_optimizer.apply_gradients(
                    list(zip(sparse_grads, sparse_variables))))

    def infer(self, eval_iterator, eval_model):
        if not self.one_shot:
            self.session.run(eval_iterator.initializer if not self.modify_graph
                             else get_initializer(False))
        clear_channel(is_train_channel=False)
        losses = []
        for _ in range(self.eval_steps):
            try:
                losses.append(self.session.run(eval_model.loss_list))
            except tf.errors.OutOfRangeError:
                break
        return losses

    def train(self, tables, train_iterator, train_model, eval_iterator, eval_model):
        if self.modify_graph:
            modify_graph_and_start_emb_cache(dump_graph=False)
        if not self.one_shot:
            self.session.run(train_iterator.initializer if not self.modify_graph
                             else get_initializer(True))
        self.session.run(tf.compat.v1.global_variables_initializer())
        saver = tf.compat.v1.train.Saver()
        rank = get_rank_id()
        step = 0
        for step in range(1, self.max_train_steps + 1):
            try:
                self.session.run([self.train_ops, train_model.loss_list])
            except tf.errors.OutOfRangeError:
                step -= 1
                break
            for table in tables:
                logger.info("step %d table %s size %d capacity %d", step, table.table_name,
                            table.size(), table.capacity())
                assert 0 < table.size() <= table.capacity()
            if step % self.train_interval == 0:
                self.infer(eval_iterator, eval_model)
            if step % self.saving_interval == 0:
                saver.save(self.session, f"./saved-model/model-{rank}", global_step=step)
            if self.use_timestamp and step == self.train_interval // 2:
                threshold = ConfigInitializer.get_instance().host_pipeline_ops.set_threshold(
                    tf.constant(3, tf.int32), emb_name=tables[0].table_name,
                    ids_name=tables[0].table_name + "_lookup")
                self.session.run(threshold)
        if step % self.saving_interval != 0:
            saver.save(self.session, f"./saved-model/model-{rank}", global_step=step)
        return step

    def predict(self, eval_iterator, eval_model):
        rank = get_rank_id()
        found = glob.glob(f"./saved-model/sparse-model-{rank}-*")
        if not found:
            raise ValueError("model file not exist")
        steps = [int(m.group(1)) for m in
                 (re.match(f".*sparse-model-{rank}-([0-9]+).*", f) for f in found) if m]
        saver = tf.compat.v1.train.Saver()
        saver.restore(self.session, f"./saved-model/model-{rank}-{max(steps)}")
        return self.infer(eval_iterator, eval_model)


def read_env():
    return dict(
        use_mode=UseMode.mapping(os.getenv("USE_MODE", "train")),
        use_mpi=bool(int(os.getenv("USE_MPI", "0"))),
        use_dynamic=bool(int(os.getenv("USE_DYNAMIC", "1"))),
        use_dynamic_expansion=bool(int(os.getenv("USE_DYNAMIC_EXPANSION", "0"))),
        multi_lookup=bool(int(os.getenv("USE_MULTI_LOOKUP", "1"))),
        multi_lookup_times=int(os.getenv("MULTI_LOOKUP_TIMES", "2")),
        modify_graph=bool(int(os.getenv("USE_MODIFY_GRAPH", "0"))),
        use_timestamp=bool(int(os.getenv("USE_TIMESTAMP", "0"))),
        one_shot=bool(int(os.getenv("USE_ONE_SHOT", "0"))),
        cache_mode=os.getenv("CACHE_MODE", "HBM"))


def clear_saved_model(env):
    if env["use_mode"] == UseMode.TRAIN:
        shutil.rmtree("saved-model", ignore_errors=True)
        if env["cache_mode"] == "SSD":
            for path in SSD_SAVE_PATH:
                shutil.rmtree(path, ignore_errors=True)
                os.makedirs(path, exist_ok=True)


def main():
    """Runs the demo in the mode the environment asks for; returns the eval losses."""
    tf.compat.v1.disable_eager_execution()
    env = read_env()
    clear_saved_model(env)
    init(use_mpi=env["use_mpi"], train_steps=6, eval_steps=3, save_steps=6,
         use_dynamic=env["use_dynamic"], use_dynamic_expansion=env["use_dynamic_expansion"])
    try:
        set_if_load(bool(glob.glob(f"./saved-model/sparse-model-{get_rank_id()}-*")))
        demo = Demo(env)
        cfg = demo.cfg
        access_and_evict = None
        if env["use_timestamp"]:
            access_and_evict = {
                "user_table": dict(access_threshold=cfg.access_threshold,
                                   eviction_threshold=cfg.eviction_threshold, faae_coefficient=1),
                "item_table": dict(access_threshold=cfg.access_threshold,
                                   eviction_threshold=cfg.eviction_threshold, faae_coefficient=4)}
        lookup_times = demo.lookup_times
        train_specs = eval_specs = None
        if not demo.modify_graph:
            train_specs = create_feature_spec_list(cfg, env["use_timestamp"], lookup_times)
            eval_specs = create_feature_spec_list(cfg, env["use_timestamp"], lookup_times)
        if get_use_dynamic_expansion():
            sparse_optimizer = create_hash_optimizer_by_address(learning_rate=cfg.learning_rate)
        else:
            sparse_optimizer = create_hash_optimizer(learning_rate=cfg.learning_rate)
        dense_optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=cfg.learning_rate)
        cache_modes = {
            "HBM": {"device_vocabulary_size": 10000, "host_vocabulary_size": 0},
            "DDR": {"device_vocabulary_size": 1200, "host_vocabulary_size": 10000},
            "SSD": {"device_vocabulary_size": 1200, "host_vocabulary_size": 1500,
                    "ssd_vocabulary_size": 10000, "ssd_data_path": SSD_SAVE_PATH},
        }
        if env["cache_mode"] not in cache_modes:
            raise ValueError(f"cache mode must be in {list(cache_modes)}")
        user_table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([cfg.user_dim]),
                                  name="user_table",
                                  emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                  optimizer_list=[sparse_optimizer],
                                  all2all_gradients_op="sum_gradients_and_div_by_ranksize",
                                  **cache_modes[env["cache_mode"]])
        item_table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([cfg.item_dim]),
                                  name="item_table",
                                  emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                  optimizer_list=[sparse_optimizer],
                                  **cache_modes[env["cache_mode"]])
        tables = [user_table, item_table]
        train_iterator = train_model = None
        if env["use_mode"] == UseMode.TRAIN:
            train_iterator, train_model = demo.build_graph(
                tables, True, train_specs, access_and_evict, demo.max_train_steps)
        eval_iterator, eval_model = demo.build_graph(tables, False, eval_specs, access_and_evict,
                                                     demo.eval_steps)
        if not demo.modify_graph:
            start_asc_pipeline()
        if demo.modify_graph and env["use_mode"] != UseMode.TRAIN:
            modify_graph_and_start_emb_cache(dump_graph=False)
        if env["use_mode"] == UseMode.TRAIN:
            demo.set_train_ops(train_model, dense_optimizer, sparse_optimizer)
            demo.train(tables, train_iterator, train_model, eval_iterator, eval_model)
            result = demo.infer(eval_iterator, eval_model)
        else:
            result = demo.predict(eval_iterator, eval_model)
        demo.session.close()
        logger.info("Demo done!")
        return result
    finally:
        terminate_config_initializer()


if __name__ == "__main__":
    main()

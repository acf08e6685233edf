"""An mx_rec Estimator script, as an mx_rec user writes it, running on mxrec (TF 2.15).

It follows the structure of mx_rec's public `little_demo_estimator`: tables
created in `model_fn` (each mode's graph), `GraphModifierHook(modify_graph=...)`
in every mode, FeatureSpec lists kept by the input function for `model_fn`,
`EvictHook` with timestamps, a train op that steps the global step itself, and
run modes train, train_and_evaluate and predict. NPURunConfig / NPUEstimator /
npu_hooks_append become tf.estimator's RunConfig / Estimator / the hook list, and
the rest keeps mx_rec's import paths with `mx_rec` renamed to `mxrec`
(`npu_ops.dropout` included).

Environment: RUN_MODE (train | train_and_evaluate | predict), CACHE_MODE (HBM |
DDR | SSD; SSD without ssd_data_path, as mx_rec's demo), USE_MODIFY_GRAPH,
USE_TIMESTAMP, USE_DYNAMIC_EXPANSION, USE_ONE_SHOT, USE_MULTI_LOOKUP,
MULTI_LOOKUP_TIMES, ENABLE_PUSH_OPS_TEST, PREFETCH_BATCH_NUMBER, MODEL_DIR.
"""

import os
from functools import partial

import numpy as np
import tensorflow as tf

from mxrec.constants.constants import ASCEND_TIMESTAMP, CacheModeEnum
from mxrec.core.asc.helper import FeatureSpec, get_asc_insert_func
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.core.feature_process import EvictHook
from mxrec.graph.acg_push_ops import ACGPushOpsToDatasetHook
from mxrec.graph.modifier import GraphModifierHook
from mxrec.optimizers.gradient_descent import create_hash_optimizer
from mxrec.optimizers.gradient_descent_by_addr import create_hash_optimizer_by_addr
from mxrec.util.initialize import (
    ConfigInitializer,
    clear_channel,
    get_host_pipeline_ops,
    get_rank_id,
    get_rank_size,
    get_use_dynamic_expansion,
    init,
    terminate_config_initializer,
)
from mxrec.util.log import logger
from mxrec.util.tf_version_adapter import hccl_ops, npu_ops
from mxrec.util.variable import get_dense_and_sparse_variable


class Config:
    batch_size = 32
    user_feat_cnt, item_feat_cnt = 4, 6
    user_range, item_range = 3000, 2000
    user_dim, item_dim = 8, 4
    user_vocab_size = 4000
    access_threshold, eviction_threshold = 2, 2
    user_send_cnt, item_send_cnt = 141, 212
    learning_rate = 0.01


class FeatureSpecIns:
    """The FeatureSpec lists input_fn made, for model_fn (mx_rec's demo keeps one too)."""

    train, eval = None, None


def create_feature_spec_list(cfg, use_timestamp, multi_lookup_times):
    access = cfg.access_threshold if use_timestamp else None
    evict = cfg.eviction_threshold if use_timestamp else None
    specs = [FeatureSpec("user_ids", table_name="user_table", access_threshold=access,
                         eviction_threshold=evict),
             FeatureSpec("item_ids", table_name="item_table", access_threshold=access,
                         eviction_threshold=evict)]
    specs += [FeatureSpec("user_ids", table_name="user_table", access_threshold=access,
                          eviction_threshold=evict, faae_coefficient=1)
              for _ in range(multi_lookup_times)]
    if use_timestamp:
        specs.append(FeatureSpec("timestamp", is_timestamp=True))
    return specs


def generate_dataset(cfg, use_timestamp, batch_number, seed):
    def generate():
        rng = np.random.default_rng(seed)
        for _ in range(batch_number):
            yield {"user_ids": rng.integers(0, cfg.user_range, (cfg.batch_size, cfg.user_feat_cnt)),
                   "item_ids": rng.integers(0, cfg.item_range, (cfg.batch_size, cfg.item_feat_cnt)),
                   "label_0": rng.integers(0, 2, cfg.batch_size).astype(np.float32),
                   "label_1": rng.integers(0, 2, cfg.batch_size).astype(np.float32)}

    dataset = tf.compat.v1.data.Dataset.from_generator(
        generate, output_types={"user_ids": tf.int64, "item_ids": tf.int64,
                                "label_0": tf.float32, "label_1": tf.float32},
        output_shapes={"user_ids": [cfg.batch_size, cfg.user_feat_cnt],
                       "item_ids": [cfg.batch_size, cfg.item_feat_cnt],
                       "label_0": [cfg.batch_size], "label_1": [cfg.batch_size]})
    if use_timestamp:
        def add_timestamp(batch):
            batch["timestamp"] = get_host_pipeline_ops().return_timestamp(
                tf.cast(batch["label_0"], tf.int64))
            return batch

        dataset = dataset.map(add_timestamp)
    return dataset


def input_fn(params, cfg, is_eval=False):
    dataset = generate_dataset(cfg, params["use_timestamp"],
                               params["eval_steps"] if is_eval else params["max_steps"],
                               seed=2 if is_eval else 1)
    if not params["modify_graph"]:
        specs = create_feature_spec_list(cfg, params["use_timestamp"], params["lookup_times"])
        if is_eval:
            FeatureSpecIns.eval = specs
            dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=False))
            clear_channel(is_train_channel=False)
        else:
            FeatureSpecIns.train = specs
            dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
    dataset = dataset.prefetch(10)
    if not params["use_one_shot"]:
        return dataset
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


class LittleModel:
    def __init__(self, params, cfg, mode, features):
        self.params, self.cfg, self.features = params, cfg, features
        self.is_train = mode == tf.estimator.ModeKeys.TRAIN

    def _dense(self, x, width, name):
        uniform = tf.compat.v1.random_uniform_initializer(-0.1, 0.1)
        w = tf.compat.v1.get_variable(f"{name}_w", [x.shape[-1], width], initializer=uniform)
        b = tf.compat.v1.get_variable(f"{name}_b", [width], initializer=tf.zeros_initializer())
        if self.is_train:
            x = npu_ops.dropout(x, keep_prob=1.0)
        return tf.matmul(x, w) + b

    def inference(self, label_0, label_1):
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
            hidden = tf.concat(self._embedding_list(), axis=1)
            hidden = tf.nn.relu(self._dense(hidden, 16, "h1"))
            losses, predictions = [], []
            for head, label in enumerate((label_0, label_1)):
                logit = tf.reshape(self._dense(hidden, 1, f"head{head}"), [-1])
                predictions.append(tf.sigmoid(logit))
                losses.append(tf.nn.sigmoid_cross_entropy_with_logits(logits=logit, labels=label))
            return tf.reduce_mean(losses), predictions

    def _embedding_list(self):
        cfg, params = self.cfg, self.params
        cache_modes = {
            CacheModeEnum.HBM.value: {"device_vocabulary_size": cfg.user_vocab_size,
                                      "host_vocabulary_size": 0},
            CacheModeEnum.DDR.value: {"device_vocabulary_size": int(cfg.user_vocab_size * 0.4),
                                      "host_vocabulary_size": cfg.user_vocab_size},
            CacheModeEnum.SSD.value: {"device_vocabulary_size": int(cfg.user_vocab_size * 0.4),
                                      "host_vocabulary_size": int(cfg.user_vocab_size * 0.3),
                                      "ssd_vocabulary_size": int(cfg.user_vocab_size * 1.8)},
        }
        cache_mode = os.getenv("CACHE_MODE", "HBM")
        if not ConfigInitializer.get_instance().use_dynamic and cache_mode != "HBM":
            logger.warning("with DDR or SSD, use_dynamic=True avoids tuning sizes")
        user_table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([cfg.user_dim]),
                                  name="user_table",
                                  emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                  is_dp=params["use_dp"], **cache_modes[cache_mode])
        item_table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([cfg.item_dim]),
                                  name="item_table",
                                  emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                                  **cache_modes[cache_mode])
        times = params["lookup_times"]
        if params["modify_graph"]:
            features = [self.features["user_ids"], self.features["item_ids"]]
            features += [self.features["user_ids"]] * times
            if params["use_timestamp"]:
                tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, self.features["timestamp"])
        else:
            specs = FeatureSpecIns.train if self.is_train else FeatureSpecIns.eval
            features = [s for s in specs if not s.is_timestamp]
        tables = [user_table, item_table] + [user_table] * times
        send_counts = [cfg.user_send_cnt, cfg.item_send_cnt] + [cfg.user_send_cnt] * times
        is_grads = [True, True] + [False] * times
        access_and_evict = params["access_and_evict"]
        embeddings = []
        for feature, table, send_count, is_grad in zip(features, tables, send_counts, is_grads):
            config = access_and_evict.get(table.table_name) if access_and_evict else None
            embedding = sparse_lookup(table, feature, send_count, dim=None, is_train=self.is_train,
                                      is_grad=is_grad, name=table.table_name + "_lookup",
                                      modify_graph=params["modify_graph"],
                                      access_and_evict_config=config, batch=self.features)
            embeddings.append(tf.reduce_sum(embedding, axis=1))
        return embeddings


def get_train_op(loss, learning_rate):
    dense_optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=learning_rate)
    if get_use_dynamic_expansion():
        sparse_optimizer = create_hash_optimizer_by_addr(learning_rate=learning_rate)
    else:
        sparse_optimizer = create_hash_optimizer(learning_rate=learning_rate)
    dense_variables, sparse_variables = get_dense_and_sparse_variable()
    train_ops = []
    grads = dense_optimizer.compute_gradients(loss, var_list=dense_variables)
    averaged = []
    for grad, var in grads:
        if get_rank_size() > 1 and grad is not None:
            grad = hccl_ops.allreduce(grad, "sum")
        if grad is not None:
            averaged.append((grad, var))
    train_ops.append(dense_optimizer.apply_gradients(averaged, name="dense_optimizer"))
    if get_use_dynamic_expansion():
        from mxrec.constants.constants import (
            ASCEND_SPARSE_LOOKUP_ID_OFFSET,
            ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
        )
        emb_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        local_grads = tf.gradients(loss, emb_list)
        train_ops.append(sparse_optimizer.apply_gradients(
            list(zip(local_grads, addresses)), name="hashtable_optimizer"))
    else:
        sparse_grads = tf.gradients(loss, sparse_variables)
        train_ops.append(sparse_optimizer.apply_gradients(
            list(zip(sparse_grads, sparse_variables)), name="sparse_optimizer"))
    train_ops.append(tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1))
    return tf.group(*train_ops)


def get_model_fn(cfg):
    def model_fn(features, labels, mode, params):
        del labels
        model = LittleModel(params, cfg, mode, features)
        loss, prediction = model.inference(features["label_0"], features["label_1"])
        log = partial(lambda tensors, mode: f"{mode} loss: {tensors['loss']:.6f}", mode=mode)
        hook = tf.compat.v1.train.LoggingTensorHook({"loss": loss}, every_n_iter=1,
                                                    formatter=log)
        if mode == tf.estimator.ModeKeys.TRAIN:
            return tf.estimator.EstimatorSpec(mode=mode, loss=loss,
                                              train_op=get_train_op(loss, cfg.learning_rate),
                                              training_hooks=[hook])
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode=mode, loss=loss, evaluation_hooks=[hook])
        outputs = {"task_1": prediction[0], "task_2": prediction[1],
                   "label": features["label_0"]}
        return tf.estimator.EstimatorSpec(
            mode=mode, predictions=outputs,
            export_outputs={"predictor": tf.estimator.export.PredictOutput(outputs)})

    return model_fn


def read_params():
    use_timestamp = bool(int(os.getenv("USE_TIMESTAMP", "0")))
    multi_lookup = bool(int(os.getenv("USE_MULTI_LOOKUP", "1")))
    cfg = Config()
    access_and_evict = None
    if use_timestamp:
        config = dict(access_threshold=cfg.access_threshold,
                      eviction_threshold=cfg.eviction_threshold)
        access_and_evict = dict(user_table=config, item_table=dict(config))
    return cfg, dict(
        run_mode=os.getenv("RUN_MODE", "train_and_evaluate"),
        model_dir=os.getenv("MODEL_DIR", "model_ckpt") + f"_rank{0}",
        modify_graph=bool(int(os.getenv("USE_MODIFY_GRAPH", "0"))),
        use_timestamp=use_timestamp, access_and_evict=access_and_evict,
        lookup_times=int(os.getenv("MULTI_LOOKUP_TIMES", "2")) if multi_lookup else 0,
        use_one_shot=bool(int(os.getenv("USE_ONE_SHOT", "0"))),
        push_ops=bool(int(os.getenv("ENABLE_PUSH_OPS_TEST", "0"))),
        use_dp=False, max_steps=12, train_steps=6, eval_steps=3)


def main():
    """Runs the RUN_MODE; returns the last evaluation metrics (train_and_evaluate) or the
    predictions (predict)."""
    tf.compat.v1.disable_eager_execution()
    cfg, params = read_params()
    init(use_mpi=False, train_steps=params["train_steps"], eval_steps=params["eval_steps"],
         prefetch_batch_number=int(os.getenv("PREFETCH_BATCH_NUMBER", "1")),
         use_dynamic_expansion=bool(int(os.getenv("USE_DYNAMIC_EXPANSION", "0"))))
    try:
        params["model_dir"] = os.getenv("MODEL_DIR", "model_ckpt") + f"_rank{get_rank_id()}"

        def hooks():
            listed = [GraphModifierHook(modify_graph=params["modify_graph"])]
            if params["push_ops"]:
                listed.insert(0, ACGPushOpsToDatasetHook(dump_graph=False))
            return listed

        train_hooks = hooks()
        if params["use_timestamp"]:
            train_hooks.append(EvictHook(evict_enable=True, evict_time_interval=10))
        run_config = tf.estimator.RunConfig(model_dir=params["model_dir"],
                                            save_checkpoints_steps=params["train_steps"],
                                            keep_checkpoint_max=5, log_step_count_steps=None)
        est = tf.estimator.Estimator(model_fn=get_model_fn(cfg), params=params,
                                     model_dir=params["model_dir"], config=run_config)
        if params["run_mode"] == "train":
            est.train(input_fn=lambda: input_fn(params, cfg), max_steps=params["max_steps"],
                      hooks=train_hooks)
            return None
        if params["run_mode"] == "train_and_evaluate":
            train_spec = tf.estimator.TrainSpec(input_fn=lambda: input_fn(params, cfg),
                                                max_steps=params["max_steps"], hooks=train_hooks)
            eval_spec = tf.estimator.EvalSpec(input_fn=lambda: input_fn(params, cfg, True),
                                              steps=params["eval_steps"], hooks=hooks(),
                                              throttle_secs=0, start_delay_secs=0)
            metrics, _ = tf.estimator.train_and_evaluate(est, train_spec, eval_spec)
            return metrics
        results = est.predict(input_fn=lambda: input_fn(params, cfg, True), hooks=hooks(),
                              yield_single_examples=False)
        return [(r["task_1"], r["task_2"], r["label"]) for r in results]
    finally:
        terminate_config_initializer()
        logger.info("Demo done!")


if __name__ == "__main__":
    main()

"""mx_rec's little_demo structure on 1, 2 or 4 ranks: train, then predict through the same
Session, the same results on any rank count.

As mx_rec's `little_demo` (`main.py`, `run_mode.py`) writes it: a plain
`tf.compat.v1.Session(config=sess_config())`, only `global_variables_initializer()`, the
dense gradients all-reduced by `hccl_ops.allreduce`, each rank's dataset `shard`ed by
rank, two tables (the user table looked up twice, mx_rec's multi-lookup), the graph
modifier (USE_MODIFY_GRAPH=1: `sparse_lookup(..., modify_graph=True)`,
`modify_graph_and_start_emb_cache()`, `get_initializer`) or the FeatureSpec path
(USE_MODIFY_GRAPH=0: `get_asc_insert_func`, `sparse_lookup(table, spec, batch=...)`,
`start_asc_pipeline()`), timestamps with admission thresholds. What differs from
mx_rec's demo is chosen so that N ranks train what one process trains on the global
batch: the stream is one global stream whose samples `shard` deals out (rank r gets
samples r, r + N, ...), the dense gradients are averaged (the all-reduced sum divided by
N; the sparse ones by `all2all_gradients_op="sum_gradients_and_div_by_ranksize"`), the
initial rows are constants (a random row would depend on which rank plans it first), the
optimizers are Adagrad, and the item table is replicated on every rank (`is_dp=True`)
while the user table is sharded.

Start it as mx_rec's users do, from a scratch directory:

    USE_MODIFY_GRAPH=1 python examples/mx_rec_style/little_demo_ranks.py
    USE_MPI=1 USE_MODIFY_GRAPH=0 python -m mxrec.launch -n 2 \\
        examples/mx_rec_style/little_demo_ranks.py

Environment: USE_MODIFY_GRAPH (1: graph modifier, 0: FeatureSpec path), USE_MPI (started
by a launcher), DEMO_OUT (a folder: each rank writes rank-<r>.npz there, its predictions,
tables and dense weights; tests/compat/test_mx_rec_ranks_script.py compares them).
"""

import os

import numpy as np
import tensorflow as tf

from mxrec.constants.constants import ASCEND_TIMESTAMP
from mxrec.core.asc.feature_spec import FeatureSpec
from mxrec.core.asc.helper import get_asc_insert_func
from mxrec.core.asc.manager import start_asc_pipeline
from mxrec.core.embedding import create_table, sparse_lookup
from mxrec.graph.modifier import modify_graph_and_start_emb_cache
from mxrec.optimizers.adagrad import create_hash_optimizer
from mxrec.util.initialize import (
    get_initializer,
    get_rank_id,
    get_rank_size,
    init,
    terminate_config_initializer,
)
from mxrec.util.log import logger
from mxrec.util.tf_version_adapter import hccl_ops
from mxrec.util.variable import get_dense_and_sparse_variable

GLOBAL_BATCH = 32  # samples per global batch: 32 / N per rank
TRAIN_BATCHES, EVAL_BATCHES, EVAL_AT = 10, 3, 5
USER_FEATURES, ITEM_FEATURES = 4, 3
USER_DIM, ITEM_DIM = 8, 4
ACCESS_THRESHOLD = 2


class Config:
    def __init__(self):
        self.rank_size = get_rank_size()
        if GLOBAL_BATCH % self.rank_size:
            raise ValueError(f"{self.rank_size} ranks must divide the global batch "
                             f"{GLOBAL_BATCH}")
        self.batch_size = GLOBAL_BATCH // self.rank_size
        self.learning_rate = 0.1


def sess_config():
    """mx_rec's sess_config() without the NPU's optimizer options."""
    return tf.compat.v1.ConfigProto(allow_soft_placement=True, log_device_placement=False)


def samples(batches: int, seed: int):
    """The global stream, sample by sample: user and item IDs (power law), two labels,
    the batch's time."""
    rng = np.random.default_rng(seed)
    count = batches * GLOBAL_BATCH

    def ids(pool, width):
        weights = 1.0 / np.arange(1, pool + 1) ** 1.2
        keys = rng.integers(0, 2**40, size=pool)
        return keys[rng.choice(pool, size=(count, width), p=weights / weights.sum())]

    return {"user_ids": ids(300, USER_FEATURES), "item_ids": ids(200, ITEM_FEATURES),
            "label_0": (rng.random(count) < 0.3).astype(np.float32),
            "label_1": (rng.random(count) < 0.6).astype(np.float32),
            "timestamp": np.repeat(np.arange(batches, dtype=np.int64) * 10, GLOBAL_BATCH)}


def generate_dataset(cfg, batches, seed):
    dataset = tf.data.Dataset.from_tensor_slices(samples(batches, seed))
    if get_rank_size() > 1:  # mx_rec's demo shards its dataset by rank
        dataset = dataset.shard(get_rank_size(), get_rank_id())
    return dataset.batch(cfg.batch_size, drop_remainder=True)


def create_feature_spec_list(is_training):
    specs = [FeatureSpec("user_ids", table_name="user_table",
                         access_threshold=ACCESS_THRESHOLD if is_training else None),
             FeatureSpec("item_ids", table_name="item_table",
                         access_threshold=ACCESS_THRESHOLD if is_training else None),
             FeatureSpec("user_ids", table_name="user_table")]  # multi-lookup
    return specs + [FeatureSpec("timestamp", is_timestamp=True)]


class MyModel:
    """An MLP over the summed embeddings with two heads, one loss each."""

    def __init__(self):
        self.loss_list, self.predict_list = [], []

    @staticmethod
    def dense(x, width, name, seed):
        uniform = tf.compat.v1.random_uniform_initializer(-0.3, 0.3, seed=seed)
        w = tf.compat.v1.get_variable(f"{name}_w", [x.shape[-1], width], initializer=uniform)
        b = tf.compat.v1.get_variable(f"{name}_b", [width], initializer=tf.zeros_initializer())
        return tf.matmul(x, w) + b

    def __call__(self, embedding_list, label_0, label_1):
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
            hidden = tf.nn.relu(self.dense(tf.concat(embedding_list, axis=1), 8, "h0", 1))
            for head, label in enumerate((label_0, label_1)):
                logit = tf.reshape(self.dense(hidden, 1, f"head{head}", 2 + head), [-1])
                self.predict_list.append(tf.sigmoid(logit))
                self.loss_list.append(tf.reduce_mean(
                    tf.nn.sigmoid_cross_entropy_with_logits(logits=logit, labels=label)))


class Demo:
    def __init__(self, modify_graph):
        self.cfg = Config()
        self.modify_graph = modify_graph
        self.session = tf.compat.v1.Session(config=sess_config())
        self.train_ops = []

    def make_batch_and_iterator(self, is_training, specs, batches):
        dataset = generate_dataset(self.cfg, batches, seed=1 if is_training else 2)
        if not self.modify_graph:
            dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs,
                                                      is_training=is_training))
        dataset = dataset.prefetch(10)
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        return iterator.get_next(), iterator

    def build_graph(self, tables, is_train, batches):
        specs = create_feature_spec_list(is_train)
        batch, iterator = self.make_batch_and_iterator(is_train, specs, batches)
        user_table, item_table = tables
        if self.modify_graph:
            features = [batch["user_ids"], batch["item_ids"], batch["user_ids"]]
            if is_train:
                tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, batch["timestamp"])
        else:
            features = [s for s in specs if not s.is_timestamp]
        embedding_list = []
        for feature, table, is_grad in zip(features, [user_table, item_table, user_table],
                                           [True, True, False]):
            config = None
            if self.modify_graph and is_train:
                config = dict(access_threshold=ACCESS_THRESHOLD, faae_coefficient=1)
            embedding = sparse_lookup(
                table, feature, is_train=is_train, access_and_evict_config=config,
                is_grad=is_grad, name=table.table_name + "_lookup",
                modify_graph=self.modify_graph, batch=batch)
            embedding_list.append(tf.reduce_sum(embedding, axis=1))
        model = MyModel()
        model(embedding_list, batch["label_0"], batch["label_1"])
        return iterator, model

    def set_train_ops(self, model, dense_optimizer, sparse_optimizer):
        dense_variables, sparse_variables = get_dense_and_sparse_variable()
        loss = tf.add_n(model.loss_list)
        averaged = []
        for grad, var in dense_optimizer.compute_gradients(loss, var_list=dense_variables):
            if grad is not None:
                if get_rank_size() > 1:
                    grad = hccl_ops.allreduce(grad, "sum") / get_rank_size()
                averaged.append((grad, var))
        self.train_ops.append(dense_optimizer.apply_gradients(averaged))
        sparse_grads = tf.gradients(loss, sparse_variables)
        self.train_ops.append(sparse_optimizer.apply_gradients(
            list(zip(sparse_grads, sparse_variables))))

    def infer(self, eval_iterator, eval_model):
        """The predictions of the whole evaluation stream, until OutOfRangeError."""
        self.session.run(get_initializer(False) if self.modify_graph
                         else eval_iterator.initializer)
        predictions = []
        while True:
            try:
                predictions.append(self.session.run(eval_model.predict_list))
            except tf.errors.OutOfRangeError:
                return np.asarray(predictions, np.float32)

    def train(self, train_iterator, train_model, eval_iterator, eval_model):
        if self.modify_graph:
            modify_graph_and_start_emb_cache(dump_graph=False)
        self.session.run(tf.compat.v1.global_variables_initializer())
        self.session.run(get_initializer(True) if self.modify_graph
                         else train_iterator.initializer)
        losses, midway, step = [], None, 0
        while True:
            try:
                _, loss = self.session.run([self.train_ops, train_model.loss_list])
            except tf.errors.OutOfRangeError:
                break
            step += 1
            losses.append(loss)
            if step == EVAL_AT:
                midway = self.infer(eval_iterator, eval_model)
        logger.info("rank %d trained %d steps", get_rank_id(), step)
        return np.asarray(losses, np.float32), midway


def table_contents(session, table):
    ids, rows = table.export_rows()
    values = session.run(table.variable)[rows] if len(rows) else np.zeros((0, table.dim))
    order = np.argsort(ids)
    return np.asarray(ids)[order], np.asarray(values)[order]


def main():
    """Trains, then predicts through the same Session; returns what DEMO_OUT gets."""
    tf.compat.v1.disable_eager_execution()
    modify_graph = bool(int(os.getenv("USE_MODIFY_GRAPH", "0")))
    init(use_mpi=bool(int(os.getenv("USE_MPI", "0"))))
    try:
        tf.compat.v1.set_random_seed(7)
        demo = Demo(modify_graph)
        sparse_optimizer = create_hash_optimizer(learning_rate=demo.cfg.learning_rate)
        dense_optimizer = tf.compat.v1.train.AdagradOptimizer(demo.cfg.learning_rate)
        user_table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([USER_DIM]),
                                  name="user_table",
                                  emb_initializer=tf.compat.v1.constant_initializer(0.05),
                                  device_vocabulary_size=1000, optimizer_list=[sparse_optimizer],
                                  all2all_gradients_op="sum_gradients_and_div_by_ranksize")
        item_table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([ITEM_DIM]),
                                  name="item_table",
                                  emb_initializer=tf.compat.v1.constant_initializer(-0.03),
                                  device_vocabulary_size=1000, optimizer_list=[sparse_optimizer],
                                  all2all_gradients_op="sum_gradients_and_div_by_ranksize",
                                  is_dp=True)
        tables = [user_table, item_table]
        train_iterator, train_model = demo.build_graph(tables, True, TRAIN_BATCHES)
        eval_iterator, eval_model = demo.build_graph(tables, False, EVAL_BATCHES)
        if not modify_graph:
            start_asc_pipeline()
        demo.set_train_ops(train_model, dense_optimizer, sparse_optimizer)
        losses, midway = demo.train(train_iterator, train_model, eval_iterator, eval_model)
        predictions = demo.infer(eval_iterator, eval_model)  # predict after training
        result = dict(losses=losses, midway=midway, predictions=predictions,
                      rank=np.array(get_rank_id()))
        for table in tables:
            result[f"{table.table_name}_ids"], result[f"{table.table_name}_values"] = \
                table_contents(demo.session, table)
        dense, _ = get_dense_and_sparse_variable()
        for variable in dense:
            result["dense/" + variable.op.name] = demo.session.run(variable)
        demo.session.close()
        return result
    finally:
        terminate_config_initializer()


if __name__ == "__main__":
    outputs = main()
    if os.getenv("DEMO_OUT"):
        os.makedirs(os.environ["DEMO_OUT"], exist_ok=True)
        np.savez(os.path.join(os.environ["DEMO_OUT"], f"rank-{int(outputs['rank'])}.npz"),
                 **outputs)

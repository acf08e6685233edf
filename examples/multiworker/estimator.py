"""tf.estimator on several ranks (TensorFlow 2.15): the same model_fn and input_fn on 1 or N.

    python examples/multiworker/estimator.py --model_dir /tmp/m
    python -m mxrec.launch -n 2 examples/multiworker/estimator.py --model_dir /tmp/m

`communication.run_config(model_dir, ...)` gives each rank a RunConfig with its server as
master, its session config, and its own checkpoint directory (rank 0: model_dir, rank R:
model_dir/rank-R); every rank is its own chief and saves by steps (the save of a sharded
table is collective). The data and model are those of train.py: each rank trains on its
slice of every global batch, dense gradients summed by allreduce and divided by N.

Each `--calls` train() call runs `--steps_per_call` steps and ends with a checkpoint; the
next call restores it (Estimator builds a new graph per call). With --out FILE rank 0 writes
the final checkpoint's table (IDs, embeddings) and dense weights there.
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train import make_data  # noqa: E402  (examples/multiworker/train.py)

from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup  # noqa: E402
from mxrec.core.feature_process import EvictHook  # noqa: E402
from mxrec.distributed.communication import (  # noqa: E402
    allreduce,
    get_rank_id,
    get_rank_size,
    run_config,
)
from mxrec.graph.modifier import GraphModifierHook  # noqa: E402
from mxrec.optimizers import adagrad  # noqa: E402
from mxrec.util.initialize import init, terminate_config_initializer  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

_v1 = tf.compat.v1


def model_fn(features, labels, mode, params):
    del mode
    size = get_rank_size()
    table = create_table(tf.int64, params["dim"], "emb", _v1.constant_initializer(0.05),
                         device_vocabulary_size=params["capacity"],
                         all2all_gradients_op="sum_gradients_and_div_by_ranksize")
    config = dict(access_threshold=2)
    if params["eviction"] is not None:
        config["eviction_threshold"] = params["eviction"]
    ids, stamp = features
    add_timestamp(stamp)
    emb = sparse_lookup(table, ids, access_and_evict_config=config, name="lookup",
                        modify_graph=params["modify_graph"])
    weights = _v1.get_variable("w", [params["dim"], 1],
                               initializer=_v1.glorot_uniform_initializer(seed=1))
    logits = tf.matmul(tf.reduce_sum(emb, 1), weights)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels[:, None], logits=logits))
    dense, sparse = get_dense_and_sparse_variable()
    dense_grads = [allreduce(g, "sum") / size for g in tf.gradients(loss, dense)]
    global_step = _v1.train.get_or_create_global_step()
    train_op = tf.group(
        _v1.train.GradientDescentOptimizer(0.2).apply_gradients(zip(dense_grads, dense),
                                                                 global_step=global_step),
        adagrad.create_hash_optimizer(0.2).apply_gradients(
            zip(tf.gradients(loss, sparse), sparse)))
    return tf.estimator.EstimatorSpec(tf.estimator.ModeKeys.TRAIN, loss=loss, train_op=train_op)


def input_fn(args, first_step: int):
    rank, size = get_rank_id(), get_rank_size()
    ids, labels, times = make_data(args.steps_per_call * args.calls, args.batch,
                                   args.features, pool=args.pool)
    take = np.concatenate([np.arange(s * args.batch, (s + 1) * args.batch)[rank::size]
                           for s in range(args.steps_per_call * args.calls)])
    dataset = tf.data.Dataset.from_tensor_slices(((ids[take], times[take]), labels[take]))
    return dataset.batch(args.batch // size).skip(first_step)


def _step_of(checkpoint) -> int:
    return 0 if checkpoint is None else int(checkpoint.rsplit("-", 1)[1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--calls", type=int, default=2, help="train() calls")
    parser.add_argument("--steps_per_call", type=int, default=6)
    parser.add_argument("--save_steps", type=int, default=3, help="save_checkpoints_steps")
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--pool", type=int, default=400)
    parser.add_argument("--capacity", type=int, default=512)
    parser.add_argument("--save_secs", type=int, default=None,
                        help="save_checkpoints_secs (refused on several ranks: tests)")
    parser.add_argument("--modify_graph", action="store_true",
                        help="lookups through the graph modifier (GraphModifierHook)")
    parser.add_argument("--prefetch", type=int, default=0, help="prefetch_batch_number")
    parser.add_argument("--eviction", type=int, default=None,
                        help="eviction_threshold (s of batch time; batches are 10 s apart)")
    parser.add_argument("--evict_every", type=int, default=None,
                        help="EvictHook(evict_step_interval=...)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not hasattr(tf, "estimator"):
        raise SystemExit("tf.estimator is not available in this TensorFlow; use 2.15")
    init(use_mpi="MXREC_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ,
         prefetch_batch_number=args.prefetch)
    timing = (dict(save_checkpoints_secs=args.save_secs) if args.save_secs
              else dict(save_checkpoints_steps=args.save_steps))
    config = run_config(args.model_dir, log_step_count_steps=None, tf_random_seed=1, **timing)
    estimator = tf.estimator.Estimator(
        model_fn, config=config,
        params=dict(dim=args.dim, capacity=args.capacity, modify_graph=args.modify_graph,
                    eviction=args.eviction))
    hooks = [GraphModifierHook()] if args.modify_graph else []
    if args.evict_every:
        hooks.append(EvictHook(evict_enable=True, evict_time_interval=None,
                               evict_step_interval=args.evict_every))
    for _ in range(args.calls):
        first = _step_of(tf.train.latest_checkpoint(config.model_dir))
        estimator.train(lambda first=first: input_fn(args, first),
                        steps=args.steps_per_call, hooks=hooks)
    if args.out and get_rank_id() == 0:
        reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(config.model_dir))
        keys = reader.get_tensor("emb/mxrec_host/keys")
        rows = reader.get_tensor("emb/mxrec_host/rows")
        embedding = reader.get_tensor("emb")
        admitted = rows >= 0
        np.savez(args.out, ids=keys[admitted], values=embedding[rows[admitted]],
                 w=reader.get_tensor("w"), step=reader.get_tensor("global_step"))
    print(f"rank {get_rank_id()} of {get_rank_size()}: done", flush=True)
    terminate_config_initializer()


if __name__ == "__main__":
    main()

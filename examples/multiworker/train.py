"""Multi-worker training: the same script on 1 or N ranks.

    python examples/multiworker/train.py                          # one process
    python -m mxrec.launch -n 2 examples/multiworker/train.py     # two ranks (engine: MPI
                                                                  # or gRPC, docs/MULTIWORKER.md)
    mpirun -n 2 python examples/multiworker/train.py              # two ranks under OpenMPI

Every rank reads the same synthetic stream and trains on its slice of each global batch
(rows rank::N). Tables are sharded across the ranks; the dense model is replicated and its
gradients are summed with `allreduce` and divided by N, so N ranks on a global batch train
what one process trains on it. With --out DIR each rank writes its shard of the table
(IDs, embeddings) and the dense weights to DIR/rank-R.npz (the tests compare them).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from mxrec._lib import loader  # noqa: E402
from mxrec.constants.constants import (  # noqa: E402
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
)
from mxrec.core import dynamic  # noqa: E402
from mxrec.core.asc.feature_spec import FeatureSpec  # noqa: E402
from mxrec.core.asc.helper import get_asc_insert_func  # noqa: E402
from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup  # noqa: E402
from mxrec.distributed.communication import (  # noqa: E402
    allreduce,
    get_rank_id,
    get_rank_size,
    rank_directory,
    session_kwargs,
)
from mxrec.graph.modifier import get_initializer, modify_graph_and_start_emb_cache  # noqa: E402
from mxrec.optimizers import (  # noqa: E402
    adagrad,
    adagrad_by_addr,
    gradient_descent,
    gradient_descent_by_addr,
    lazy_adam,
    lazy_adam_by_addr,
)
from mxrec.saver.checkpoint import Saver  # noqa: E402
from mxrec.saver.warm_start import WarmStart  # noqa: E402
from mxrec.util.initialize import init, terminate_config_initializer  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

_v1 = tf.compat.v1
_v1.disable_eager_execution()
OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(0.2),
    "adagrad": lambda: adagrad.create_hash_optimizer(0.2),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(0.02),
}
# The same optimizers by address, for tables of init(use_dynamic_expansion=True).
BY_ADDRESS = {
    "sgd": lambda: gradient_descent_by_addr.create_hash_optimizer_by_address(0.2),
    "adagrad": lambda: adagrad_by_addr.create_hash_optimizer_by_address(0.2),
    "lazy_adam": lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(0.02),
}


def make_data(steps: int, batch: int, features: int, seed: int = 0, pool: int = 400):
    """The global stream: power-law IDs (over `pool` keys spread over the int64 range),
    labels, batch times."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, pool + 1) ** 1.1
    keys = rng.integers(-2**62, 2**62, size=pool)
    ids = keys[rng.choice(pool, size=(steps * batch, features), p=weights / weights.sum())]
    labels = (rng.random(steps * batch) < 0.3).astype(np.float32)
    times = np.repeat(np.arange(steps, dtype=np.int64) * 10, batch)
    return ids.astype(np.int64), labels, times


def _rank_slice(args, rank: int, size: int, steps: int, seed: int):
    """Rank r's slice of each global batch of the stream: rows r, r + N, ... of the batch."""
    ids, labels, times = make_data(steps, args.batch, args.features, seed=seed, pool=args.pool)
    take = np.concatenate([np.arange(s * args.batch, (s + 1) * args.batch)[rank::size]
                           for s in range(steps)])
    return tf.data.Dataset.from_tensor_slices((ids[take], labels[take], times[take]))


def _feature_specs(args, is_training: bool):
    """--feature_spec: the FeatureSpecs of the IDs (with --threshold's admission and
    eviction) and of the batch time."""
    if not is_training:
        return [FeatureSpec("ids", table_name="emb")]
    threshold = args.threshold or None
    return [FeatureSpec("ids", table_name="emb", access_threshold=threshold,
                        eviction_threshold=args.eviction if threshold else None),
            FeatureSpec("time", is_timestamp=True)]


def _batches(dataset, specs, is_training: bool):
    """The dataset's batches as the lookups read them: (ids, label, time) tuples, or with
    --feature_spec ({"ids", "time"} mapped by get_asc_insert_func, label)."""
    if specs is None:
        return dataset
    dataset = dataset.map(lambda ids, label, time: ({"ids": ids, "time": time}, label))
    return dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=is_training))


def _lookup(table, specs, batch, **kwargs):
    """sparse_lookup of the batch's IDs: tensor IDs, or with --feature_spec its FeatureSpec."""
    if specs is None:
        return sparse_lookup(table, batch[0], **kwargs)
    return sparse_lookup(table, specs[0], batch=batch, **kwargs)


def build(args, rank: int, size: int, first_step: int):
    dataset = _rank_slice(args, rank, size, args.steps, seed=0)
    specs = _feature_specs(args, True) if args.feature_spec else None
    iterator = _v1.data.make_initializable_iterator(
        _batches(dataset.batch(args.batch // size).skip(first_step), specs, True))
    batch = iterator.get_next()
    label = batch[1]
    dim = args.dim_on_rank1 if rank == 1 and args.dim_on_rank1 else args.dim
    # --init_by_id: random rows, each drawn from its ID, so the owner among N ranks starts
    # an ID where one process does; otherwise a constant (equal on any rank count too).
    initializer = (_v1.truncated_normal_initializer(0.05, 0.05, seed=3) if args.init_by_id
                   else _v1.constant_initializer(0.05))
    table = create_table(tf.int64, dim, "emb", initializer,
                         device_vocabulary_size=args.capacity,
                         host_vocabulary_size=args.host,
                         all2all_gradients_op="sum_gradients_and_div_by_ranksize",
                         is_dp=args.is_dp, init_by_id=args.init_by_id)
    eval_emb = None
    if args.eval_every:
        # An evaluation stream of 2 global batches, its own iterator and lookup (built before
        # add_timestamp: the training batch's time stamps the training lookups only).
        eval_specs = _feature_specs(args, False) if args.feature_spec else None
        eval_iterator = _v1.data.make_initializable_iterator(_batches(
            _rank_slice(args, rank, size, 2, seed=1).batch(args.batch // size), eval_specs,
            False))
        eval_emb = _lookup(table, eval_specs, eval_iterator.get_next(), is_train=False,
                           name="eval_lookup", send_count=args.send_count,
                           modify_graph=args.modify_graph)
    config = None
    if specs is None:
        add_timestamp(batch[2])
        if args.threshold:
            config = dict(access_threshold=args.threshold)
            if args.eviction is not None:
                config["eviction_threshold"] = args.eviction
    emb = _lookup(table, specs, batch, access_and_evict_config=config,
                  send_count=args.send_count, name="lookup", modify_graph=args.modify_graph)
    weights = _v1.get_variable("w", [dim, 1],
                               initializer=_v1.glorot_uniform_initializer(seed=1))
    logits = tf.matmul(tf.reduce_sum(emb, 1), weights)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=label[:, None], logits=logits))
    dense, sparse = get_dense_and_sparse_variable()
    dense_grads = [allreduce(g, "sum") / size for g in tf.gradients(loss, dense)]
    if args.dynamic:  # the owner's store rows, trained by address
        local_emb = _v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = _v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        sparse_update = BY_ADDRESS[args.optimizer]().apply_gradients(
            list(zip(tf.gradients(loss, local_emb), addresses)))
    else:
        sparse_update = OPTIMIZERS[args.optimizer]().apply_gradients(
            zip(tf.gradients(loss, sparse), sparse))
    train_op = tf.group(
        _v1.train.GradientDescentOptimizer(0.2).apply_gradients(zip(dense_grads, dense)),
        sparse_update)
    evaluation = None
    if eval_emb is not None:
        evaluation = [eval_iterator.initializer,
                      tf.matmul(tf.reduce_sum(eval_emb, 1), weights)[:, 0]]
    start = iterator.initializer
    if args.modify_graph:
        modify_graph_and_start_emb_cache()
        start = get_initializer(True)
        if evaluation:
            evaluation[0] = get_initializer(False)
    return start, train_op, loss, table, weights, evaluation


def _traced_step(sess, train_op):
    """Runs one step with a trace; returns the busy time of its ops by kind (ms): the
    collectives (including the time they wait for the other ranks) and everything else."""
    options = _v1.RunOptions(trace_level=_v1.RunOptions.FULL_TRACE)
    metadata = _v1.RunMetadata()
    start = time.perf_counter()
    sess.run(train_op, options=options, run_metadata=metadata)
    wall = time.perf_counter() - start
    collective = other = 0.0
    kinds = {"alltoall_forward": 0.0, "alltoall_backward": 0.0, "allreduce": 0.0}
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            ms = (node.all_end_rel_micros or node.op_end_rel_micros) / 1000.0
            label = node.timeline_label + " " + node.node_name
            if "Collective" in label or "MxrecMpi" in label:
                collective += ms
                if "Alltoall" in label or "AllToAll" in label:
                    backward = "gradients" in node.node_name
                    kinds["alltoall_backward" if backward else "alltoall_forward"] += ms
                else:
                    kinds["allreduce"] += ms
            else:
                other += ms
    return dict(traced_step_ms=1000 * wall, collective_ms=collective, other_ops_ms=other,
                **{f"{k}_ms": v for k, v in kinds.items()})


def _evaluate(sess, evaluation, count=None, lag=0.0):
    """The logits of the whole evaluation stream (rank's rows of each global batch): until
    OutOfRangeError, or exactly `count` batches. `lag`: seconds to sleep before each run
    (a rank that falls behind its peers, for the tests)."""
    initializer, logits = evaluation
    sess.run(initializer)
    batches = []
    while count is None or len(batches) < count:
        time.sleep(lag)
        try:
            batches.append(sess.run(logits))
        except tf.errors.OutOfRangeError:
            break
    return np.stack(batches)


def _wait_for_planned(table, batches: int, timeout: float = 60.0) -> None:
    """Waits until `batches` batches are planned ahead (pending) in `table`'s shard.

    Eviction keeps the IDs of pending batches, so which IDs it removes depends on how far
    the planning ran ahead. One process plans in the background (tf.data's prefetch): the
    wait makes that the prefetch buffer refilled, `prefetch` batches ahead, which several
    ranks reach at the end of each step (they plan inside the step).
    """
    engine = loader.engine()
    deadline = time.monotonic() + timeout
    while engine.pending_batches(table.table_key) < batches:
        if time.monotonic() > deadline:
            raise SystemExit(f"{batches} planned batches expected, "
                             f"{engine.pending_batches(table.table_key)} after {timeout} s")
        time.sleep(0.001)


def _latest_step(directory: str) -> int:
    names = [n for n in os.listdir(directory) if n.startswith(("full-", "delta-"))]
    if not names:
        raise SystemExit(f"--restore: no checkpoint in {directory}")
    return max(int(n.split("-")[1]) for n in names)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--pool", type=int, default=400, help="distinct IDs in the stream")
    parser.add_argument("--capacity", type=int, default=512, help="device rows per rank")
    parser.add_argument("--host", type=int, default=0, help="host_vocabulary_size per rank")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adagrad")
    parser.add_argument("--dynamic", action="store_true",
                        help="init(use_dynamic_expansion=True): the table grows in a store")
    parser.add_argument("--threshold", type=int, default=0, help="access_threshold")
    parser.add_argument("--init_by_id", action="store_true",
                        help="random rows drawn by ID (create_table(init_by_id=True))")
    parser.add_argument("--eviction", type=int, default=None, help="eviction_threshold (s)")
    parser.add_argument("--send_count", type=int, default=None,
                        help="static shapes: unique IDs per peer and step")
    parser.add_argument("--out", default=None, help="write each rank's shard here")
    parser.add_argument("--ckpt", default=None,
                        help="mxrec Saver directory: --full_at and --delta_at save there")
    parser.add_argument("--full_at", type=int, default=None, help="full save after this step")
    parser.add_argument("--delta_at", type=int, default=None, help="delta save after this step")
    parser.add_argument("--stop_at", type=int, default=None, help="stop after this step")
    parser.add_argument("--restore", action="store_true",
                        help="restore the latest version of --ckpt (saved by any number of "
                        "ranks) and go on from its step")
    parser.add_argument("--warm_start", default=None,
                        help="WarmStart every table and dense variable from this mxrec Saver "
                        "directory (saved by any number of ranks) and go on from its step")
    parser.add_argument("--timing", default=None,
                        help="write samples/s (after 5 warm-up steps) and where one traced "
                        "step's time goes to this JSON file (rank 0)")
    parser.add_argument("--tf_save", default=None,
                        help="save with tf.compat.v1.train.Saver into this directory (each "
                        "rank into its rank_directory) at the last step")
    parser.add_argument("--tf_restore", default=None,
                        help="restore the latest TF checkpoint of this directory (written by "
                        "any number of ranks) and go on from its step")
    parser.add_argument("--dim_on_rank1", type=int, default=None,
                        help="rank 1 builds its table with this dim (failure tests)")
    parser.add_argument("--is_dp", action="store_true",
                        help="create_table(is_dp=True): the table replicated on every rank")
    parser.add_argument("--die_at", type=int, default=None,
                        help="rank 1 exits at this step (failure tests)")
    parser.add_argument("--feature_spec", action="store_true",
                        help="the FeatureSpec path: get_asc_insert_func maps the dataset, "
                             "sparse_lookup(table, spec, batch=...)")
    parser.add_argument("--modify_graph", action="store_true",
                        help="the graph modifier plans the batches ahead of the steps")
    parser.add_argument("--prefetch", type=int, default=0,
                        help="prefetch_batch_number: batches planned ahead (--modify_graph)")
    parser.add_argument("--reinit_at", type=int, default=None,
                        help="re-initialise the training iterator after this step (the "
                        "stream starts again)")
    parser.add_argument("--eval_batches", type=int, default=None,
                        help="evaluate exactly this many batches (default: until "
                        "OutOfRangeError)")
    parser.add_argument("--eval_repeat", type=int, default=1,
                        help="evaluate the stream this many times in a row (each run "
                             "must give the same logits)")
    parser.add_argument("--lag", type=float, default=0.0,
                        help="rank 0 sleeps this many seconds before each evaluation run "
                             "(a rank behind its peers when the data ends; for the tests)")
    parser.add_argument("--eval_every", type=int, default=None,
                        help="evaluate 2 global batches after every this many steps")
    args = parser.parse_args(argv)
    init(use_mpi=True if "MXREC_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
         else False, prefetch_batch_number=args.prefetch, use_dynamic=args.send_count is None,
         use_dynamic_expansion=args.dynamic)
    rank, size = get_rank_id(), get_rank_size()
    if args.batch % size:
        raise SystemExit(f"--batch {args.batch} must divide among {size} ranks")
    first = _latest_step(args.ckpt) if args.restore else 0
    if args.warm_start:
        first = _latest_step(args.warm_start)
    tf_checkpoint = None
    if args.tf_restore:
        tf_checkpoint = tf.train.latest_checkpoint(args.tf_restore)
        if tf_checkpoint is None:
            raise SystemExit(f"--tf_restore: no checkpoint in {args.tf_restore}")
        first = int(tf_checkpoint.rsplit("-", 1)[1])
    start, train_op, loss, table, weights, evaluation = build(args, rank, size, first)
    saver = Saver(args.ckpt) if args.ckpt else None
    warm = WarmStart(args.warm_start) if args.warm_start else None
    # TF's Saver, built after the train op (the tables save their optimizer slots too).
    tf_saver = _v1.train.Saver() if args.tf_save or args.tf_restore else None
    with _v1.Session(**session_kwargs()) as sess:
        # On several ranks the tables' variables are local variables (each rank's layout).
        sess.run([_v1.global_variables_initializer(), _v1.local_variables_initializer()])
        if args.restore:
            assert saver.restore(sess) == first
        if warm is not None:
            warm.run(sess)
        if tf_checkpoint:
            tf_saver.restore(sess, tf_checkpoint)
        sess.run(start)
        timed_from, breakdown = None, None
        trained, eval_logits = 0, []
        step = first
        while args.stop_at is None or step < args.stop_at:  # else until the data ends
            step += 1
            if args.die_at is not None and rank == 1 and step == args.die_at:
                os._exit(3)
            if args.timing and step == first + 6:
                timed_from = time.perf_counter()
            if args.timing and step == (args.stop_at or args.steps):
                seconds = time.perf_counter() - timed_from
                breakdown = _traced_step(sess, train_op)  # the last step, not timed
                continue
            try:
                _, value = sess.run([train_op, loss])
            except tf.errors.OutOfRangeError:
                break  # the data ended: at the same step on every rank
            trained += 1
            if step == args.reinit_at:
                sess.run(start)
            if args.eval_every and step % args.eval_every == 0:
                runs = [_evaluate(sess, evaluation, args.eval_batches,
                                  args.lag if rank == 0 else 0.0)
                        for _ in range(args.eval_repeat)]
                if any(not np.array_equal(run, runs[0]) for run in runs):
                    raise SystemExit(f"step {step}: evaluations in a row disagree")
                eval_logits.append(runs[0])
            if args.eviction is not None:
                if args.modify_graph and args.prefetch:
                    _wait_for_planned(table, min(args.prefetch, args.steps - step))
                table.evict(args.eviction)
            if step % 10 == 0 and rank == 0:
                print(f"step {step}: loss {value:.4f} (rank 0's slice)", flush=True)
            if step == args.full_at:
                saver.save(sess, step, kind="full")
            if step == args.delta_at:
                saver.save(sess, step, kind="delta")
        if args.tf_save:
            last = args.stop_at or args.steps
            tf_saver.save(sess, os.path.join(rank_directory(args.tf_save), "model"),
                          global_step=last)
        if args.timing and rank == 0:
            steps = (args.stop_at or args.steps) - first - 6
            with open(args.timing, "w") as f:
                json.dump(dict(ranks=size, steps=steps, samples_per_second=steps * args.batch /
                               seconds, step_ms=1000 * seconds / steps, **breakdown), f)
        if args.dynamic:
            ids, values = dynamic.export_values(table)
        else:
            ids, rows = table.export_rows()
            values = sess.run(table.variable)[rows] if len(rows) else np.zeros((0, args.dim))
        if args.host:
            from mxrec.core import tiers
            exported = tiers.export_values(sess, table, slots=False)
            ids, values = exported["embedding"]
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            np.savez(os.path.join(args.out, f"rank-{rank}.npz"), ids=ids, values=values,
                     w=sess.run(weights), stats=np.array([table.stats()["rows_in_use"]]),
                     trained=np.array([trained]),
                     eval=np.array(eval_logits, np.float32))
    print(f"rank {rank} of {size}: {len(ids)} IDs in this shard", flush=True)
    terminate_config_initializer()


if __name__ == "__main__":
    main()

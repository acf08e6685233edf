"""Several sharded tables of different dims in one step, on 1 or N ranks (the fused exchange).

    python examples/multiworker/tables.py --tables 5 --dims 8,4,16,2,6 --twice --modify_graph
    python -m mxrec.launch -n 2 examples/multiworker/tables.py --tables 5 --twice --modify_graph

As examples/multiworker/train.py, every rank reads the same synthetic stream (its rows
rank::N of each global batch); here T tables (dims cycled from --dims) each look up F
feature columns of their own, and with --twice table 0 is looked up a second time on F more
columns (a second lookup of one table in the same step). The dense model is a logistic layer
over every lookup's sum over its features; dense gradients are all-reduced and divided by N.
It trains until the data ends (OutOfRangeError).

--out DIR: each rank writes its shard of every table (ids_T, values_T) and the dense weights
to DIR/rank-R.npz. --count PATH: rank 0 traces one step and writes the collectives it
ran (by kind), the number of ops it ran, the bytes this rank's all-to-alls sent to other
ranks (as exchanged, chunks and padding included) of a step in the middle, and the
samples/s and rank 0's CPU time per step of the untraced steps after 3 warm-up steps, as
JSON.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train import make_data  # noqa: E402

from mxrec.core.embedding import add_timestamp, create_table, sparse_lookup  # noqa: E402
from mxrec.distributed.communication import allreduce, get_rank_id, get_rank_size, session_kwargs  # noqa: E402
from mxrec.graph.modifier import get_initializer, modify_graph_and_start_emb_cache  # noqa: E402
from mxrec.optimizers import adagrad, gradient_descent  # noqa: E402
from mxrec.util.initialize import init, terminate_config_initializer  # noqa: E402
from mxrec.util.variable import get_dense_and_sparse_variable  # noqa: E402

_v1 = tf.compat.v1
_v1.disable_eager_execution()
OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(0.2),
    "adagrad": lambda: adagrad.create_hash_optimizer(0.2),
}


def table_dims(args):
    dims = [int(d) for d in args.dims.split(",")]
    return [dims[t % len(dims)] for t in range(args.tables)]


def columns(args):
    """Feature columns of the stream: T * F, plus F for --twice."""
    return args.tables * args.features + (args.features if args.twice else 0)


def build(args, rank: int, size: int):
    ids, labels, times = make_data(args.steps, args.batch, columns(args), pool=args.pool)
    take = np.concatenate([np.arange(s * args.batch, (s + 1) * args.batch)[rank::size]
                           for s in range(args.steps)])
    dataset = tf.data.Dataset.from_tensor_slices((ids[take], labels[take], times[take]))
    iterator = _v1.data.make_initializable_iterator(dataset.batch(args.batch // size))
    features, label, stamp = iterator.get_next()
    add_timestamp(stamp)
    renamed = args.rename_on_rank1 if rank == 1 else None
    tables = [create_table(tf.int64, dim, f"emb_{t}" + ("_renamed" if t == renamed else ""),
                           _v1.constant_initializer(0.05),
                           device_vocabulary_size=args.capacity,
                           all2all_gradients_op="sum_gradients_and_div_by_ranksize")
              for t, dim in enumerate(table_dims(args))]
    f = args.features
    pooled = []
    for t, table in enumerate(tables):
        emb = sparse_lookup(table, features[:, t * f:(t + 1) * f], name=f"lookup_{t}",
                            modify_graph=args.modify_graph)
        pooled.append(tf.reduce_sum(emb, 1))
    if args.twice:
        start = args.tables * f
        emb = sparse_lookup(tables[0], features[:, start:start + f], name="lookup_0_again",
                            modify_graph=args.modify_graph)
        pooled.append(tf.reduce_sum(emb, 1))
    hidden = tf.concat(pooled, axis=1)
    weights = _v1.get_variable("w", [hidden.shape[1], 1],
                               initializer=_v1.glorot_uniform_initializer(seed=1))
    logits = tf.matmul(hidden, weights)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=label[:, None], logits=logits))
    dense, sparse = get_dense_and_sparse_variable()
    dense_grads = tf.gradients(loss, dense)
    if size > 1:
        dense_grads = [allreduce(g, "sum") / size for g in dense_grads]
    train_op = tf.group(
        _v1.train.GradientDescentOptimizer(0.2).apply_gradients(zip(dense_grads, dense)),
        OPTIMIZERS[args.optimizer]().apply_gradients(zip(tf.gradients(loss, sparse), sparse)))
    start = iterator.initializer
    if args.modify_graph:
        modify_graph_and_start_emb_cache()
        start = get_initializer(True)
    return start, train_op, tables, weights


_SIZES = {tf.float32.as_datatype_enum: 4, tf.int64.as_datatype_enum: 8,
          tf.int32.as_datatype_enum: 4, tf.float64.as_datatype_enum: 8}


def traced_collectives(sess, train_op, size: int, timeline: str = None, rank: int = 0):
    """Runs one step with a full trace: the collectives it ran by kind, and the bytes its
    all-to-alls sent to other ranks (each output's size x (N - 1) / N). With `timeline` (a
    directory) this rank also writes the step's Chrome trace and where its time went."""
    options = _v1.RunOptions(trace_level=_v1.RunOptions.FULL_TRACE)
    metadata = _v1.RunMetadata()
    began = time.perf_counter()
    sess.run(train_op, options=options, run_metadata=metadata)
    wall_ms = (time.perf_counter() - began) * 1e3
    if timeline:
        write_timeline(metadata, timeline, rank, wall_ms)
    kinds = {"alltoall_ids": 0, "alltoall_embeddings": 0, "alltoall_gradients": 0,
             "allreduce": 0}
    sent = 0.0
    names = []
    ops = set()
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            ops.add(node.node_name)
            label = node.timeline_label
            op = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else ""
            if not op.startswith(("Collective", "MxrecMpi")):
                continue
            names.append(f"{op} {node.node_name}")
            if "AllToAll" in op or "Alltoall" in op:
                kind = ("alltoall_gradients" if "gradients" in node.node_name else
                        "alltoall_ids" if "/exchange/" in node.node_name else
                        "alltoall_embeddings")
                kinds[kind] += 1
                for output in node.output[:1]:
                    desc = output.tensor_description
                    elements = int(np.prod([d.size for d in desc.shape.dim]))
                    sent += elements * _SIZES.get(desc.dtype, 4) * (size - 1) / size
            else:
                kinds["allreduce"] += 1
    # Ops run in the step, each once (the executor's _SOURCE node and the op nodes).
    return dict(collectives=kinds, bytes_sent=sent, names=sorted(names), ops_run=len(ops))


# Where a traced step's op time goes, by the first matching pattern of the op's type or name.
_CATEGORIES = (
    ("collective: ID all-to-all", lambda t, n: "Alltoall" in t and "/exchange/" in n),
    ("collective: gradient all-to-all", lambda t, n: "Alltoall" in t and "gradients" in n),
    ("collective: embedding all-to-all", lambda t, n: "Alltoall" in t),
    ("collective: all-reduce", lambda t, n: "Allreduce" in t),
    ("key stage (owner)", lambda t, n: t in ("MxrecKeyStage", "MxrecCommitBatches")),
    ("planning: exchange-side ops", lambda t, n: "/exchange/" in n),
    ("planning: other", lambda t, n: "_mxrec/" in n and "gradients" not in n),
    ("backward (gradients)", lambda t, n: "gradients" in n),
    ("rest of forward", lambda t, n: True),
)


def write_timeline(metadata, directory: str, rank: int, wall_ms: float) -> None:
    """rank-R.trace.json (chrome://tracing) and rank-R.breakdown.json: per category the op
    time summed over threads, the largest single op, and the step's wall time."""
    from tensorflow.python.client import timeline as tf_timeline  # noqa: PLC0415

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank-{rank}.trace.json"), "w") as f:
        f.write(tf_timeline.Timeline(metadata.step_stats).generate_chrome_trace_format())
    sums, tops, start, end = {}, {}, None, None
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            label = node.timeline_label
            op = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else ""
            micros = node.all_end_rel_micros
            begin = node.all_start_micros
            start = begin if start is None else min(start, begin)
            end = begin + micros if end is None else max(end, begin + micros)
            name = next(c for c, match in _CATEGORIES if match(op, node.node_name))
            sums[name] = sums.get(name, 0) + micros / 1e3
            if micros / 1e3 > tops.get(name, ("", 0.0))[1]:
                tops[name] = (f"{op} {node.node_name}", micros / 1e3)
    breakdown = dict(wall_ms=wall_ms, traced_span_ms=(end - start) / 1e3 if start else 0.0,
                     op_ms=sums, largest_op=tops)
    with open(os.path.join(directory, f"rank-{rank}.breakdown.json"), "w") as f:
        json.dump(breakdown, f, indent=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=5)
    parser.add_argument("--dims", default="8,4,16,2,6", help="table dims, cycled")
    parser.add_argument("--features", type=int, default=2, help="feature columns per lookup")
    parser.add_argument("--twice", action="store_true", help="look table 0 up twice")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--pool", type=int, default=300)
    parser.add_argument("--capacity", type=int, default=2000, help="device rows per rank")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adagrad")
    parser.add_argument("--modify_graph", action="store_true")
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--rename_on_rank1", type=int, default=None,
                        help="rank 1 names this table otherwise (the error test)")
    parser.add_argument("--count", default=None, help="write the traced last step here")
    parser.add_argument("--timeline", default=None,
                        help="with --count: every rank writes its traced step's Chrome trace "
                             "and time breakdown to this directory")
    args = parser.parse_args(argv)
    init(use_mpi="MXREC_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ,
         prefetch_batch_number=args.prefetch)
    rank, size = get_rank_id(), get_rank_size()
    if args.batch % size:
        raise SystemExit(f"--batch {args.batch} must divide among {size} ranks")
    start, train_op, tables, weights = build(args, rank, size)
    with _v1.Session(**session_kwargs()) as sess:
        sess.run([_v1.global_variables_initializer(), _v1.local_variables_initializer()])
        sess.run(start)
        # The traced step is in the middle: it plans a next batch, as every step but the last.
        trained, counted, seconds, cpu_seconds, traced = 0, None, 0.0, 0.0, args.steps // 2
        while True:
            try:
                if args.count and trained == traced:
                    counted = traced_collectives(sess, train_op, size, args.timeline, rank)
                else:
                    began, cpu_began = time.perf_counter(), time.process_time()
                    sess.run(train_op)
                    if trained >= 3:
                        seconds += time.perf_counter() - began
                        cpu_seconds += time.process_time() - cpu_began
            except tf.errors.OutOfRangeError:
                break
            trained += 1
        if trained != args.steps:
            raise SystemExit(f"trained {trained} steps, the data holds {args.steps}")
        if args.count and rank == 0:
            timed = args.steps - 3 - (traced >= 3)
            # This process's CPU time (every thread, waits that spin included) per step.
            counted.update(ranks=size, samples_per_second=(
                timed * args.batch / seconds if seconds else None),
                cpu_ms_per_step=cpu_seconds * 1e3 / max(timed, 1))
            with open(args.count, "w") as f:
                json.dump(counted, f)
        if args.out:
            shards = {}
            for t, table in enumerate(tables):
                ids, rows = table.export_rows()
                values = sess.run(table.variable)[rows] if len(rows) else \
                    np.zeros((0, table.dim), np.float32)
                shards[f"ids_{t}"], shards[f"values_{t}"] = ids, values
            os.makedirs(args.out, exist_ok=True)
            np.savez(os.path.join(args.out, f"rank-{rank}.npz"), w=sess.run(weights), **shards)
    terminate_config_initializer()


if __name__ == "__main__":
    main()

"""python -m mxrec.quality: AUC, log loss and bytes of a model's forms, side by side.

    python -m mxrec.quality --data ROOT --model-dir M --compare float32,bfloat16,float16,int8

Trains a built-in model (the streaming trainer's --model and flags) on every ready partition
of ROOT but the last --holdout, into M (a model dir trained before goes on from its
donefile), then scores the held-out partitions with a serving SavedModel of each form and
prints a Markdown table: AUC, its difference from the first form, log loss, the serving
model's bytes, the tables' bytes per ID in serving and an ID's row bytes at rest while
training. Forms: float32 (rows as trained), int8 (serving rows quantized per row), bfloat16
and float16 (a model whose tables rest in that dtype while training, trained into
M/storage-<dtype> on the same partitions). --storage_dtype sets M's own tables' dtype.
"""

import argparse
import dataclasses
import json
import sys
from typing import List, Optional

from mxrec.streaming.__main__ import _add_data_flags, _Parser, _schema


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m mxrec.quality", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the data root (ROOT/yyyyMMdd[/hh])")
    parser.add_argument("--model_dir", "--workdir", dest="workdir", metavar="DIR",
                        required=True, help="checkpoints and donefile of the trained model")
    parser.add_argument("--compare", default="float32,int8",
                        help="forms to compare, comma-separated; the first is the baseline "
                             "(float32,int8)")
    parser.add_argument("--holdout", type=int, default=1,
                        help="the last N ready partitions are scored, not trained on (1)")
    parser.add_argument("--done_marker", default="_SUCCESS", help="a partition's ready marker")
    granularity = parser.add_mutually_exclusive_group()
    granularity.add_argument("--daily", dest="granularity", action="store_const",
                             const="daily", help="only ROOT/yyyyMMdd partitions")
    granularity.add_argument("--hourly", dest="granularity", action="store_const",
                             const="hourly", help="only ROOT/yyyyMMdd/hh partitions")
    _add_data_flags(parser)
    parser.add_argument("--model", choices=("wide_deep", "dlrm", "dcn"), default="wide_deep",
                        help="built-in model (wide_deep)")
    parser.add_argument("--dim", type=int, default=8, help="embedding width (8)")
    parser.add_argument("--hidden", default="64,32", help="hidden layer widths (64,32)")
    parser.add_argument("--vocabulary", type=int, default=200_000,
                        help="device rows per table (200000)")
    parser.add_argument("--dense_lr", type=float, default=0.001, help="Adam rate (0.001)")
    parser.add_argument("--sparse_lr", type=float, default=0.05, help="Adagrad rate (0.05)")
    parser.add_argument("--seed", type=int, default=0, help="initializer seed (0)")
    parser.add_argument("--storage_dtype", choices=("float32", "bfloat16", "float16"),
                        default="float32", help="the dtype the tables' rows rest in while "
                                                "training (float32)")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow threads (0: TensorFlow's default)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    import tensorflow as tf

    from mxrec.quality import report
    from mxrec.streaming import models
    from mxrec.streaming.trainer import StreamConfig

    try:
        forms = report.parse_forms(args.compare)
        model = models.ModelConfig(args.model, dim=args.dim,
                                   hidden=tuple(int(h) for h in args.hidden.split(",") if h),
                                   vocabulary=args.vocabulary, seed=args.seed,
                                   storage_dtype=args.storage_dtype)
        config = StreamConfig(data=args.data, schema=_schema(args), workdir=args.workdir,
                              batch_size=args.batch_size, done_marker=args.done_marker,
                              granularity=args.granularity, progress=False,
                              tensorboard=False, threads=args.threads,
                              dense_learning_rate=args.dense_lr,
                              sparse_learning_rate=args.sparse_lr)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    tf.compat.v1.disable_eager_execution()
    try:
        rows = report.compare(config, model, forms, args.holdout)
    except ValueError as error:
        print(f"mxrec.quality: error: {error}", file=sys.stderr)
        return 1
    print(report.table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(dataclasses.asdict(r), bytes_per_id=r.bytes_per_id,
                            train_bytes_per_id=r.train_bytes_per_id) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

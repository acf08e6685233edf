"""python -m mxrec.streaming train|replay: the streaming trainer and a replay client.

    python -m mxrec.streaming train --data ROOT --model-dir DIR [--export-base DIR] ...
    python -m mxrec.streaming replay --data ROOT/PARTITION --url http://127.0.0.1:P/v1/models/NAME
    python -m mxrec.streaming replay --data ROOT/PARTITION --grpc 127.0.0.1:G --model_name NAME

`train` trains every ready partition of ROOT once, in time order (and, with --watch,
those that arrive), with a built-in model; `replay` sends a partition's records to a
TF Serving REST endpoint or gRPC API (mxrec.serving or TensorFlow Serving) and prints
the AUC of the answers. Run a subcommand with --help for its flags. Every flag takes both spellings
(--export-base and --export_base); abbreviations are not accepted.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import List, Optional

FORMATS = ("criteo", "criteo_csv", "avazu")
LAYOUT = ("partitions ROOT/yyyyMMdd/ (daily) or ROOT/yyyyMMdd/hh/ (hourly), each made ready "
          "by its done marker file")


_TRAIN_DESCRIPTION = """\
Trains a built-in model (--model) on every ready partition of --data once, in time order
(with --watch, also those that arrive), and after each partition saves a checkpoint
(full or delta) to --model-dir, writes a serving version to --export-base (a SavedModel
that python -m mxrec.serving or TensorFlow Serving loads) and appends a line with the
partition's counts and AUC to MODEL_DIR/donefile.jsonl. A restarted run goes on after the
last partition in the donefile: each partition is trained exactly once. On several ranks,
start it with python -m mxrec.launch -n N -m mxrec.streaming train ...
"""

_EPILOG = """\
examples:
  python -m mxrec.streaming train --data ROOT --model-dir M --export-base E --hourly --watch
  python -m mxrec.serving --export-base E --model-name ctr --port 8501
  python -m mxrec.streaming replay --data ROOT/20240102/05 --url http://127.0.0.1:8501/v1/models/ctr

guides: docs/STREAMING.md (data layout, flags, several ranks, operating), docs/SERVING.md
"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser without prefix matching, whose flags take both spellings:
    `--export_base` is also `--export-base` and the other way round."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_argument(self, *names, **kwargs):
        spelled = []
        for name in names:
            forms = [name] if not name.startswith("--") else [
                "--" + name[2:].replace("_", "-"), "--" + name[2:].replace("-", "_")]
            spelled += [form for form in dict.fromkeys(forms) if form not in spelled]
        if names[0].startswith("--") and "dest" not in kwargs:
            kwargs["dest"] = names[0][2:].replace("-", "_")
        return super().add_argument(*spelled, **kwargs)


def _schema(args):
    from mxrec.streaming import parsers

    delimiter = None if args.delimiter is None else args.delimiter.encode().decode(
        "unicode_escape")
    limit = parsers.DEFAULT_DENSE_LIMIT if args.dense_limit is None else args.dense_limit
    if args.schema:
        return parsers.parse_schema_spec(args.schema, delimiter or "\t", bool(args.header),
                                         limit)
    return parsers.named_schema(args.format, delimiter,
                                None if args.header is None else bool(args.header), limit)


def _add_data_flags(parser):
    parser.add_argument("--format", choices=FORMATS, default="criteo",
                        help="record format: criteo (TSV, no header), criteo_csv (CSV with a "
                             "header, as the shared sample), avazu (CSV with a header); "
                             "default criteo")
    parser.add_argument("--schema", default=None,
                        help="a declared schema instead of --format: 'name:kind,...' with kinds "
                             "label, dense, categorical, uint64, yymmddhh, timestamp, skip")
    parser.add_argument("--delimiter", default=None,
                        help="field delimiter (escapes like \\t allowed); default the format's")
    parser.add_argument("--header", type=int, choices=(0, 1), default=None,
                        help="1: every file starts with a header line; default the format's")
    parser.add_argument("--batch_size", type=int, default=512, help="lines per batch (512)")
    parser.add_argument("--dense_limit", type=float, default=None,
                        help="a dense value with |x| above this makes its line a bad line "
                             "(1e15); may be raised (inf), a non-finite value is always a bad "
                             "line")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m mxrec.streaming", description=__doc__,
                     epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train ready partitions once, in time order",
                                description=_TRAIN_DESCRIPTION, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--data", required=True,
                       help="data root: ROOT/yyyyMMdd/hh/ or ROOT/yyyyMMdd/ partitions")
    train.add_argument("--model_dir", "--workdir", dest="workdir", metavar="DIR", required=True,
                       help="the model folder: checkpoints, donefile.jsonl and TensorBoard "
                            "scalars go here (--workdir is the older name)")
    train.add_argument("--export_base", default=None,
                       help="serving versions go to EXPORT_BASE/<version>/ (TF Serving "
                            "layout); default: no export")
    _add_data_flags(train)
    train.add_argument("--done_marker", default="_SUCCESS",
                       help="file that marks a partition ready (_SUCCESS)")
    granularity = train.add_mutually_exclusive_group()
    granularity.add_argument("--daily", dest="granularity", action="store_const",
                             const="daily", help="train only daily partitions ROOT/yyyyMMdd "
                                                 "(default: daily and hourly ones)")
    granularity.add_argument("--hourly", dest="granularity", action="store_const",
                             const="hourly", help="train only hourly partitions "
                                                  "ROOT/yyyyMMdd/hh")
    train.add_argument("--model", choices=("wide_deep", "dlrm", "dcn"), default="wide_deep",
                       help="built-in model (wide_deep)")
    train.add_argument("--dim", type=int, default=8, help="embedding width (8)")
    train.add_argument("--hidden", default="64,32",
                       help="MLP widths, comma-separated (64,32)")
    train.add_argument("--cross_layers", type=int, default=2, help="dcn cross layers (2)")
    train.add_argument("--vocabulary", type=int, default=200_000,
                       help="device rows per table (200000)")
    train.add_argument("--host_vocabulary", type=int, default=0,
                       help="host-memory rows per table for IDs past the device rows (a host "
                            "tier; the device rows become a cache); 0: none (default)")
    train.add_argument("--storage_dtype", choices=("float32", "bfloat16", "float16"),
                       default="float32",
                       help="the dtype table rows rest in (float32); bfloat16 and float16 "
                            "halve the bytes, updates computed in float32 and rounded")
    train.add_argument("--init_stddev", type=float, default=0.01,
                       help="stddev of new rows (0.01); 0: zeros")
    # Flags of this parser take both spellings (_Parser); the later of the two flags wins.
    train.add_argument("--init_by_id", dest="init_by_id", action="store_true", default=True,
                       help="draw each new ID's first values from the ID (default): 1 and N "
                            "ranks, a resumed and an uninterrupted run start every ID alike")
    train.add_argument("--no_init_by_id", dest="init_by_id", action="store_false",
                       help="new IDs take their row's initial value (mx_rec's way)")
    train.add_argument("--access_threshold", type=int, default=None,
                       help="admission: a row once an ID is seen this often (default: at once)")
    train.add_argument("--eviction_threshold", type=int, default=None,
                       help="eviction: seconds of data time an ID may stay unseen")
    train.add_argument("--buckets", type=int, default=None,
                       help="plain-TensorFlow baseline: tables are tf.Variables of this many "
                            "rows read at ID mod buckets (no mxrec tables, no admission)")
    train.add_argument("--evict_daily", action="store_true",
                       help="evict on each new day's first partition (needs "
                            "--eviction_threshold)")
    train.add_argument("--shrink_days", type=int, default=None,
                       help="on each new day, remove IDs unseen for this many days")
    train.add_argument("--validation", choices=("partition", "batch", "none"),
                       default="partition",
                       help="progressive validation: score the whole partition before training "
                            "on it (partition, default), each batch before its update (batch), "
                            "or none")
    train.add_argument("--full_every", default="day",
                       help="'day' (a full version on each day's first partition, default) or "
                            "N partitions; the others are deltas")
    train.add_argument("--delta_export", choices=("savedmodel", "delta_only"),
                       default="savedmodel",
                       help="a delta partition's serving version: a complete SavedModel plus "
                            "the delta file (savedmodel, default; TF Serving loads it), or only "
                            "the delta file (delta_only: costs in proportion to the rows "
                            "changed; for mxrec.serving)")
    train.add_argument("--serving_quantize", choices=("none", "int8"), default="none",
                       help="rows of the serving versions: float32 (none, default) or int8 "
                            "(each row as 8-bit codes with its own scale and offset, "
                            "dequantized in the SavedModel; deltas in the same form)")
    train.add_argument("--max_bad_lines", type=int, default=0,
                       help="malformed lines allowed per partition before the run stops (0)")
    train.add_argument("--on_nonfinite", choices=("stop", "skip"), default="stop",
                       help="a partition that trains the model into NaN or infinite values is "
                            "never saved or delivered; then: stop the run with an error naming "
                            "it (stop, default), or go back to the last good checkpoint, record "
                            "the partition as skipped in the donefile and go on (skip)")
    train.add_argument("--watch", action="store_true",
                       help="keep polling for new partitions")
    train.add_argument("--poll_interval", type=float, default=60.0,
                       help="seconds between polls with --watch (60)")
    train.add_argument("--deadline", type=float, default=None,
                       help="with --watch, stop when idle this many seconds after the start")
    train.add_argument("--max_partitions", type=int, default=None,
                       help="stop after this many partitions")
    train.add_argument("--dense_lr", type=float, default=0.001,
                       help="Adam learning rate of the dense part (0.001)")
    train.add_argument("--sparse_lr", type=float, default=0.05,
                       help="Adagrad learning rate of the tables (0.05)")
    train.add_argument("--seed", type=int, default=0, help="initializer seed (0)")
    train.add_argument("--threads", type=int, default=0,
                       help="TensorFlow intra/inter-op threads (0: TensorFlow's default)")
    train.add_argument("--no_progress", action="store_true",
                       help="no progress line per partition")
    train.add_argument("--no_tensorboard", action="store_true",
                       help="no TensorBoard scalars")
    train.add_argument("--report", default=None,
                       help="write a PNG report of the donefile (needs matplotlib) to this path")

    replay = commands.add_parser("replay", help="send a partition to a predictor, print AUC",
                                 description="Replays a partition against a TF Serving REST "
                                             "endpoint or gRPC API (python -m mxrec.serving or "
                                             "TensorFlow Serving) and prints the AUC of its "
                                             "answers.",
                                 epilog=_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    replay.add_argument("--data", required=True,
                        help="a partition folder (ROOT/yyyyMMdd/hh) or a data file")
    target = replay.add_mutually_exclusive_group(required=True)
    target.add_argument("--url",
                        help="a REST model URL, e.g. http://127.0.0.1:8501/v1/models/ctr")
    target.add_argument("--grpc", metavar="HOST:PORT",
                        help="a gRPC predictor (TF Serving's PredictionService), e.g. "
                             "127.0.0.1:8500; needs --model_name")
    replay.add_argument("--model_name", default=None,
                        help="with --grpc: the model the requests name")
    _add_data_flags(replay)
    replay.add_argument("--max_requests", type=int, default=1000,
                        help="stop after this many requests (1000)")
    replay.add_argument("--timeout", type=float, default=30.0,
                        help="seconds per request (30)")
    return parser


def _train(args, parser) -> int:
    from mxrec.streaming import models

    model, config = _train_config(args, parser)
    if not _check_partitions(args, parser):
        return 1
    import tensorflow as tf

    from mxrec.streaming.ownership import OwnershipError
    from mxrec.streaming.parsers import MalformedDataError
    from mxrec.streaming.trainer import NonFiniteModelError, StreamingTrainer, summary

    tf.compat.v1.disable_eager_execution()
    try:
        entries = StreamingTrainer(config, models.make_model_fn(model)).run()
    except (OwnershipError, MalformedDataError, NonFiniteModelError) as error:
        from mxrec.distributed import communication

        if communication.get_rank_size() > 1:
            # Uncaught, it ends the whole job at once (MPI_Abort, or the launcher stopping
            # the others); a rank that returned would leave the others waiting in their
            # next exchange until it times out.
            raise
        # Refusals an operator acts on: the message says what and how, no traceback.
        print(f"mxrec.streaming train: error: {error}", file=sys.stderr)
        return 1
    print(summary(entries))
    if args.report:
        from mxrec.streaming import report

        report.write_png(config.donefile, args.report)
        print(f"report: {args.report}")
    return 0


def _train_config(args, parser):
    """(the ModelConfig, the StreamConfig) of `train`'s flags; a bad flag is the parser's
    error (exit 2) naming it."""
    from mxrec.streaming import models
    from mxrec.streaming.trainer import StreamConfig

    if not os.path.isdir(args.data) and "://" not in args.data:
        parser.error(f"--data {args.data!r} is not a folder")
    if args.evict_daily and args.eviction_threshold is None:
        parser.error("--evict_daily needs --eviction_threshold")
    full_every = args.full_every if args.full_every == "day" else None
    if full_every is None:
        try:
            full_every = int(args.full_every)
        except ValueError:
            parser.error(f"--full_every must be 'day' or a number, got {args.full_every!r}")
    try:
        hidden = tuple(int(h) for h in args.hidden.split(",") if h)
        model = models.ModelConfig(args.model, dim=args.dim, hidden=hidden,
                                   cross_layers=args.cross_layers, vocabulary=args.vocabulary,
                                   init_stddev=args.init_stddev, init_by_id=args.init_by_id,
                                   access_threshold=args.access_threshold,
                                   eviction_threshold=args.eviction_threshold, seed=args.seed,
                                   buckets=args.buckets,
                                   host_vocabulary=args.host_vocabulary,
                                   storage_dtype=args.storage_dtype)
        config = StreamConfig(
            data=args.data, schema=_schema(args), workdir=args.workdir,
            export_base=args.export_base, batch_size=args.batch_size,
            done_marker=args.done_marker, validation=args.validation, full_every=full_every,
            shrink_days=args.shrink_days, evict_daily=args.evict_daily,
            max_bad_lines=args.max_bad_lines, watch=args.watch,
            poll_interval=args.poll_interval,
            deadline=None if args.deadline is None else time.time() + args.deadline,
            max_partitions=args.max_partitions, dense_learning_rate=args.dense_lr,
            sparse_learning_rate=args.sparse_lr, progress=not args.no_progress,
            tensorboard=not args.no_tensorboard, threads=args.threads,
            delta_export=args.delta_export, granularity=args.granularity,
            on_nonfinite=args.on_nonfinite,
            serving_quantize=None if args.serving_quantize == "none" else args.serving_quantize)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    return model, config


def _check_partitions(args, parser) -> bool:
    """Says what is wrong with a data root that has no ready partition: False where there
    is nothing to train (without --watch); warns about what it skips."""
    from mxrec.streaming import partitions

    listed = partitions.list_partitions(args.data, args.done_marker)
    ready = partitions.of_granularity(listed, args.granularity)
    if not ready:
        found = partitions.unready(args.data, args.done_marker)
        if listed:
            found.insert(0, f"{len(listed)} ready partition(s) not {args.granularity} "
                            f"({', '.join(p.name for p in listed[:3])}) skipped by "
                            f"--{args.granularity}")
        found = "; ".join(found) or "it is empty"
        expected = (f"mxrec.streaming train expects {LAYOUT} ({args.done_marker!r}; "
                    "--done-marker sets another)")
        if not args.watch:
            print(f"mxrec.streaming train: nothing to train: no ready partition in "
                  f"{args.data} ({found}). {expected}", file=sys.stderr)
            return False
        print(f"mxrec.streaming train: warning: no ready partition in {args.data} yet "
              f"({found}); waiting for {LAYOUT} ({args.done_marker!r}), looking every "
              f"{args.poll_interval:g} s", file=sys.stderr, flush=True)
    else:
        for problem in partitions.unready(args.data, args.done_marker):
            print(f"mxrec.streaming train: warning: {args.data}: {problem}; skipped",
                  file=sys.stderr)
        _check_format(args, ready[0].files[:1], parser)
    return True


def _check_format(args, files: List[str], parser) -> None:
    """Refuses `--format criteo` (tab-separated, no header) on comma-separated files,
    naming the format that reads them, instead of failing on every line later."""
    if args.schema or args.format != "criteo" or args.delimiter is not None or not files:
        return
    import tensorflow as tf

    # A bounded prefix, decoded leniently: the first line may be poisoned (no end, no UTF-8),
    # which the parser counts as a bad line; this look must not fail on it.
    with tf.io.gfile.GFile(files[0], "rb") as f:
        first = f.read(4096).split(b"\n")[0].decode(errors="replace").rstrip("\r")
    if "\t" in first or "," not in first:
        return
    header = not first.split(",")[0].strip().lstrip("-").replace(".", "").isdigit()
    parser.error(f"--format criteo reads tab-separated lines without a header, but "
                 f"{files[0]} starts with {first[:50]!r}... (comma-separated"
                 f"{', with a header line' if header else ''}): use --format criteo_csv "
                 "(Criteo's columns as CSV with a header, as the shared sample), or "
                 "--delimiter/--header/--schema for another layout")


def _refusal(error: "urllib.error.HTTPError") -> str:
    """The predictor's own message in a refused request (TF Serving's {"error": ...})."""
    try:
        body = error.read().decode(errors="replace")
    except OSError:
        body = ""
    try:
        message = json.loads(body).get("error", body)
    except (ValueError, AttributeError):
        message = body
    return str(message).strip() or error.reason


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _replay(args, parser) -> int:
    files, schema = _replay_inputs(args, parser)
    if args.url is not None:
        if args.model_name is not None:
            parser.error("--model_name goes with --grpc; a --url names its model")
        url = args.url.rstrip("/") + ":predict"
        sent = _send_batches(files, schema, args, lambda batch: _predict(url, batch,
                                                                         args.timeout))
        return 1 if sent is None else _print_replay_report(*sent)
    if not args.model_name:
        parser.error("--grpc needs --model_name (the model the requests name)")
    from mxrec.serving.grpc_client import PredictClient, parse_target

    try:
        parse_target(args.grpc)
    except ValueError as error:
        parser.error(f"--grpc: {error}")
    client = PredictClient(args.grpc, args.model_name)
    try:
        sent = _send_batches(files, schema, args, lambda batch: _predict_grpc(
            client, args.grpc, batch, args.timeout))
    finally:
        client.close()
    return 1 if sent is None else _print_replay_report(*sent)


def _predict_grpc(client, target: str, batch: dict, timeout: float):
    """The probabilities the gRPC predictor gives for `batch`; None where it refused or
    could not be reached (said on stderr)."""
    import grpc
    import numpy as np

    inputs = {key: batch[key] for key in ("sparse", "dense") if key in batch}
    try:
        outputs, _ = client.predict(inputs, timeout=timeout)
    except grpc.RpcError as error:
        print(f"replay: {target} refused the call ({error.code().name}): {error.details()}",
              file=sys.stderr)
        return None
    return np.asarray(outputs["prob"], np.float64).reshape(-1)


def _replay_inputs(args, parser):
    """(the data files, the schema) a replay reads; a bad flag or an empty --data ends the
    program through `parser`."""
    if os.path.isdir(args.data):
        files = sorted(os.path.join(args.data, f) for f in os.listdir(args.data)
                       if not f.startswith(("_", ".")))
    elif os.path.isfile(args.data):
        files = [args.data]
    else:
        parser.error(f"--data {args.data!r} is neither a partition folder nor a file")
    if not files:
        parser.error(f"--data {args.data!r} holds no data files")
    if args.max_requests < 1:
        parser.error("--max_requests must be >= 1")
    try:
        schema = _schema(args)
    except ValueError as error:
        parser.error(str(error))
    _check_format(args, files, parser)
    return files, schema


def _send_batches(files: List[str], schema, args, predict):
    """(requests sent, their labels, the predicted probabilities) of up to --max_requests
    batches given to `predict` (a batch -> its probabilities, None where the request
    failed, said on stderr); None where a request failed."""
    import tensorflow as tf

    from mxrec.streaming import parsers

    tf.compat.v1.disable_eager_execution()
    labels, probs = [], []
    requests = 0
    with tf.Graph().as_default():
        batch = tf.compat.v1.data.make_one_shot_iterator(
            parsers.make_dataset(files, schema, args.batch_size)).get_next()
        with tf.compat.v1.Session() as sess:
            while requests < args.max_requests:
                try:
                    out = sess.run(batch)
                except tf.errors.OutOfRangeError:
                    break
                if len(out["label"]) == 0:
                    continue
                prob = predict(out)
                if prob is None:
                    return None
                requests += 1
                labels.append(out["label"])
                probs.append(prob)
    return requests, labels, probs


def _predict(url: str, batch: dict, timeout: float):
    """The probabilities the predictor at `url` gives for `batch`; None where it refused or
    could not be reached (said on stderr)."""
    import numpy as np

    inputs = {"sparse": batch["sparse"].tolist()}
    if "dense" in batch:
        inputs["dense"] = batch["dense"].tolist()
    try:
        answer = _post(url, {"inputs": inputs}, timeout)
    except urllib.error.HTTPError as error:
        print(f"replay: {url} refused the request (HTTP {error.code}): "
              f"{_refusal(error)}", file=sys.stderr)
        return None
    except urllib.error.URLError as error:
        print(f"replay: request to {url} failed: {error}", file=sys.stderr)
        return None
    return np.asarray(answer["outputs"]["prob"], np.float64).reshape(-1)


def _print_replay_report(requests: int, labels: list, probs: list) -> int:
    """Prints the replay's requests, rows, AUC and means as one JSON line; 1 where no
    record was replayed."""
    import numpy as np

    from mxrec.streaming import metrics

    if not labels:
        print("replay: no records", file=sys.stderr)
        return 1
    labels, probs = np.concatenate(labels), np.concatenate(probs)
    print(json.dumps({"requests": requests, "rows": int(len(labels)),
                      "auc": metrics.roc_auc(labels, probs),
                      "mean_prediction": float(probs.mean()),
                      "mean_label": float(labels.mean())}))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    return _train(args, sub) if args.command == "train" else _replay(args, sub)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())

"""python -m mxrec.serving: a TF Serving REST predictor that follows an export base.

    python -m mxrec.serving --export-base DIR --model-name NAME --port P [--grpc-port G]
                            [--host 0.0.0.0]

Serves EXPORT_BASE/<newest valid version>, applies each new version as it appears
(in place for mxrec delta versions, whole for SavedModels), refuses damaged ones and
keeps serving the old; logs a line per version switch (version, how, load time).
A version still being copied is looked at again at the next poll; a damaged one (or
one with an op outside the allowlist, or values that are not finite) once its files
change. Until a version loads, GET /v1/models/NAME answers 404, as TF Serving does.
Answers TF Serving's REST API on --port and, with --grpc-port, its gRPC API
(PredictionService, ModelService) too; --port off leaves REST off.
Listens on 127.0.0.1 unless --host says otherwise (0.0.0.0 in a container).
"""

import argparse
import os
import signal
import sys
import threading
from typing import Optional

_EPILOG = """\
An export base holds numeric version folders, each with the mxrec_version.json manifest
that the streaming trainer (python -m mxrec.streaming train --export-base) or
mxrec.serving.versions.export_version (a model of your own) writes; a folder without it
is refused.

examples:
  python -m mxrec.serving --export-base /serving/ctr --model-name ctr --port 8501
  curl http://127.0.0.1:8501/v1/models/ctr
  curl -d '{"instances": [{"ids": [1, 2]}]}' http://127.0.0.1:8501/v1/models/ctr:predict
  python -m mxrec.serving --export-base /serving/ctr --model-name ctr --port 8501 \
      --grpc-port 8500

guide: docs/SERVING.md (requests, signatures, your own model, operating)
"""


def _port(text: str) -> Optional[int]:
    """A port number 0-65535, or "off" (None)."""
    if text == "off":
        return None
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535 or off, got "
                                         f"{text!r}") from None
    if not 0 <= port < 65536:
        raise argparse.ArgumentTypeError(f"must be 0-65535 or off, got {port}")
    return port


def _add_tensorflow_threads(parser: argparse.ArgumentParser) -> None:
    """TF Serving's flags for TensorFlow's threads (mxrec.serving.session_threads)."""
    parser.add_argument("--threads", "--tensorflow_session_parallelism",
                        "--tensorflow-session-parallelism", dest="threads", type=int,
                        default=0,
                        help="TensorFlow's intra-op and inter-op threads both, for each "
                             "loaded model (0: TensorFlow's defaults)")
    parser.add_argument("--tensorflow_intra_op_parallelism",
                        "--tensorflow-intra-op-parallelism", dest="intra_op", type=int,
                        default=None,
                        help="threads one op may split its work over (0: TensorFlow's "
                             "default, one per core)")
    parser.add_argument("--tensorflow_inter_op_parallelism",
                        "--tensorflow-inter-op-parallelism", dest="inter_op", type=int,
                        default=None,
                        help="ops of one run executed at once (0: TensorFlow's default; -1: "
                             "every op in the thread answering the request, no hand-off to "
                             "TensorFlow's pool: lower latency for a small model)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxrec.serving", description=__doc__,
                                     epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--export-base", "--export_base", dest="export_base", required=True,
                        help="folder of numeric version folders (TF Serving layout)")
    parser.add_argument("--model-name", "--model_name", dest="model_name", required=True,
                        help="NAME in /v1/models/NAME")
    parser.add_argument("--port", type=_port, default=8501,
                        help="REST API's TCP port (8501; 0: any free port, printed; off: no "
                             "REST API)")
    parser.add_argument("--grpc-port", "--grpc_port", dest="grpc_port", type=_port,
                        default=None,
                        help="gRPC API's TCP port (TF Serving's PredictionService and "
                             "ModelService; 0: any free port, printed; default: off)")
    parser.add_argument("--grpc-max-message-bytes", "--grpc_max_message_bytes",
                        dest="grpc_max_message", type=int, default=64 << 20,
                        help="largest gRPC message either way; a larger request is answered "
                             "RESOURCE_EXHAUSTED (64 MiB)")
    parser.add_argument("--grpc-num-threads", "--grpc_num_threads", dest="grpc_threads",
                        type=int, default=None,
                        help="threads answering gRPC calls, a fixed pool (default: 4 per "
                             "usable core)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (127.0.0.1: this machine only; 0.0.0.0: "
                             "every interface, as TF Serving, needed in a container)")
    parser.add_argument("--max-body-bytes", "--max_body_bytes", dest="max_body_bytes",
                        type=int, default=64 << 20,
                        help="largest request body; larger ones get 413 (64 MiB)")
    parser.add_argument("--poll-interval", "--poll_interval", dest="poll_interval", type=float,
                        default=2.0, help="seconds between looks at the export base (2)")
    parser.add_argument("--signature", default="serving_default",
                        help="SavedModel signature to serve (serving_default)")
    _add_tensorflow_threads(parser)
    parser.add_argument("--rest-api-num-threads", "--rest_api_num_threads",
                        dest="num_threads", type=int, default=None,
                        help="threads answering requests, a fixed pool (default: 4 per "
                             "usable core, as TF Serving)")
    parser.add_argument("--rest-api-timeout-in-ms", "--rest_api_timeout_in_ms",
                        dest="timeout_ms", type=int, default=30000,
                        help="a request's whole time from its first byte to its answer, "
                             "model run included; a keep-alive connection idle this long "
                             "is closed (30000)")
    parser.add_argument("--max-queued-requests", "--max_queued_requests", dest="max_queued",
                        type=int, default=None,
                        help="requests that may wait for a free thread, per API; one more "
                             "is answered 503 (gRPC: RESOURCE_EXHAUSTED) at once (default: the "
                             "number of threads)")
    parser.add_argument("--allow-op", "--allow_op", dest="allow_ops", action="append",
                        default=[], metavar="OP",
                        help="an op type a custom model needs beyond those mxrec's exports "
                             "write (repeatable); ops that do I/O are refused")
    parser.add_argument("--max-seconds", "--max_seconds", dest="max_seconds", type=float,
                        default=None, help="stop after this many seconds (default: run until "
                                           "SIGINT/SIGTERM)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    import tensorflow as tf
    from absl import logging

    tf.compat.v1.disable_eager_execution()
    logging.set_verbosity(logging.INFO)  # the version switches
    from mxrec.serving.predictor import Predictor

    try:
        predictor = Predictor(args.export_base, args.signature, args.session_threads,
                              args.allow_ops)
    except ValueError as error:
        parser.error(f"--allow-op: {error}")
    try:  # bind first: a busy port is reported before any model is loaded
        servers = _bind(args, predictor)
    except OSError as error:
        predictor.close()
        print(f"python -m mxrec.serving: error: {error.strerror or error}", file=sys.stderr)
        return 1
    predictor.poll()
    for server in servers:
        server.start()
    _announce(args, predictor, servers)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait(args.max_seconds)
    for server in reversed(servers):  # gRPC first; the REST server closes the predictor
        server.stop()
    if args.port is None:
        predictor.close()
    return 0


def _check_args(parser, args) -> None:
    if not os.path.isdir(args.export_base) and "://" not in args.export_base:
        parser.error(f"--export-base {args.export_base!r} is not a folder")
    if args.port is None and args.grpc_port is None:
        parser.error("--port off needs a --grpc-port: one of the APIs must be on")
    if args.poll_interval <= 0:
        parser.error(f"--poll-interval must be > 0, got {args.poll_interval}")
    if args.max_body_bytes < 1:
        parser.error(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not 1 <= args.grpc_max_message < 1 << 31:
        parser.error(f"--grpc-max-message-bytes must be 1 to {(1 << 31) - 1} (gRPC's "
                     f"limit), got {args.grpc_max_message}")
    args.session_threads = _session_threads(parser, args)
    for flag, value in (("--rest-api-num-threads", args.num_threads),
                        ("--grpc-num-threads", args.grpc_threads),
                        ("--rest-api-timeout-in-ms", args.timeout_ms),
                        ("--max-queued-requests", args.max_queued)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")


def _session_threads(parser, args):
    """The sessions' SessionThreads from --threads or the intra-/inter-op flags (not both,
    as TF Serving refuses)."""
    from mxrec.serving.session_threads import SessionThreads

    separate = args.intra_op is not None or args.inter_op is not None
    if separate and args.threads:
        parser.error("either --threads (--tensorflow_session_parallelism) or "
                     "--tensorflow_intra_op_parallelism / --tensorflow_inter_op_parallelism; "
                     "not both")
    try:
        if separate:
            return SessionThreads(args.intra_op or 0, args.inter_op or 0)
        return SessionThreads.of(args.threads)
    except ValueError as error:
        parser.error(str(error))


def _bind(args, predictor) -> list:
    """The servers the flags ask for, bound (REST first, then gRPC), not started; the REST
    server polls the export base, or the gRPC one where REST is off."""
    servers = []
    try:
        if args.port is not None:
            from mxrec.serving.server import ModelServer

            servers.append(ModelServer(
                predictor, args.model_name, args.port, args.poll_interval, host=args.host,
                max_body=args.max_body_bytes, num_threads=args.num_threads,
                timeout=args.timeout_ms / 1000, max_queued=args.max_queued))
        if args.grpc_port is not None:
            from mxrec.serving.grpc_server import GrpcServer

            servers.append(GrpcServer(
                predictor, args.model_name, args.grpc_port, host=args.host,
                max_message=args.grpc_max_message, num_threads=args.grpc_threads,
                max_queued=args.max_queued,
                poll_interval=args.poll_interval if args.port is None else None))
    except OSError:
        for server in servers:  # bound, never started: its listener goes
            server.close()
        raise
    return servers


def _announce(args, predictor, servers) -> None:
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    which = (f"version {predictor.version}" if predictor.version is not None else
             "(no version yet: its status answers 404 until one loads)")
    for server in servers:
        if hasattr(server, "max_body"):
            where = f"http://{shown}:{server.port}/v1/models/{args.model_name}"
        else:
            where = f"grpc://{shown}:{server.port} (model {args.model_name})"
        print(f"serving {args.model_name} {which} on {where} (listening on "
              f"{args.host or '0.0.0.0'}, {server.num_threads} threads)", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())

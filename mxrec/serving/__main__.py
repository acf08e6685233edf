"""python -m mxrec.serving: a TF Serving REST predictor that follows an export base.

    python -m mxrec.serving --export-base DIR --model-name NAME --port P

Serves EXPORT_BASE/<newest valid version>, applies each new version as it appears
(in place for mxrec delta versions, whole for SavedModels), refuses damaged ones and
keeps serving the old. Listens on 127.0.0.1 only.
"""

import argparse
import os
import signal
import sys
import threading


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxrec.serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--export-base", "--export_base", dest="export_base", required=True,
                        help="folder of numeric version folders (TF Serving layout)")
    parser.add_argument("--model-name", "--model_name", dest="model_name", required=True,
                        help="NAME in /v1/models/NAME")
    parser.add_argument("--port", type=int, default=8501,
                        help="TCP port on 127.0.0.1 (8501; 0: any free port, printed)")
    parser.add_argument("--poll-interval", "--poll_interval", dest="poll_interval", type=float,
                        default=2.0, help="seconds between looks at the export base (2)")
    parser.add_argument("--signature", default="serving_default",
                        help="SavedModel signature to serve (serving_default)")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow threads per loaded model (0: default)")
    parser.add_argument("--max-seconds", "--max_seconds", dest="max_seconds", type=float,
                        default=None, help="stop after this many seconds (default: run until "
                                           "SIGINT/SIGTERM)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not os.path.isdir(args.export_base) and "://" not in args.export_base:
        parser.error(f"--export-base {args.export_base!r} is not a folder")
    if not 0 <= args.port < 65536:
        parser.error(f"--port must be 0-65535, got {args.port}")
    if args.poll_interval <= 0:
        parser.error(f"--poll-interval must be > 0, got {args.poll_interval}")
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    from mxrec.serving.predictor import Predictor
    from mxrec.serving.server import ModelServer

    predictor = Predictor(args.export_base, args.signature, args.threads)
    predictor.poll()
    server = ModelServer(predictor, args.model_name, args.port, args.poll_interval).start()
    print(f"serving {args.model_name} version {predictor.version} on "
          f"http://127.0.0.1:{server.port}/v1/models/{args.model_name}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait(args.max_seconds)
    server.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())

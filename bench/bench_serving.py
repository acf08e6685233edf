"""Serving latency and throughput: mxrec's predictor over TF Serving's REST and gRPC APIs,
against the floor of the same SavedModel's session.run in one process.

    PYTHONPATH=. .venv/bin/python bench/bench_serving.py [--seconds 6] [--batches 1,64,512]
    PYTHONPATH=. .venv/bin/python bench/bench_serving.py --quick --json serving.json

A wide_deep model (26 Criteo tables x dim 8, hidden 64-32) is trained on one synthetic
Criteo partition and exported; `python -m mxrec.serving --port 0 --grpc-port 0` serves it
in a process of its own. For each batch size (rows of the partition, parsed as the
trainer parses them) and 1 and 8 client threads, each client sends requests back to back
for --seconds, split into --rounds rounds taken in turn with the floor and the other API
(so that other work on the machine falls on all three alike): REST with a pre-encoded JSON
body on a keep-alive connection, gRPC with a pre-built PredictRequest on one channel per
client (TF Serving's stubs). The floor is the
SavedModel loaded by plain TensorFlow in this process, its signature run by the same
number of threads. Printed per cell: p50 and p99 latency (ms), requests/s, rows/s, and p99
over the floor's p99 at the same batch and threads. Clients and server share this
machine's cores, so at 8 threads the client's own work is part of what is measured.

The transport floors say what part of the gap any Python server pays: a process of its own
answers each request with mxrec's own answer to it, recorded once (the same bytes, no model
and no conversion): over gRPC, a grpcio server with the predictor's thread pool, limits and
service name, handling raw bytes (not even the request is parsed); over REST, the standard
library's ThreadingHTTPServer (HTTP/1.1 keep-alive, the body read whole). The clients are
the same as against mxrec (the same requests, the answers decoded), in the same rounds.

Goals (1 client thread, batch 64): gRPC p99 <= 2 x the floor's p99, REST p99 <= 3 x. A p99
is the first figure other work on a shared machine moves (it can inflate the floor's more
than an API's): read the goals with the run's load average, and the p50 ratios beside them.
"""

import argparse
import http.client
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

from bench import report  # noqa: E402
from bench.bench_streaming import MODEL, _hourly_stream, _streaming, machine  # noqa: E402
from mxrec.serving import grpc_server  # noqa: E402
from mxrec.serving.grpc_client import PredictClient  # noqa: E402
from mxrec.serving.session_threads import SessionThreads  # noqa: E402
from mxrec.streaming import models, parsers  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_THREADS = SessionThreads()  # TensorFlow's defaults


def _export(root: str, rows: int) -> str:
    """Trains one partition and returns the export base (version 1)."""
    _hourly_stream(os.path.join(root, "data"), 1, rows)
    base = os.path.join(root, "export")
    _streaming(os.path.join(root, "data"), os.path.join(root, "work"), 512, 0,
               export_base=base, model=models.ModelConfig(**MODEL))
    return base


def _queries(root: str, rows: int) -> dict:
    """{"sparse": int64 [rows, 26], "dense": float32 [rows, 13]}: the partition's first
    rows, parsed and hashed as the trainer does."""
    folder = os.path.join(root, "data", "20240101", "00")
    files = [os.path.join(folder, "part-00000")]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        batch = sess.run(tf.compat.v1.data.make_one_shot_iterator(
            parsers.make_dataset(files, parsers.CRITEO_TSV, rows)).get_next())
    return {"sparse": batch["sparse"], "dense": batch["dense"]}


def _drive(call, threads: int, seconds: float) -> list:
    """Runs `call(thread_index)` back to back on `threads` threads for `seconds` (after one
    warm-up call each); returns [latencies in ms, elapsed seconds]."""
    for index in range(threads):
        call(index)
    latencies = [[] for _ in range(threads)]
    failures = []
    start = time.perf_counter()
    end = start + seconds

    def loop(index):
        own = latencies[index]
        try:
            while time.perf_counter() < end:
                begun = time.perf_counter()
                call(index)
                own.append(time.perf_counter() - begun)
        except Exception as error:  # noqa: BLE001 (reported, fails the run below)
            failures.append(repr(error))

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise RuntimeError(f"{len(failures)} client(s) failed: {failures[0]}")
    return [np.concatenate([np.asarray(x) for x in latencies]) * 1000,
            time.perf_counter() - start]


def _summary(runs: list) -> dict:
    """p50/p99 (ms) and requests/s over the rounds' latencies pooled."""
    every = np.concatenate([latencies for latencies, _ in runs])
    return {"p50": float(np.percentile(every, 50)), "p99": float(np.percentile(every, 99)),
            "rps": len(every) / sum(seconds for _, seconds in runs), "count": int(len(every))}


def _floor(export_dir: str, threads: SessionThreads = DEFAULT_THREADS):
    """A call(index, feeds) running the SavedModel's signature in this process, its session
    with the predictor's thread settings."""
    graph = tf.Graph()
    sess = tf.compat.v1.Session(graph=graph, config=threads.config())
    with graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
    sig = meta.signature_def["serving_default"]
    outputs = {k: v.name for k, v in sig.outputs.items()}
    names = {k: v.name for k, v in sig.inputs.items()}
    return lambda feeds: sess.run(outputs, {names[k]: v for k, v in feeds.items()}), sess


def _start_server(base: str, threads: SessionThreads = DEFAULT_THREADS):
    """python -m mxrec.serving in a process of its own; (process, REST port, gRPC port)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p), TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(
        [sys.executable, "-m", "mxrec.serving", "--export-base", base, "--model-name", "ctr",
         "--port", "0", "--grpc-port", "0", "--poll-interval", "60",
         "--tensorflow_intra_op_parallelism", str(threads.intra_op),
         "--tensorflow_inter_op_parallelism", str(threads.inter_op)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    lines = [process.stdout.readline() for _ in range(2)]
    if not all("serving ctr version 1" in line for line in lines):
        process.kill()
        raise RuntimeError(f"the predictor did not start: {lines}")
    rest = int(lines[0].split("http://127.0.0.1:")[1].split("/")[0])
    grpc_port = int(lines[1].split("grpc://127.0.0.1:")[1].split(" ")[0])
    return process, rest, grpc_port


def _record_answers(rest_port: int, grpc_port: int, batches: list, queries: dict) -> dict:
    """mxrec's own answers, as bytes, keyed by the request's bytes: {"REST": {body: answer},
    "gRPC": {request: response}}, for the transport floors to send back."""
    answers = {"REST": {}, "gRPC": {}}
    connection = http.client.HTTPConnection("127.0.0.1", rest_port, timeout=60)
    client = PredictClient(f"127.0.0.1:{grpc_port}", "ctr")
    predict = client.channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    try:
        for batch in batches:
            feeds = {k: v[:batch] for k, v in queries.items()}
            body = _rest_body(feeds)
            connection.request("POST", "/v1/models/ctr:predict", body=body,
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answers["REST"][body] = (response.read(), response.getheader("X-Model-Version"))
            request = client.request(feeds).SerializeToString()
            answers["gRPC"][request] = predict(request, timeout=60)
    finally:
        connection.close()
        client.close()
    return answers


class _FixedAnswer(BaseHTTPRequestHandler):
    """The REST transport floor's handler: reads the body, sends the recorded answer."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as the predictor's sockets (TCP_NODELAY)
    answers: dict = {}

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        data, version = self.answers[body]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Model-Version", version)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):  # noqa: A002 (http.server's name)
        pass


def _serve_floors(path: str) -> None:
    """The transport floors (--serve-floors): the answers recorded in `path` sent back over
    gRPC (the predictor's pool size, limits and method name; raw bytes in and out) and over
    REST (ThreadingHTTPServer); prints "PORTS <REST> <gRPC>" and serves until killed."""
    with open(path, "rb") as f:
        answers = pickle.load(f)
    threads = grpc_server._default_threads()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads), maximum_concurrent_rpcs=2 * threads,
        options=[("grpc.max_receive_message_length", grpc_server.MAX_MESSAGE),
                 ("grpc.max_send_message_length", grpc_server.MAX_MESSAGE)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "tensorflow.serving.PredictionService",
        {"Predict": grpc.unary_unary_rpc_method_handler(
            lambda request, _: answers["gRPC"][request])}),))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _FixedAnswer.answers = answers["REST"]
    http = ThreadingHTTPServer(("127.0.0.1", 0), _FixedAnswer)
    print(f"PORTS {http.server_address[1]} {grpc_port}", flush=True)
    http.serve_forever()


def _start_floors(answers: dict, root: str):
    """The transport floors in a process of their own; (process, REST port, gRPC port)."""
    path = os.path.join(root, "answers.pickle")
    with open(path, "wb") as f:
        pickle.dump(answers, f)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p), TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-floors",
                                path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env=env)
    line = process.stdout.readline()
    if not line.startswith("PORTS "):
        process.kill()
        raise RuntimeError(f"the transport floors did not start: {line!r}")
    _, rest, grpc_port = line.split()
    return process, int(rest), int(grpc_port)


def _rest_body(feeds: dict) -> bytes:
    return json.dumps({"inputs": {k: v.tolist() for k, v in feeds.items()}}).encode()


def _rest_caller(port: int, threads: int, feeds: dict):
    body = _rest_body(feeds)
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                   for _ in range(threads)]

    def call(index):
        connection = connections[index]
        connection.request("POST", "/v1/models/ctr:predict", body=body,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
        json.loads(data)

    return call, lambda: [c.close() for c in connections]


def _grpc_caller(port: int, threads: int, feeds: dict):
    clients = [PredictClient(f"127.0.0.1:{port}", "ctr") for _ in range(threads)]
    request = clients[0].request(feeds)

    def call(index):
        answer = clients[index].stub.Predict(request, timeout=60)
        tf.make_ndarray(answer.outputs["prob"])

    return call, lambda: [c.close() for c in clients]


def run(args, out: report.Report) -> None:
    with tempfile.TemporaryDirectory() as root:
        base = _export(root, args.rows)
        queries = _queries(root, max(args.batches))
        floor, floor_session = _floor(os.path.join(base, "1"), args.tensorflow_threads)
        processes = []
        try:
            process, rest_port, grpc_port = _start_server(base, args.tensorflow_threads)
            processes.append(process)
            answers = _record_answers(rest_port, grpc_port, args.batches, queries)
            process, floor_rest, floor_grpc = _start_floors(answers, root)
            processes.append(process)
            ports = {"REST floor": floor_rest, "REST": rest_port, "gRPC floor": floor_grpc,
                     "gRPC": grpc_port}
            rows = _measure(args, queries, floor, ports)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=60)
            floor_session.close()
    _print(args, rows, out)


APIS = ("floor", "REST floor", "REST", "gRPC floor", "gRPC")


def _measure(args, queries, floor, ports: dict) -> list:
    """Per batch and thread count, --rounds rounds of the floor, each API's transport floor
    and each API in turn (so that the other work on the machine falls on all alike),
    latencies pooled."""
    rows = []
    for batch in args.batches:
        feeds = {k: v[:batch] for k, v in queries.items()}
        for threads in args.threads:
            callers = {"floor": (lambda _, f=feeds: floor(f), lambda: None)}
            for api in APIS[1:]:
                make = _rest_caller if api.startswith("REST") else _grpc_caller
                callers[api] = make(ports[api], threads, feeds)
            runs = {api: [] for api in callers}
            try:
                for _ in range(args.rounds):
                    for api, (call, _) in callers.items():
                        runs[api].append(_drive(call, threads, args.seconds / args.rounds))
            finally:
                for _, close in callers.values():
                    close()
            rows.append((batch, threads, {api: _summary(r) for api, r in runs.items()}))
    return rows


def _print(args, rows, out: report.Report) -> None:
    threads = args.tensorflow_threads
    print(f"\n### Serving: REST and gRPC against session.run (wide_deep, 26 tables x dim 8, "
          f"{args.seconds:g} s per cell in {args.rounds} rounds; TensorFlow threads intra-op "
          f"{threads.intra_op}, inter-op {threads.inter_op}; {machine()})\n")
    print("| API | batch | client threads | p50 ms | p99 ms | requests/s | rows/s | "
          "p50 / floor p50 | p99 / floor p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, threads, cells in rows:
        floor_p50, floor_p99 = cells["floor"]["p50"], cells["floor"]["p99"]
        for api in APIS:
            cell = cells[api]
            name = {"floor": "session.run (floor)", "REST floor": "REST transport floor",
                    "gRPC floor": "gRPC transport floor"}.get(api, api)
            print(f"| {name} | {batch} | {threads} | {cell['p50']:.2f} | {cell['p99']:.2f} | "
                  f"{cell['rps']:.0f} | {cell['rps'] * batch:.0f} | "
                  f"{cell['p50'] / floor_p50:.2f} | {cell['p99'] / floor_p99:.2f} |")
            key = f"{api.lower().replace(' floor', ' transport floor')} batch {batch} " \
                  f"threads {threads}"
            out.figure(f"{key} p50 ms", round(cell["p50"], 3))
            out.figure(f"{key} p99 ms", round(cell["p99"], 3))
            out.figure(f"{key} requests/s", round(cell["rps"], 1))
        if batch == 64 and threads == 1:
            out.goal("gRPC p99 / session.run p99, batch 64, 1 client thread (<=)",
                     cells["gRPC"]["p99"] / floor_p99, 2.0, lower_is_better=True)
            out.goal("REST p99 / session.run p99, batch 64, 1 client thread (<=)",
                     cells["REST"]["p99"] / floor_p99, 3.0, lower_is_better=True)
            # What any Python server of that transport pays, against the same floor; and
            # the p50 ratios, which other work on a shared machine moves less than p99's.
            for api in ("gRPC floor", "REST floor", "gRPC", "REST"):
                name = api.replace(" floor", " transport floor")
                if api.endswith("floor"):  # the APIs' own p99 ratios are the goals
                    out.figure(f"{name} p99 / session.run p99, batch 64, 1 client thread",
                               round(cells[api]["p99"] / floor_p99, 3))
                out.figure(f"{name} p50 / session.run p50, batch 64, 1 client thread",
                           round(cells[api]["p50"] / floor_p50, 3))


def _ints(text: str) -> list:
    values = [int(v) for v in text.split(",") if v]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _threads(text: str) -> SessionThreads:
    try:
        intra, inter = (int(v) for v in text.split(","))
        return SessionThreads(intra, inter)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected INTRA,INTER (as 1,-1), got {text!r}: "
                                         f"{error}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None,
                        help="seconds of requests per cell, over its rounds (6; --quick 1)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per cell, the floor, the transport floors, REST and gRPC "
                        "in turn (3; --quick 1)")
    parser.add_argument("--batches", type=_ints, default=[1, 64, 512],
                        help="batch sizes (1,64,512); 64 carries the goals")
    parser.add_argument("--threads", type=_ints, default=[1, 8],
                        help="client threads (1,8); 1 carries the goals")
    parser.add_argument("--rows", type=int, default=None,
                        help="rows of the trained partition (30000; --quick 8000)")
    parser.add_argument("--tensorflow-threads", type=_threads, default=DEFAULT_THREADS,
                        metavar="INTRA,INTER",
                        help="the predictor's and the floor's TensorFlow threads, as "
                        "python -m mxrec.serving --tensorflow_intra_op_parallelism and "
                        "--tensorflow_inter_op_parallelism (0,0: TensorFlow's defaults; "
                        "1,-1: each run in the request's thread)")
    parser.add_argument("--serve-floors", metavar="ANSWERS",
                        help="(run by this benchmark) serve the transport floors")
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.serve_floors:
        _serve_floors(args.serve_floors)
        return 0
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 6.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.rows is None:
        args.rows = 8000 if args.quick else 30000
    if not args.seconds > 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    if args.rows < max(args.batches):
        parser.error(f"--rows ({args.rows}) must hold the largest batch ({max(args.batches)})")
    out = report.Report()
    run(args, out)
    out.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

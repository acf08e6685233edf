"""TF Serving's gRPC API on mxrec's predictor, called through TF Serving's own Python client
stubs (`tensorflow_serving.apis`): the answers REST gives and the SavedModel gives offline,
metadata and status as TF Serving returns them, each bad input with its status code while
the server keeps serving, clients during deliveries, the CLI's --grpc-port and
`replay --grpc`."""

import json
import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_streams import hashed, publish_copy, raw_instances, read_rows, request, train, write
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from mxrec.serving import calls, tensors
from mxrec.serving.__main__ import main as serving_main
from mxrec.serving.grpc_server import GrpcServer, PortInUseError
from mxrec.serving.predictor import Predictor
from mxrec.serving.requests import RequestError
from mxrec.serving.server import ModelServer
from mxrec.serving.session_threads import SessionThreads
from mxrec.streaming.trainer import RAW_SIGNATURE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTITIONS = [f"20240101/{hour:02d}" for hour in range(4)]
LIMIT = 1 << 20  # the test servers' message limit: a "huge" message stays cheap to send


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """Four versions of a trained stream (full, then deltas with their SavedModels)."""
    root = tmp_path_factory.mktemp("grpc")
    write(root / "data", PARTITIONS, rows=80)
    train(root / "data", root / "work", root / "export")
    rows = read_rows(str(root / "data" / PARTITIONS[-1]))[:16]
    return root, rows


@pytest.fixture
def served(stream, tmp_path):
    """Version 1 served over REST and gRPC by one predictor; yields (rest port, channel,
    grpc server, base)."""
    root, _ = stream
    base = tmp_path / "base"
    base.mkdir()
    publish_copy(root / "export", base, 1)
    predictor = Predictor(str(base))
    predictor.poll()
    rest = ModelServer(predictor, "ctr", port=0, poll_interval=None).start()
    server = GrpcServer(predictor, "ctr", port=0, max_message=LIMIT, num_threads=8).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield rest.port, channel, server, base
    finally:
        channel.close()
        server.stop()
        rest.stop()


def _request(inputs, signature="", version=None, label="", model="ctr", filters=()):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label:
        request.model_spec.version_label = label
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(value if isinstance(value, tensor_pb2.TensorProto)
                                     else tf.make_tensor_proto(value))
    request.output_filter.extend(filters)
    return request


def _predict(channel, request, timeout=30):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
        request, timeout=timeout)


def _refused(channel, request, code, *words, timeout=30):
    with pytest.raises(grpc.RpcError) as caught:
        _predict(channel, request, timeout)
    assert caught.value.code() == code, caught.value.details()
    for word in words:
        assert word in caught.value.details(), (word, caught.value.details())
    return caught.value.details()


def _offline(export_dir, signature, feeds):
    """The SavedModel's own answer under plain TensorFlow (no mxrec)."""
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(export_dir))
        sig = meta.signature_def[signature]
        return sess.run({k: v.name for k, v in sig.outputs.items()},
                        {sig.inputs[k].name: v for k, v in feeds.items()})


def test_answers_equal_rest_and_the_saved_model_offline(stream, served):
    root, rows = stream
    port, channel, _, _ = served
    query = hashed(rows)
    answer = _predict(channel, _request(query))
    assert (answer.model_spec.name, answer.model_spec.version.value,
            answer.model_spec.signature_name) == ("ctr", 1, "serving_default")
    got = {k: tf.make_ndarray(v) for k, v in answer.outputs.items()}
    code, headers, body = request(port, "POST", "/v1/models/ctr:predict", {"inputs": {
        k: v.tolist() for k, v in query.items()}})
    assert code == 200 and headers["X-Model-Version"] == "1"
    offline = _offline(root / "export" / "1", "serving_default", query)
    assert sorted(got) == sorted(body["outputs"]) == sorted(offline)
    for key, value in got.items():
        np.testing.assert_array_equal(value, np.asarray(body["outputs"][key], value.dtype))
        np.testing.assert_array_equal(value, offline[key])
    # The raw-feature signature: strings and floats as the data holds them.
    columns = {k: [r[k] for r in raw_instances(rows)] for k in ("d0", "d1", "c0", "c1", "c2")}
    raw = {k: np.array(v, np.float32 if k.startswith("d") else object)
           for k, v in columns.items()}
    answer = _predict(channel, _request(raw, RAW_SIGNATURE))
    assert answer.model_spec.signature_name == RAW_SIGNATURE
    code, _, body = request(port, "POST", "/v1/models/ctr:predict", {
        "signature_name": RAW_SIGNATURE, "inputs": columns})
    assert code == 200
    offline = _offline(root / "export" / "1", RAW_SIGNATURE, raw)
    for key, value in answer.outputs.items():
        value = tf.make_ndarray(value)
        np.testing.assert_array_equal(value, np.asarray(body["outputs"][key], value.dtype))
        np.testing.assert_array_equal(value, offline[key])
    # output_filter: only the outputs asked for.
    some = sorted(got)[:1]
    answer = _predict(channel, _request(query, filters=some))
    assert sorted(answer.outputs) == some
    np.testing.assert_array_equal(tf.make_ndarray(answer.outputs[some[0]]), got[some[0]])


@pytest.mark.parametrize("threads", [SessionThreads(intra_op=1, inter_op=-1),
                                     SessionThreads(intra_op=2, inter_op=1), 3])
def test_tensorflow_thread_settings_answer_as_the_saved_model_offline(stream, tmp_path,
                                                                     threads):
    """TF Serving's --tensorflow_intra_op_parallelism / --tensorflow_inter_op_parallelism
    (-1: the request's own thread) and --tensorflow_session_parallelism: each session gets
    them, and REST and gRPC answer what the SavedModel answers offline."""
    root, rows = stream
    publish_copy(root / "export", tmp_path, 1)
    predictor = Predictor(str(tmp_path), threads=threads)
    predictor.poll()
    rest = ModelServer(predictor, "ctr", port=0, poll_interval=None).start()
    server = GrpcServer(predictor, "ctr", port=0, num_threads=2).start()
    try:
        expected = SessionThreads.of(threads)
        config = predictor._current.session._config
        assert (config.intra_op_parallelism_threads,
                config.inter_op_parallelism_threads) == (expected.intra_op, expected.inter_op)
        query = hashed(rows)
        offline = _offline(root / "export" / "1", "serving_default", query)
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            for timeout in (None, 30):  # without a deadline, and with one
                answer = _predict(channel, _request(query), timeout=timeout)
                for key, value in offline.items():
                    np.testing.assert_array_equal(tf.make_ndarray(answer.outputs[key]), value)
        code, _, body = request(rest.port, "POST", "/v1/models/ctr:predict", {"inputs": {
            k: v.tolist() for k, v in query.items()}})
        assert code == 200
        for key, value in offline.items():
            np.testing.assert_array_equal(np.asarray(body["outputs"][key], value.dtype), value)
        # A deadline too far for TensorFlow's clock runs as one without a limit.
        far = calls.run(predictor._current, query, "serving_default", time.monotonic() + 1e17,
                        "--flag")
        for key, value in offline.items():
            np.testing.assert_array_equal(far[key], value)
        # A run in the caller's thread is not cut at its timeout: one that ends past the
        # deadline is answered as late all the same.
        instance, original = predictor._current, predictor._current.predict

        def slow(*args, **kwargs):
            time.sleep(0.3)
            return original(*args, **kwargs)

        instance.predict = slow
        with pytest.raises(RequestError) as caught:
            calls.run(instance, query, "serving_default", time.monotonic() + 0.1, "--flag")
        assert caught.value.status == 504 and "within the request's deadline (--flag)" in str(
            caught.value)
    finally:
        server.stop()
        rest.stop()  # and closes the predictor


def test_tensorflow_thread_settings_out_of_range_are_refused_naming_the_flag(tmp_path,
                                                                            capsys):
    for bad, error, words in (
            (dict(inter_op=-2), ValueError, "--tensorflow_inter_op_parallelism must be -1 to"),
            (dict(intra_op=-1), ValueError, "--tensorflow_intra_op_parallelism must be 0 to"),
            (dict(intra_op=1 << 20), ValueError, "--tensorflow_intra_op_parallelism"),
            (dict(inter_op=1.5), TypeError, "--tensorflow_inter_op_parallelism must be an "
                                            "integer"),
            (dict(intra_op=True), TypeError, "--tensorflow_intra_op_parallelism")):
        with pytest.raises(error, match=words):
            SessionThreads(**bad)
    for bad, error in ((-1, ValueError), ("4", TypeError)):
        with pytest.raises(error, match="--tensorflow_session_parallelism"):
            Predictor(str(tmp_path), threads=bad)
    base = ["--export-base", str(tmp_path), "--model-name", "ctr", "--port", "0"]
    for flags, words in (
            (["--tensorflow_inter_op_parallelism", "-2"],
             "--tensorflow_inter_op_parallelism must be -1 to 16384"),
            (["--tensorflow-intra-op-parallelism=-1"],
             "--tensorflow_intra_op_parallelism must be 0 to 16384"),
            (["--tensorflow_session_parallelism", "-3"],
             "--tensorflow_session_parallelism (--threads) must be 0 to 16384"),
            (["--threads", "2", "--tensorflow_inter_op_parallelism", "-1"],
             "either --threads (--tensorflow_session_parallelism) or"),
            (["--tensorflow_inter_op_parallelism", "many"], "invalid int value: 'many'")):
        with pytest.raises(SystemExit) as caught:
            serving_main(base + flags)
        assert caught.value.code == 2
        assert words in capsys.readouterr().err, flags


def test_the_guides_client_snippet(served, capsys):
    port = served[2].port
    with open(os.path.join(REPO, "docs", "SERVING_GRPC.md")) as f:
        guide = f.read()
    section = guide[guide.index("## Run it"):]
    block = section[section.index("```python") + len("```python"):]
    block = block[:block.index("```")]
    exec(compile(block.replace("127.0.0.1:8500", f"127.0.0.1:{port}"), "SERVING.md", "exec"),
         {})
    version, prob = capsys.readouterr().out.split(" ", 1)
    assert version == "1" and "[" in prob


def test_metadata_and_status_as_tf_serving_returns_them(stream, served):
    root, _ = stream
    _, channel, _, _ = served
    meta = get_model_metadata_pb2.GetModelMetadataRequest()
    meta.model_spec.name = "ctr"
    meta.metadata_field.append("signature_def")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    answer = stub.GetModelMetadata(meta, timeout=30)
    assert (answer.model_spec.name, answer.model_spec.version.value) == ("ctr", 1)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert answer.metadata["signature_def"].Unpack(signatures)
    saved = tf.compat.v1.saved_model.loader  # the SavedModel's own signature defs
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        expected = saved.load(sess, ["serve"], str(root / "export" / "1")).signature_def
    assert set(signatures.signature_def) == {"serving_default", RAW_SIGNATURE}
    for name, signature in signatures.signature_def.items():
        assert signature == expected[name], name
    for fields, words in (([], "at least one metadata_field"), (["nope"], "nope")):
        bad = get_model_metadata_pb2.GetModelMetadataRequest()
        bad.model_spec.name = "ctr"
        bad.metadata_field.extend(fields)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetModelMetadata(bad, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in \
            caught.value.details()

    models = model_service_pb2_grpc.ModelServiceStub(channel)
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "ctr"
    answer = models.GetModelStatus(status, timeout=30)
    [entry] = answer.model_version_status
    assert entry.version == 1 and entry.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert entry.status.error_code == 0 and entry.status.error_message == ""
    status.model_spec.version.value = 1
    assert models.GetModelStatus(status, timeout=30).model_version_status[0].version == 1
    for name, version, words in (("ctr", 7, "Could not find version 7 of model ctr"),
                                 ("other", None, "Could not find any versions of model other")):
        status = get_model_status_pb2.GetModelStatusRequest()
        status.model_spec.name = name
        if version is not None:
            status.model_spec.version.value = version
        with pytest.raises(grpc.RpcError) as caught:
            models.GetModelStatus(status, timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND and words in \
            caught.value.details()


def _bad_requests(query):
    """(request, status code, words its message must hold) for each bad input."""
    code = grpc.StatusCode
    sparse, dense = query["sparse"], query["dense"]
    huge = tf.make_tensor_proto(np.zeros([LIMIT // 8 + 1024, 3], np.int64))
    declared = tensor_pb2.TensorProto(dtype=tf.int64.as_datatype_enum, int64_val=[1])
    declared.tensor_shape.dim.add(size=1 << 40)
    declared.tensor_shape.dim.add(size=3)
    nan = dense.copy()
    nan[3, 1] = np.nan
    return [
        (_request({"sparse": sparse.astype(np.float32), "dense": dense}),
         code.INVALID_ARGUMENT, ["'sparse'", "int64", "float32"]),
        (_request({"sparse": sparse[:, :2], "dense": dense}), code.INVALID_ARGUMENT,
         ["'sparse'", "shape"]),
        (_request({"sparse": sparse, "dense": dense, "extra": dense}), code.INVALID_ARGUMENT,
         ["unknown ['extra']"]),
        (_request({"sparse": sparse}), code.INVALID_ARGUMENT, ["missing ['dense']"]),
        (_request({"sparse": sparse, "dense": dense[:3]}), code.INVALID_ARGUMENT,
         ["batch sizes"]),
        (_request({"sparse": sparse, "dense": nan}), code.INVALID_ARGUMENT,
         ["'dense', row 3", "not finite"]),
        (_request({"sparse": huge, "dense": dense}), code.RESOURCE_EXHAUSTED, []),
        (_request({"sparse": declared, "dense": dense}), code.RESOURCE_EXHAUSTED,
         ["'sparse'", "--grpc-max-message-bytes"]),
        (_request(query, signature="nope"), code.INVALID_ARGUMENT, ["nope"]),
        (_request(query, filters=["nope"]), code.INVALID_ARGUMENT,
         ["output tensor alias not found in signature: nope"]),
        (_request(query, model="other"), code.NOT_FOUND, ["Latest(other)"]),
        (_request(query, version=9), code.NOT_FOUND, ["Specific(ctr, 9)"]),
        (_request(query, label="stable"), code.INVALID_ARGUMENT,
         ["Unrecognized servable version label: stable"]),
    ]


def test_bad_inputs_each_get_their_code_and_the_server_keeps_serving(stream, served):
    _, rows = stream
    _, channel, _, _ = served
    query = hashed(rows)
    good = _predict(channel, _request(query))
    for bad, code, words in _bad_requests(query):
        _refused(channel, bad, code, *words)
        assert _predict(channel, _request(query)) == good  # still serving, same answer
    # An expired deadline: test_a_call_whose_deadline_passed_waiting_is_not_computed.


def test_a_call_whose_deadline_passed_waiting_is_not_computed(served):
    _, _, _, base = served
    predictor = Predictor(str(base))
    predictor.poll()
    server = GrpcServer(predictor, "ctr", port=0, num_threads=1).start()
    instance = predictor._current
    runs, original = [], instance.predict

    def slow(*args, **kwargs):  # the first call holds the one handler thread
        runs.append(time.monotonic())
        if len(runs) == 1:
            time.sleep(1.0)
        return original(*args, **kwargs)

    instance.predict = slow
    query = {"sparse": np.array([[1, 2, 3]], np.int64), "dense": np.zeros([1, 2], np.float32)}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            first = threading.Thread(target=_predict, args=(channel, _request(query)))
            first.start()
            time.sleep(0.2)
            _refused(channel, _request(query), grpc.StatusCode.DEADLINE_EXCEEDED, timeout=0.3)
            first.join()
            _predict(channel, _request(query))
        assert len(runs) == 2  # the first call and the last: never the expired one
        # The server's own check, where the runtime hands over a call already late.
        for late in (lambda: server.predict(_request(query), time.monotonic() - 0.01),
                     lambda: calls.run(instance, query, "serving_default",
                                       time.monotonic() - 0.01, "the client's deadline")):
            with pytest.raises(RequestError) as caught:
                late()
            assert caught.value.status == 504 and "deadline passed" in str(caught.value)
        assert len(runs) == 2
    finally:
        server.stop()
        predictor.close()


def test_a_call_beyond_threads_and_queue_is_refused_at_once(served):
    _, _, _, base = served
    predictor = Predictor(str(base))
    predictor.poll()
    server = GrpcServer(predictor, "ctr", port=0, num_threads=1, max_queued=0).start()
    instance, started = predictor._current, threading.Event()
    original = instance.predict

    def slow(*args, **kwargs):
        started.set()
        time.sleep(1.0)
        return original(*args, **kwargs)

    instance.predict = slow
    query = {"sparse": np.array([[1, 2, 3]], np.int64), "dense": np.zeros([1, 2], np.float32)}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            first = threading.Thread(target=_predict, args=(channel, _request(query)))
            first.start()
            assert started.wait(30)
            begun = time.monotonic()
            _refused(channel, _request(query), grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert time.monotonic() - begun < 0.9  # at once, not after the busy call
            first.join()
            instance.predict = original
            _predict(channel, _request(query))
    finally:
        server.stop()
        predictor.close()


def test_unavailable_before_a_version_loads_then_its_own_poll_serves_it(stream, tmp_path):
    root, rows = stream
    predictor = Predictor(str(tmp_path))
    predictor.poll()
    # Its own poll thread: what python -m mxrec.serving --port off runs.
    server = GrpcServer(predictor, "ctr", port=0, num_threads=2, poll_interval=0.1).start()
    try:
        with pytest.raises(PortInUseError, match="--grpc-port"):
            GrpcServer(predictor, "ctr", port=server.port)
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            _refused(channel, _request({"sparse": np.ones([1, 3], np.int64)}),
                     grpc.StatusCode.UNAVAILABLE, "no model version is loaded")
            status = get_model_status_pb2.GetModelStatusRequest()
            status.model_spec.name = "ctr"
            with pytest.raises(grpc.RpcError) as caught:
                model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            publish_copy(root / "export", tmp_path, 1)
            for _ in range(300):
                if predictor.version == 1:
                    break
                time.sleep(0.1)
            answer = _predict(channel, _request(hashed(rows)))
            assert answer.model_spec.version.value == 1
    finally:
        server.stop()
        predictor.close()
    with pytest.raises(ValueError, match="max_message"):
        GrpcServer(predictor, "ctr", port=0, max_message=0)


def _versions_reference(root, query):
    """Each version's answer, from a predictor given the versions one by one."""
    base = root / "reference"
    base.mkdir(exist_ok=True)
    predictor = Predictor(str(base))
    out = {}
    for version in range(1, len(PARTITIONS) + 1):
        if not (base / str(version)).exists():
            os.symlink(root / "export" / str(version), base / str(version))
        assert predictor.poll() == version
        out[version] = predictor.predict(query)[0]["prob"]
    predictor.close()
    return out


def test_eight_clients_during_three_deliveries(stream, served):
    root, rows = stream
    _, channel, server, base = served
    query = hashed(rows)
    reference = _versions_reference(root, query)
    stop = threading.Event()
    seen = [[] for _ in range(8)]
    errors = []

    def client(index):
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as own:
            while not stop.is_set():
                try:
                    answer = _predict(own, _request(query))
                except grpc.RpcError as error:
                    errors.append(f"{error.code()}: {error.details()}")
                    continue
                seen[index].append((answer.model_spec.version.value,
                                    tf.make_ndarray(answer.outputs["prob"])))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        for version in range(2, len(PARTITIONS) + 1):
            time.sleep(0.3)
            publish_copy(root / "export", base, version)
            assert server.predictor.poll() == version
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    versions = set()
    for answers in seen:
        order = [v for v, _ in answers]
        assert order == sorted(order)  # no older version's answer after a newer one's
        versions.update(order)
        for version, prob in answers:
            np.testing.assert_array_equal(prob, reference[version])
    assert versions == {1, 2, 3, 4}


def _replay(data, target, *extra):
    from test_streaming_trainer import SCHEMA_SPEC

    result = subprocess.run(
        [sys.executable, "-m", "mxrec.streaming", "replay", "--data", str(data), *target,
         "--schema", SCHEMA_SPEC, "--batch_size", "30", *extra],
        capture_output=True, text=True, timeout=180,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (REPO, os.environ.get("PYTHONPATH")) if p), TF_CPP_MIN_LOG_LEVEL="3"))
    return result


def test_cli_grpc_port_and_replay_over_grpc(stream, tmp_path, capsys):
    root, _ = stream
    base = tmp_path / "base"
    base.mkdir()
    publish_copy(root / "export", base, 1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p), TF_CPP_MIN_LOG_LEVEL="3")
    server = subprocess.Popen(
        [sys.executable, "-m", "mxrec.serving", "--export-base", str(base), "--model-name",
         "ctr", "--port", "0", "--grpc-port", "0", "--max-seconds", "120",
         # The model in the request's thread: what a latency-bound predictor runs.
         "--tensorflow_intra_op_parallelism", "1", "--tensorflow_inter_op_parallelism", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [server.stdout.readline() for _ in range(2)]
        assert "http://" in lines[0] and "grpc://" in lines[1], lines
        rest = int(lines[0].split("http://127.0.0.1:")[1].split("/")[0])
        grpc_port = int(lines[1].split("grpc://127.0.0.1:")[1].split(" ")[0])
        data = root / "data" / PARTITIONS[1]
        over_grpc = _replay(data, ["--grpc", f"127.0.0.1:{grpc_port}", "--model_name", "ctr"])
        over_rest = _replay(data, ["--url", f"http://127.0.0.1:{rest}/v1/models/ctr"])
        assert over_grpc.returncode == 0, over_grpc.stderr[-2000:]
        assert over_rest.returncode == 0, over_rest.stderr[-2000:]
        report = json.loads(over_grpc.stdout.strip().splitlines()[-1])
        assert report == json.loads(over_rest.stdout.strip().splitlines()[-1])
        assert report["rows"] == 80 and report["requests"] >= 3
        # A refusal ends the replay, said on stderr (in this process: no third TF start).
        from mxrec.serving.grpc_client import PredictClient
        from mxrec.streaming.__main__ import _predict_grpc

        client = PredictClient(f"127.0.0.1:{grpc_port}", "other")
        try:
            batch = {"sparse": np.ones([2, 3], np.int64), "dense": np.ones([2, 2], np.float32)}
            assert _predict_grpc(client, "the predictor", batch, 30) is None
        finally:
            client.close()
        assert "refused the call (NOT_FOUND)" in capsys.readouterr().err
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert server.returncode == 0, server.stderr.read()[-2000:]
    refused = subprocess.run(
        [sys.executable, "-m", "mxrec.serving", "--export-base", str(base), "--model-name",
         "ctr", "--port", "off"], capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and "--grpc-port" in refused.stderr


def test_tensor_protos_that_make_no_array_are_refused_naming_the_input():
    def proto(dtype, dims, **values):
        made = tensor_pb2.TensorProto(dtype=dtype, **values)
        for size in dims:
            made.tensor_shape.dim.add(size=size)
        return made

    unknown_rank = proto(tf.int64.as_datatype_enum, [])
    unknown_rank.tensor_shape.unknown_rank = True
    cases = [
        (unknown_rank, 400, "unknown rank"),
        (proto(tf.int64.as_datatype_enum, [-1, 3]), 400, "negative dimension"),
        (proto(0, [2]), 400, "dtype 0 is not a TensorFlow dtype"),
        (proto(tf.resource.as_datatype_enum, [2]), 400, "DT_RESOURCE"),
        (proto(tf.int64.as_datatype_enum, [2, 3], tensor_content=b"\0" * 40), 400,
         "DT_INT64 tensor of shape [2, 3]"),
        (proto(tf.float32.as_datatype_enum, [1 << 62, 4], float_val=[1.0]), 413,
         "more than this server's limit of 1000 bytes"),
    ]
    for made, status, words in cases:
        with pytest.raises(RequestError) as caught:
            tensors.to_array("ids", made, 1000)
        assert caught.value.status == status and "input 'ids'" in str(caught.value) and \
            words in str(caught.value), str(caught.value)
    filled = proto(tf.int64.as_datatype_enum, [2, 2], int64_val=[7])  # TensorFlow's fill rule
    np.testing.assert_array_equal(tensors.to_array("ids", filled, 1000), np.full([2, 2], 7))
    for value in (np.array([[1, -(1 << 63)]], np.int64), np.array([b"a", b"\xff"], object),
                  np.array([[0.5]], np.float32)):
        np.testing.assert_array_equal(tf.make_ndarray(tensors.to_proto(value)), value)


def test_raw_tensor_bytes_give_tensorflows_own_arrays_and_protos():
    rng = np.random.default_rng(5)
    values = [np.array([[np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0]], np.int64),
              rng.standard_normal([4, 3]).astype(np.float32),
              np.array([np.finfo(np.float64).max, -0.0, 5e-324]),
              rng.standard_normal([2, 2]).astype(np.float16),
              np.array([[-128, 127]], np.int8), np.array([-(1 << 15)], np.int16),
              np.array([[-(1 << 31), 7]], np.int32), np.array([255, 0], np.uint8),
              np.array([65535], np.uint16), np.array([1 << 32 - 1], np.uint32),
              np.array([(1 << 64) - 1], np.uint64), np.array([[True, False]]),
              np.zeros([0, 3], np.int64)]
    for value in values:
        proto = tf.make_tensor_proto(value)  # raw bytes, or typed fields for one value
        raw = tensor_pb2.TensorProto()
        raw.CopyFrom(proto)
        raw.ClearField("int_val")
        raw.ClearField("int64_val")
        raw.ClearField("uint64_val")
        raw.ClearField("uint32_val")
        raw.ClearField("half_val")
        raw.ClearField("float_val")
        raw.ClearField("double_val")
        raw.ClearField("bool_val")
        raw.tensor_content = value.tobytes()
        for sent in (proto, raw):
            got = tensors.to_array("x", sent, 1 << 20)
            want = tf.make_ndarray(sent)
            assert got.dtype == want.dtype == value.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got, value)
        # An output written as raw bytes reads back exactly, as TensorFlow's own proto.
        for same in (value, value.astype(value.dtype.newbyteorder(">")),
                     np.asfortranarray(value)):  # written in C order whatever its strides
            written = tensors.to_proto(same)
            assert written.dtype == proto.dtype
            np.testing.assert_array_equal(tf.make_ndarray(written), value)
    short = tf.make_tensor_proto(np.arange(6, dtype=np.float32).reshape(2, 3))
    short.tensor_content = short.tensor_content[:-4]
    with pytest.raises(RequestError, match=r"input 'x': tensor_content has 20 bytes; a "
                                           r"DT_FLOAT tensor of shape \[2, 3\] has 24"):
        tensors.to_array("x", short, 1 << 20)

"""mxrec.serving's REST requests, parsed against the signature: every refusal a 4xx JSON
naming the input and the instance, valid requests around them answered as before, exact
int64 over the whole range, no NaN in a response, the body limit, --host, a busy port."""

import http.client
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from serving_streams import hashed, read_rows, request, strict_json, train, write

from mxrec.serving import requests
from mxrec.serving.predictor import ModelInstance, Predictor
from mxrec.serving.server import ModelServer, PortInUseError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = "/v1/models/ctr:predict"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A one-partition model served twice: the default body limit, and a 1 MiB one."""
    root = tmp_path_factory.mktemp("requests")
    write(root / "data", ["20240101/00"])
    train(root / "data", root / "work", root / "export")
    rows = read_rows(str(root / "data" / "20240101" / "00"))[:6]
    query = hashed(rows)
    reference = ModelInstance(str(root / "export" / "1"))
    servers = [ModelServer(Predictor(str(root / "export")), "ctr", port=0, poll_interval=60),
               ModelServer(Predictor(str(root / "export")), "ctr", port=0, poll_interval=60,
                           max_body=1 << 20)]
    for server in servers:
        server.predictor.poll()
        server.start()
    yield servers[0].port, servers[1].port, query, reference, servers[0]
    for server in servers:
        server.stop()
    reference.close()


def _expect(reference, sparse, dense):
    return reference.predict({"sparse": np.asarray(sparse, np.int64),
                              "dense": np.asarray(dense, np.float32)})["prob"]


def _instances(sparse, dense):
    return [{"sparse": [int(v) for v in s], "dense": [float(v) for v in d]}
            for s, d in zip(sparse, dense)]


def _probs(body):
    return np.array([p["prob"] for p in body["predictions"]], np.float32)


def _refused(port, status, *needles, **kwargs):
    code, headers, body = request(port, "POST", PATH, **kwargs)
    assert code == status, (code, body)
    assert headers["Content-Type"] == "application/json"
    assert set(body) == {"error"}, body
    for needle in needles:
        assert needle in body["error"], (needle, body["error"])
    return body["error"]


def _valid_still_answered(port, query, reference):
    """The valid requests around the refused ones get the same answers."""
    expected = _expect(reference, query["sparse"], query["dense"])
    code, headers, body = request(port, "POST", PATH,
                                  {"instances": _instances(query["sparse"], query["dense"])})
    assert code == 200 and headers["X-Model-Version"] == "1"
    np.testing.assert_array_equal(_probs(body), expected)
    code, _, body = request(port, "POST", PATH, {"inputs": {
        "sparse": query["sparse"].tolist(), "dense": query["dense"].tolist()}})
    assert code == 200
    np.testing.assert_array_equal(np.array(body["outputs"]["prob"], np.float32), expected)


def test_ids_are_exact_int64_and_nothing_else(served):
    port, _, query, reference, _ = served
    sparse, dense = query["sparse"], query["dense"]
    assert sparse.max() > 2 ** 56  # real IDs: salted FarmHash, beyond float64's exact range
    _valid_still_answered(port, query, reference)
    alone = _expect(reference, sparse[:1], dense[:1])

    # The int64 extremes are IDs like any other (unseen here), and change no other row.
    extremes = np.array([[2 ** 63 - 1, -2 ** 63, sparse[0, 2]]], np.int64)
    code, _, body = request(port, "POST", PATH, {"instances": _instances(
        np.concatenate([sparse[:1], extremes]), np.concatenate([dense[:1], dense[:1]]))})
    assert code == 200
    # Across batch shapes TF's kernels may round differently (1 ulp seen on TF 2.21); an ID
    # that lost precision would look up another row (a difference of ~1e-3 here).
    np.testing.assert_allclose(_probs(body), np.concatenate(
        [alone, _expect(reference, extremes, dense[:1])]), atol=1e-6, rtol=0)

    base = _instances(sparse[:2], dense[:2])
    for bad, why in [(2 ** 63, "out of range"), (-2 ** 63 - 1, "out of range"),
                     (10 ** 30, "digits"), (1.5, "1.5"), (1.0, "1.0"), ("12", "'12'"),
                     (True, "true"), (None, "null"), ([1], "a list of 1")]:
        instances = json.loads(json.dumps(base))
        instances[1]["sparse"][2] = bad  # a mixed batch: row 0 is fine
        error = _refused(port, 400, "input 'sparse'", "instance 1", "position [2]",
                         "JSON integer in int64's range", why, body={"instances": instances})
        assert "-9223372036854775808, 9223372036854775807" in error
        columnar = {"sparse": [row["sparse"] for row in instances],
                    "dense": [row["dense"] for row in instances]}
        _refused(port, 400, "input 'sparse'", "row 1", why, body={"inputs": columnar})
    _valid_still_answered(port, query, reference)


def test_dense_values_must_be_finite_float32(served):
    port, _, query, reference, _ = served
    sparse, dense = query["sparse"], query["dense"]
    for text, why in [("NaN", "got NaN"), ("Infinity", "got Infinity"),
                      ("-Infinity", "got -Infinity"), ("1e39", "outside float32's range"),
                      ("1e400", "not finite"), ('"3"', "'3'"), ("true", "true")]:
        instances = _instances(sparse[:2], dense[:2])
        instances[1]["dense"][1] = "@"
        raw = json.dumps({"instances": instances}).replace('"@"', text)
        _refused(port, 400, "input 'dense'", "instance 1", "position [1]", why,
                 raw=raw.encode())
    # Large but finite in float32: answered, and the answer is strict JSON.
    code, _, body = request(port, "POST", PATH, {"instances": [
        {"sparse": sparse[0].tolist(), "dense": [1e38, -3.0e38]}]})
    assert code == 200 and np.isfinite(_probs(body)).all()
    _valid_still_answered(port, query, reference)


def test_shapes_batches_signatures_and_bodies(served):
    port, _, query, reference, _ = served
    sparse, dense = query["sparse"], query["dense"]
    good = _instances(sparse[:2], dense[:2])
    short = json.loads(json.dumps(good))
    short[1]["sparse"] = short[1]["sparse"][:2]
    _refused(port, 400, "input 'sparse'", "instance 1", "list of 2", "[3]",
             body={"instances": short})
    scalar = json.loads(json.dumps(good))
    scalar[0]["dense"] = 3.0
    _refused(port, 400, "input 'dense'", "instance 0", "shape [2]", body={"instances": scalar})
    _refused(port, 400, "different batch sizes", "'dense': 1", "'sparse': 2", body={"inputs": {
        "sparse": sparse[:2].tolist(), "dense": dense[:1].tolist()}})
    _refused(port, 400, "instance 1", "missing ['dense']",
             body={"instances": [good[0], {"sparse": good[1]["sparse"]}]})
    _refused(port, 400, "unknown ['extra']",
             body={"instances": [dict(good[0], extra=[1])]})
    _refused(port, 400, "non-empty list", body={"instances": []})
    _refused(port, 400, "exactly one of 'instances'", body={"inputs": {}, "instances": []})
    _refused(port, 400, "unknown keys ['signature']",
             body={"signature": "raw", "instances": good})
    error = _refused(port, 400, "unknown signature_name 'nope'",
                     body={"signature_name": "nope", "instances": good})
    assert "['raw', 'serving_default']" in error
    _refused(port, 400, "'signature_name' must be a string",
             body={"signature_name": 3, "instances": good})
    # The raw signature takes the columns' text: a number for a categorical column is refused.
    _refused(port, 400, "input 'c1'", "instance 0", "JSON string", "196", body={
        "signature_name": "raw",
        "instances": [{"d0": 1.0, "d1": 2.0, "c0": "v1", "c1": 196, "c2": "v3"}]})
    deep = b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _refused(port, 400, "nested too deep", raw=deep)
    _refused(port, 400, "input 'sparse'", "instance 0", "position [0]", "got a list of 1",
             body={"instances": [{"sparse": [[[1]], 2, 3], "dense": [1.0, 2.0]}]})
    huge = '{"instances": [{"sparse": "' + "9" * (50 << 20) + '", "dense": [1, 2]}]}'
    _refused(port, 400, "input 'sparse'", "instance 0", "string of 52428800 characters",
             raw=huge.encode())
    _refused(port, 400, "not valid JSON", raw=b'{"instances": [')
    _refused(port, 400, "not UTF-8", raw=b'{"instances": "\xff"}')
    _refused(port, 400, "must be a JSON object", body=[1, 2])
    _refused(port, 400, "body is empty", raw=b"")
    code, _, body = request(port, "POST", "/v1/models/other:predict", {"instances": good})
    assert code == 404 and "/v1/models/ctr:predict" in body["error"]
    code, _, body = request(port, "POST", "/v1/models/ctr/versions/7:predict",
                            {"instances": good})
    assert code == 404 and "version 7 is not serving (version 1 is)" in body["error"]
    _valid_still_answered(port, query, reference)


def _raw_exchange(port, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_headers_limits_and_keep_alive(served):
    port, small_port, query, reference, _ = served
    answer = _raw_exchange(port, b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\n"
                                 b"Content-Length: abc\r\n\r\n{}")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head
    assert "invalid Content-Length 'abc'" in strict_json(body)["error"]
    answer = _raw_exchange(port, b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 411") and b"Content-Length" in answer
    # http.server's own refusals are JSON too (an unparsable request line gets the HTTP/0.9
    # form: the body alone).
    assert "Bad request syntax" in strict_json(_raw_exchange(port, b"GARBAGE\r\n\r\n"))["error"]
    for request_bytes, status in [
            (b"PUT /v1/models/ctr HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
            (b"OPTIONS / HTTP/1.1\r\n\r\n", b"501"),
            (b"GET / HTTP/1.1\r\nX: " + b"y" * 70000 + b"\r\n\r\n", b"431")]:
        head, _, body = _raw_exchange(port, request_bytes).partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == status, head
        assert b"application/json" in head and strict_json(body)["error"]

    # Over the limit: the body is read to its end, so the client gets the 413.
    big = b'{"instances": "' + b"x" * (3 << 20) + b'"}'
    _refused(small_port, 413, f"{len(big)} bytes", "limit of 1048576", "--max-body-bytes",
             raw=big)
    # With Expect: 100-continue the client is told before it sends the body.
    answer = _raw_exchange(small_port, b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\n"
                                       b"Content-Length: %d\r\n" % len(big) +
                                       b"Expect: 100-continue\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413") and b"100 Continue" not in answer

    # One keep-alive connection: refusals leave it usable for the next request.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    good = json.dumps({"instances": _instances(query["sparse"], query["dense"])}).encode()
    expected = _expect(reference, query["sparse"], query["dense"])
    for body, status in [(good, 200), (b'{"instances": [{"sparse": 1}]}', 400),
                         (b"[", 400), (good, 200)]:
        connection.request("POST", PATH, body=body)
        response = connection.getresponse()
        payload = strict_json(response.read())
        assert response.status == status, payload
        if status == 200:
            np.testing.assert_array_equal(_probs(payload), expected)
    connection.close()


def test_metadata_is_tf_servings_signature_def_form(served):
    port = served[0]
    code, headers, body = request(port, "GET", "/v1/models/ctr/metadata")
    assert code == 200 and headers["X-Model-Version"] == "1"
    assert body["model_spec"] == {"name": "ctr", "signature_name": "", "version": "1"}
    sigs = body["metadata"]["signature_def"]["signature_def"]
    assert sorted(sigs) == ["raw", "serving_default"]

    def dims(info):
        return [int(d["size"]) for d in info["tensor_shape"]["dim"]]

    default = sigs["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    assert {k: (v["dtype"], dims(v)) for k, v in default["inputs"].items()} == {
        "sparse": ("DT_INT64", [-1, 3]), "dense": ("DT_FLOAT", [-1, 2])}
    assert {k: (v["dtype"], dims(v)) for k, v in default["outputs"].items()} == {
        "prob": ("DT_FLOAT", [-1]), "logits": ("DT_FLOAT", [-1])}
    assert all(v["name"].endswith(":0") and v["tensor_shape"]["unknown_rank"] is False
               for v in default["inputs"].values())
    assert {k: (v["dtype"], dims(v)) for k, v in sigs["raw"]["inputs"].items()} == {
        "d0": ("DT_FLOAT", [-1]), "d1": ("DT_FLOAT", [-1]), "c0": ("DT_STRING", [-1]),
        "c1": ("DT_STRING", [-1]), "c2": ("DT_STRING", [-1])}
    # The earlier form's keys stay.
    assert body["metadata"]["inputs"] == ["dense", "sparse"]
    code, _, body = request(port, "GET", "/v1/models/ctr/versions/3/metadata")
    assert code == 404 and "version 3 is not serving" in body["error"]
    code, _, body = request(port, "GET", "/v1/models/nope")
    assert code == 404 and set(body) == {"error"}


def test_failures_are_500_json_never_nan(served, monkeypatch):
    port, _, query, reference, server = served
    good = {"instances": _instances(query["sparse"][:2], query["dense"][:2])}
    instance = server.predictor._current

    def broken(inputs, signature=None, timeout=None):
        raise RuntimeError("the session went away")

    monkeypatch.setattr(instance, "predict", broken)
    code, _, body = request(port, "POST", PATH, good)
    assert code == 500 and "RuntimeError: the session went away" in body["error"]

    def lookup_failure(inputs, signature=None, timeout=None):
        raise KeyError("a table lost a key")

    monkeypatch.setattr(instance, "predict", lookup_failure)  # a 500, not "no version" (503)
    code, _, body = request(port, "POST", PATH, good)
    assert code == 500 and "KeyError" in body["error"]
    monkeypatch.setattr(instance, "predict", lambda inputs, signature=None, timeout=None: {
        "prob": np.array([0.5, np.nan], np.float32), "logits": np.zeros(2, np.float32)})
    code, _, body = request(port, "POST", PATH, good)  # strict JSON parse inside
    assert code == 500 and "output 'prob' is not finite" in body["error"]
    assert "rows [1]" in body["error"]
    monkeypatch.undo()
    _valid_still_answered(port, query, reference)


def test_request_parser_units():
    spec = requests.InputSpec("ids", np.int64, [None, 2])
    signatures = {"s": {"ids": spec}}
    body = requests.parse_json(b'{"inputs": [[9223372036854775807, -9223372036854775808],'
                               b' [72057594037927937, 1]]}')
    name, feeds, row_format = requests.to_feeds(body, signatures, "s")
    assert name == "s" and not row_format  # one input: its values may come bare
    np.testing.assert_array_equal(feeds["ids"], np.array(
        [[2 ** 63 - 1, -2 ** 63], [2 ** 56 + 1, 1]], np.int64))
    assert feeds["ids"].dtype == np.int64
    _, feeds, row_format = requests.to_feeds(requests.parse_json(
        b'{"instances": [[1, 2], [3, 4]]}'), signatures, "s")
    assert row_format and feeds["ids"].tolist() == [[1, 2], [3, 4]]
    with pytest.raises(requests.RequestError, match=r"instance 1: expected a nested list"):
        requests.to_feeds({"instances": [[1, 2], 3]}, signatures, "s")
    floats = {"s": {"x": requests.InputSpec("x", np.float32, [None])}}
    _, feeds, _ = requests.to_feeds(requests.parse_json(
        b'{"inputs": [1, 2.5, 100000000000000000000000]}'), floats, "s")
    np.testing.assert_array_equal(feeds["x"], np.array([1, 2.5, 1e23], np.float32))
    with pytest.raises(requests.RequestError, match=r"instance 1: .*got 10000.* \(401 digits\)"
                                                    r" \(not finite\)"):
        requests.to_feeds({"instances": [1.0, 10 ** 400]}, floats, "s")
    with pytest.raises(requests.RequestError, match="not valid JSON"):
        requests.parse_json(b'{"inputs": [' + b"9" * 5000 + b"]}")
    strings = {"s": {"c": requests.InputSpec("c", object, [None])}}
    _, feeds, _ = requests.to_feeds({"inputs": ["a", "\u00e9"]}, strings, "s")
    assert feeds["c"].tolist() == [b"a", "\u00e9".encode()]
    _, feeds, _ = requests.to_feeds({"inputs": ["a", {"b64": "/wA="}]}, strings, "s")
    assert feeds["c"].tolist() == [b"a", b"\xff\x00"]
    with pytest.raises(requests.RequestError, match=r"row 1: .*not base64"):
        requests.to_feeds({"inputs": ["a", {"b64": "%%"}]}, strings, "s")
    with pytest.raises(requests.RequestError, match=r"row 0: expected a JSON string .*object"):
        requests.to_feeds({"inputs": [{"text": "a"}]}, strings, "s")
    out = requests.outputs_to_json({"prob": np.array([0.25], np.float32)}, True)
    assert out == {"predictions": [0.25]}
    with pytest.raises(ValueError, match="not finite"):
        requests.outputs_to_json({"prob": np.array([np.inf], np.float32)}, False)


def test_host_and_busy_port(served, tmp_path):
    predictor = Predictor(str(tmp_path))
    server = ModelServer(predictor, "ctr", port=0, host="0.0.0.0").start()
    try:
        code, _, body = request(server.port, "GET", "/v1/models/ctr")  # nothing to serve
        assert code == 404 and body == {"error": "Could not find any versions of model ctr",
                                        "model_version_status": []}
        code, _, body = request(server.port, "POST", PATH, {"instances": [{"sparse": [1]}]})
        assert code == 503 and "no model version is loaded" in body["error"]
        with pytest.raises(PortInUseError, match=f"port {server.port} on 0.0.0.0 is in use"):
            ModelServer(Predictor(str(tmp_path)), "ctr", port=server.port, host="0.0.0.0")
        result = subprocess.run(
            [sys.executable, "-m", "mxrec.serving", "--export-base", str(tmp_path),
             "--model-name", "ctr", "--port", str(server.port), "--host", "0.0.0.0"],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
    finally:
        server.stop()
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"python -m mxrec.serving: error: port {server.port} on 0.0.0.0 is in use (another "
        "server there?); stop it or pass another --port")


def test_both_servers_refuse_each_integer_setting_out_of_range_naming_it(tmp_path):
    from mxrec.serving.grpc_server import GrpcServer

    predictor = Predictor(str(tmp_path))  # nothing loaded: the settings are checked first
    rest = {"max_body": (0, None), "num_threads": (0, None), "max_queued": (0, None),
            "port": (65536, (0, 65535))}
    grpc = {"max_message": (0, (1, (1 << 31) - 1)), "num_threads": (1 << 16 | 1, (1, 1 << 16)),
            "max_queued": (-1, (0, 1 << 20)), "port": (-1, (0, 65535))}
    for make, settings in ((ModelServer, rest), (GrpcServer, grpc)):
        for name, (bad, bounds) in settings.items():
            words = ">= 1" if bounds is None else f"in [{bounds[0]}, {bounds[1]}]"
            for value in (bad, True, 2.0, "8"):
                with pytest.raises(ValueError, match=re.escape(
                        f"{name} must be an integer {words}, got {value!r}")):
                    make(predictor, "ctr", **{name: value})
    # The bounds differ: gRPC takes max_queued=0 (no call waits), REST needs one.
    GrpcServer(predictor, "ctr", port=0, max_queued=0).close()
    with pytest.raises(ValueError, match="max_queued must be an integer >= 1, got 0"):
        ModelServer(predictor, "ctr", port=0, max_queued=0)


def _bodies(rng):
    """A columnar and a row-format body of int64 IDs over the whole range, float32 values
    from subnormal to the largest, and strings; with the arrays they mean (numpy's)."""
    ids = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, [6, 3], np.int64,
                       endpoint=True)
    ids[0] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0]
    dense = (rng.standard_normal([6, 2]) * 10.0 ** rng.integers(-30, 30, [6, 2])).astype(
        np.float32)
    dense[0] = [np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal]
    words = ["a", "\u00e9\u4e2d", "", "x" * 50, "\"quoted\"", "tab\t"]
    # Floats as Python writes them (shortest text that reads back to the same float64).
    columnar = {"inputs": {"ids": ids.tolist(), "dense": dense.astype(np.float64).tolist(),
                           "words": words}}
    rows = {"instances": [{"ids": ids[i].tolist(), "dense": dense[i].tolist(),
                           "words": words[i]} for i in range(6)]}
    want = {"ids": ids, "dense": dense, "words": np.array([w.encode() for w in words], object)}
    return [json.dumps(columnar).encode(), json.dumps(rows).encode()], want


def test_orjson_and_the_standard_parser_read_and_refuse_bodies_alike(monkeypatch):
    pytest.importorskip("orjson", reason="orjson is not installed (scripts/setup.sh installs "
                        "it); the standard library's parser is the only one here")
    specs = {"s": {"ids": requests.InputSpec("ids", np.int64, [None, 3]),
                   "dense": requests.InputSpec("dense", np.float32, [None, 2]),
                   "words": requests.InputSpec("words", object, [None])}}

    def read(raw):
        return requests.to_feeds(requests.parse_json(raw), specs, "s", raw)[1]

    def refusal(raw):
        with pytest.raises(requests.RequestError) as caught:
            read(raw)
        return str(caught.value)

    bodies, want = _bodies(np.random.default_rng(11))
    row = '"ids": [1, 2, 3], "dense": [1.5, 2], "words": "w"'
    bad = [b'{"instances": [{%s}]}' % row.replace("1, 2, 3", v).encode() for v in (
        "18446744073709551616, 2, 3", "-9223372036854775809, 2, 3", "1.0, 2, 3",
        "1, 2, " + "9" * 5000)]
    bad += [b'{"instances": [{%s}]}' % row.replace("1.5", v).encode() for v in (
        "NaN", "-Infinity", "1e400", "1e39")]
    bad += [b'{"instances": [{%s}]}' % row.replace('"w"', v).encode() for v in (
        "18446744073709551616", '"\\ud800"', '{"b64": "%%"}')]
    bad += [b'{"instances": ' + b"[" * 2000 + b"]" * 2000 + b"}", b'{"inputs": "\xff"}',
            b'\xef\xbb\xbf{"inputs": {}}', b'{"inputs": {}', b'{"inputs": {}, "inputs": 1}']
    fast = [[read(raw) for raw in bodies], [refusal(raw) for raw in bad]]
    monkeypatch.setattr(requests, "orjson", None)
    exact = [[read(raw) for raw in bodies], [refusal(raw) for raw in bad]]
    for feeds in fast[0] + exact[0]:
        for key, value in want.items():
            assert feeds[key].dtype == value.dtype
            np.testing.assert_array_equal(feeds[key], value)
    assert fast[1] == exact[1]
    assert "got 18446744073709551616 (out of range)" in fast[1][0]


def test_answers_written_by_orjson_read_back_as_the_standard_writers():
    outputs = {"prob": np.array([0.1, 3.4e38], np.float32),
               "top": np.array([-(1 << 63), 1], np.int64),
               "word": np.array([b"\xc3\xa9", b"\xff"], object)}
    for row_format in (True, False):
        written = requests.answer_json(outputs, row_format)
        assert json.loads(written) == json.loads(json.dumps(
            requests.outputs_to_json(outputs, row_format)))
    with pytest.raises(ValueError, match="output 'prob' is not finite"):
        requests.answer_json({"prob": np.array([1.0, np.nan], np.float32)}, True)


def test_typed_arrays_are_checked_as_their_signature_says():
    specs = {"ids": requests.InputSpec("ids", np.int64, [None, 3]),
             "dense": requests.InputSpec("dense", np.float32, [None, 2]),
             "words": requests.InputSpec("words", object, [None])}
    good = {"ids": np.zeros([2, 3], np.int64), "dense": np.ones([2, 2], ">f4"),
            "words": np.array([b"a", b"b"], object)}
    requests.check_arrays(good, specs)  # float32 in either byte order
    requests.check_arrays(dict(good, words=np.array(["a", "b"])), specs)  # any string dtype
    cases = [
        ({"ids": good["ids"], "dense": good["dense"]}, r"the inputs must be \['dense', 'ids', "
                                                       r"'words'\]; missing \['words'\]"),
        (dict(good, extra=good["ids"]), r"unknown \['extra'\]"),
        (dict(good, ids=good["ids"].astype(np.int32)), "input 'ids': expected int64 values, "
                                                       "got int32"),
        (dict(good, words=good["ids"][:, 0]), "input 'words': expected string values, got "
                                              "int64"),
        (dict(good, ids=np.zeros([2, 4], np.int64)), r"input 'ids': expected shape \[\?, 3\] "
                                                     r"\(the first dimension is the batch\), "
                                                     r"got \[2, 4\]"),
        (dict(good, ids=np.zeros([2, 3, 1], np.int64)), r"expected shape \[\?, 3\]"),
        (dict(good, ids=np.zeros([0, 3], np.int64)), "input 'ids': the batch is empty"),
        (dict(good, dense=np.array([[1, 2], [3, np.inf]], np.float32)),
         r"input 'dense', row 1, position \[1\]: expected a finite JSON number .* got inf"),
        (dict(good, ids=np.zeros([3, 3], np.int64)),
         r"different batch sizes \{'dense': 2, 'ids': 3, 'words': 2\}"),
    ]
    for feeds, words in cases:
        with pytest.raises(requests.RequestError, match=words):
            requests.check_arrays(feeds, specs)

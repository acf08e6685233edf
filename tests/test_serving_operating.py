"""A predictor behind a load balancer on a bad day: the status is 404 until a version
serves (a readiness probe on an empty export base fails), a copy under way is retried at
the next poll and a damaged version only once its files change, only the ops an export
writes are served, versions that are not finite are refused while the last good one
serves, handler threads are bounded and a request has a deadline, and the graph's errors
for a request's values are 400s."""

import dataclasses
import http.client
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging
from serving_streams import MODEL, hashed, read_rows, request, train, write

from mxrec.export import saved_model as saver_serving
from mxrec.serving import allowed_ops, versions
from mxrec.serving import server as server_module
from mxrec.serving.__main__ import main as serving_main
from mxrec.serving.predictor import DELTA_FILE, ModelInstance, Predictor, write_delta
from mxrec.serving.server import ModelServer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS = "/v1/models/ctr"


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """Versions 1 (full) and 2 (a delta-only delta of 1) of a trained stream, a query and
    the answers of each version (a predictor following the stream, version by version)."""
    root = tmp_path_factory.mktemp("operating")
    write(root / "data", ["20240101/00", "20240101/01"], rows=64)
    train(root / "data", root / "work", root / "export", delta_export="delta_only")
    query = hashed(read_rows(str(root / "data" / "20240101" / "01"))[:8])
    follow = root / "follow"
    follow.mkdir()
    predictor = Predictor(str(follow))
    expected = {}
    for version in (1, 2):
        os.symlink(root / "export" / str(version), follow / str(version))
        assert predictor.poll() == version
        expected[version] = predictor.predict(query)[0]["prob"]
    predictor.close()
    return root / "export", query, expected


def _republish(source, base, version, info=None, change=None):
    """Publishes a copy of version folder `source` as `version` of `base` (a fresh manifest,
    `info` over the source's kind and base), after `change(staging)`."""
    staging = versions.staging_dir(str(base), version)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns(versions.MANIFEST))
    if change is not None:
        change(staging)
    manifest = versions.read_manifest(str(source))
    fields = {"kind": manifest["kind"], "base": manifest["base"]}
    fields.update(info or {})
    return versions.publish(staging, str(base), version, fields)


def _tiny(base, version, weight=1.0, extra=None):
    """Publishes a small SavedModel: y = sum(reshape(x * w, [-1, 2]), 1), x float [B, ?];
    `extra(y)` may add ops to the graph. A row of 3 values is an InvalidArgument at run
    time (the reshape), which no input spec catches."""
    staging = versions.staging_dir(str(base), version)
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(weight), use_resource=True)
        y = tf.reduce_sum(tf.reshape(x * w, [-1, 2]), axis=1)
        if extra is not None:
            y = extra(y)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(staging)
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], signature_def_map={
                    "serving_default": tf.compat.v1.saved_model.predict_signature_def(
                        {"x": x}, {"y": y})})
            builder.save()
    return versions.publish(staging, str(base), version, {"kind": "full", "base": None})


def _columnar(query):
    return {"inputs": {"sparse": query["sparse"].tolist(), "dense": query["dense"].tolist()}}


class _Digests:
    """Counts the file reads of versions.verify (SHA-256 of a file) and fails the next
    `fail` of them with an I/O error."""

    def __init__(self, monkeypatch):
        self.count = 0
        self.fail = 0
        real = versions.file_digest

        def digest(path):
            self.count += 1
            if self.fail:
                self.fail -= 1
                raise OSError(5, "Input/output error", path)
            return real(path)

        monkeypatch.setattr(versions, "file_digest", digest)


def _flip_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))


def _variables_data(version_dir):
    folder = os.path.join(version_dir, "variables")
    return os.path.join(folder, sorted(p for p in os.listdir(folder)
                                       if p.startswith("variables.data-"))[0])


def _status_codes(predictor):
    return {int(e["version"]): (e["state"], e["status"]["error_code"])
            for e in predictor.status()["model_version_status"]}


def test_readiness_probe_on_an_empty_export_base_through_the_cli(stream, tmp_path):
    export, query, expected = stream
    base = tmp_path / "base"
    base.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxrec.serving", "--export-base", str(base), "--model-name",
         "ctr", "--port", "0", "--poll-interval", "0.1", "--rest-api-num-threads", "2",
         "--max-seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
    try:
        first = proc.stdout.readline()
        assert first.startswith("serving ctr (no version yet: its status answers 404 until "
                                "one loads) on http://127.0.0.1:"), first
        assert "2 threads" in first
        port = int(first.split("http://127.0.0.1:")[1].split("/")[0])
        code, _, body = request(port, "GET", STATUS)
        assert code == 404, body  # the probe fails: nothing would answer a predict
        assert body == {"error": "Could not find any versions of model ctr",
                        "model_version_status": []}
        code, _, body = request(port, "POST", STATUS + ":predict", _columnar(query))
        assert code == 503 and body["error"] == "no model version is loaded"
        code, _, body = request(port, "GET", STATUS + "/metadata")
        assert code == 503

        _republish(export / "1", base, 1)
        for _ in range(600):  # the poll picks it up (bounded)
            code, _, body = request(port, "GET", STATUS)
            if code == 200:
                break
            time.sleep(0.05)
        assert code == 200 and body["model_version_status"] == [{
            "version": "1", "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]
        code, headers, body = request(port, "POST", STATUS + ":predict", _columnar(query))
        assert code == 200 and headers["X-Model-Version"] == "1"
        np.testing.assert_allclose(body["outputs"]["prob"], expected[1], atol=1e-6)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()
        proc.stderr.close()


def test_a_copy_under_way_is_retried_and_a_damaged_version_waits_for_new_files(
        stream, tmp_path, monkeypatch, caplog):
    export, query, expected = stream
    base = tmp_path / "base"
    base.mkdir()
    digests = _Digests(monkeypatch)
    predictor = Predictor(str(base))
    _republish(export / "1", base, 1)
    assert predictor.poll() == 1

    # A delta whose file is still short (a copy under way): refused without reading a
    # byte, looked at again at each poll, served once the file is complete.
    path = _republish(export / "2", base, 2)
    delta = os.path.join(path, DELTA_FILE)
    whole = open(delta, "rb").read()
    with open(delta, "wb") as f:
        f.write(whole[:100])
    digests.count = 0
    caplog.set_level(logging.ERROR, logger="absl")
    for _ in range(3):
        assert predictor.poll() == 1
    assert digests.count == 0
    assert _status_codes(predictor)[2] == ("END", "UNAVAILABLE")
    assert "a copy still under way?" in predictor.refused[2]
    assert len([r for r in caplog.records if "refused version 2" in r.getMessage()]) == 1
    with open(delta, "wb") as f:
        f.write(whole)
    assert predictor.poll() == 2 and predictor.refused == {}
    np.testing.assert_allclose(predictor.predict(query)[0]["prob"], expected[2], atol=1e-6)

    # A byte changed in a complete file: refused, and not read again until the files change.
    path = _republish(export / "1", base, 3)
    data = _variables_data(path)
    original = open(data, "rb").read()
    _flip_byte(data)
    mtime = os.stat(data).st_mtime_ns
    assert predictor.poll() == 2
    assert "SHA-256" in predictor.refused[3]
    assert _status_codes(predictor)[3] == ("END", "DATA_LOSS")
    digests.count = 0
    for _ in range(3):
        assert predictor.poll() == 2
    assert digests.count == 0
    with open(data, "wb") as f:  # the file copied again, its old mtime kept (cp -p)
        f.write(original)
    os.utime(data, ns=(os.stat(data).st_atime_ns, mtime))
    assert predictor.poll() == 3 and predictor.refused == {}
    np.testing.assert_allclose(predictor.predict(query)[0]["prob"], expected[1], atol=1e-6)

    # A file the manifest does not list: refused naming it, served once it is removed.
    path = _republish(export / "1", base, 4)
    open(os.path.join(path, "notes.txt"), "w").close()
    assert predictor.poll() == 3
    assert "['notes.txt'] are not in its mxrec_version.json" in predictor.refused[4]
    os.remove(os.path.join(path, "notes.txt"))
    assert predictor.poll() == 4

    # A manifest that is not one, then a good version after it.
    path = _republish(export / "1", base, 5)
    with open(os.path.join(path, versions.MANIFEST), "w") as f:
        f.write('{"files": [')
    assert predictor.poll() == 4 and "is not JSON" in predictor.refused[5]
    path = _republish(export / "1", base, 6)
    with open(os.path.join(path, versions.MANIFEST)) as f:
        manifest = json.load(f)
    manifest["files"]["../../../etc/passwd"] = manifest["files"].pop("saved_model.pb")
    with open(os.path.join(path, versions.MANIFEST), "w") as f:
        json.dump(manifest, f)
    assert predictor.poll() == 4 and "which is no file inside the version" in \
        predictor.refused[6]

    # An I/O error while reading is transient: the next poll loads the version.
    _republish(export / "1", base, 7)
    digests.fail = 1
    assert predictor.poll() == 4 and "Input/output error" in predictor.refused[7]
    assert _status_codes(predictor)[7] == ("END", "UNAVAILABLE")
    assert predictor.poll() == 7 and sorted(predictor.refused) == [5, 6]
    assert predictor.loaded == [1, 2, 3, 4, 7]
    shutil.rmtree(base / "5")
    assert predictor.poll() == 7 and sorted(predictor.refused) == [6]  # 5 is gone
    predictor.close()


def test_a_delta_waiting_for_its_base_is_looked_at_when_the_serving_version_changes(
        stream, tmp_path, monkeypatch):
    export, query, expected = stream
    base = tmp_path / "base"
    base.mkdir()
    digests = _Digests(monkeypatch)
    _republish(export / "1", base, 1)
    predictor = Predictor(str(base))
    assert predictor.poll() == 1
    # Version 3 is a delta of 2, which is still being copied.
    _republish(export / "2", base, 3, info={"base": 2})
    path = _republish(export / "1", base, 2)
    data = _variables_data(path)
    whole = open(data, "rb").read()
    with open(data, "wb") as f:
        f.write(whole[:10])
    assert predictor.poll() == 1
    assert _status_codes(predictor)[3] == ("END", "FAILED_PRECONDITION")
    digests.count = 0
    assert predictor.poll() == 1 and digests.count == 0  # 3 not read again: 1 still serves
    with open(data, "wb") as f:
        f.write(whole)
    assert predictor.poll() == 3 and predictor.loaded == [1, 2, 3]
    np.testing.assert_allclose(predictor.predict(query)[0]["prob"], expected[2], atol=1e-6)
    predictor.close()


def test_versions_that_are_not_finite_are_refused_and_the_last_good_one_serves(
        stream, tmp_path):
    export, query, expected = stream
    base = tmp_path / "base"
    base.mkdir()
    _republish(export / "1", base, 1)
    predictor = Predictor(str(base))
    assert predictor.poll() == 1
    instance = predictor._current
    table = sorted(instance.tables)[0]
    dim = instance.tables[table].dim
    dense_name = sorted(instance.dense)[0]
    dense_shape = instance.dense[dense_name][2].as_list()

    def delta(version, tables, dense=None):
        staging = versions.staging_dir(str(base), version)
        os.makedirs(staging)
        write_delta(os.path.join(staging, DELTA_FILE), tables, dense or {})
        versions.publish(staging, str(base), version, {"kind": "delta", "base": 1})

    bad_row = np.ones([2, dim], np.float32)
    bad_row[1, 0] = np.nan
    delta(2, {table: {"ids": np.array([11, 12], np.int64), "embeddings": bad_row}})
    assert predictor.poll() == 1
    assert f"table {table!r} has 1 values that are not finite, first in the row of ID 12" \
        in predictor.refused[2]
    delta(3, {}, {dense_name: np.full(dense_shape, np.inf, np.float32)})
    assert predictor.poll() == 1 and f"dense variable {dense_name!r}" in predictor.refused[3]
    np.testing.assert_allclose(predictor.predict(query)[0]["prob"], expected[1], atol=1e-6)

    # Full versions: a NaN table row, an infinite dense weight.
    ids = saver_serving.exported_tables(str(export / "1"))[table]["ids"]

    def nan_row(staging):
        shutil.rmtree(staging)
        saver_serving.apply_delta(str(export / "1"), {table: {
            "ids": ids[:1], "embeddings": np.full([1, dim], np.nan, np.float32)}}, staging,
            check_finite=False)  # the export's own check would refuse it

    def inf_dense(staging):
        shutil.rmtree(staging)
        saver_serving.apply_delta(str(export / "1"), {}, staging, dense={
            dense_name: np.full(dense_shape, np.inf, np.float32)}, check_finite=False)

    _republish(export / "1", base, 4, change=nan_row)
    _republish(export / "1", base, 5, change=inf_dense)
    assert predictor.poll() == 1
    assert f"table {table!r} has {dim} values that are not finite, first in row" in \
        predictor.refused[4] and f"(ID {ids[0]})" in predictor.refused[4]
    assert f"variable {dense_name!r} has" in predictor.refused[5]
    assert _status_codes(predictor) == {1: ("AVAILABLE", "OK"), 2: ("END", "DATA_LOSS"),
                                        3: ("END", "DATA_LOSS"), 4: ("END", "DATA_LOSS"),
                                        5: ("END", "DATA_LOSS")}

    # The refused deltas left both instances whole: the next good delta applies in place.
    _republish(export / "2", base, 6)
    assert predictor.poll() == 6
    np.testing.assert_allclose(predictor.predict(query)[0]["prob"], expected[2], atol=1e-6)
    assert predictor.loaded == [1, 6]
    predictor.close()


@pytest.mark.parametrize("case", ["read_file", "write_file", "py_func", "save_on_request",
                                  "erfc"])
def test_only_the_ops_an_export_writes_are_served(tmp_path, case):
    extras = {
        "read_file": (lambda y: y + 0 * tf.cast(tf.strings.length(
            tf.io.read_file("/etc/hostname")), tf.float32), "op 'ReadFile'"),
        "write_file": (lambda y: (tf.io.write_file("/tmp/mxrec-written", "x"), y)[1],
                       "op 'WriteFile'"),
        "py_func": (lambda y: tf.compat.v1.py_func(lambda a: a, [y], tf.float32),
                    "op 'PyFunc'"),
        "save_on_request": (lambda y: _after(tf.raw_ops.SaveV2(
            prefix="/tmp/mxrec-saved", tensor_names=["y"], shape_and_slices=[""],
            tensors=[y]), y), "signature 'serving_default' reaches op 'SaveV2'"),
        "erfc": (lambda y: y + 0 * tf.math.erfc(y), "op 'Erfc'")}
    extra, needle = extras[case]
    _tiny(tmp_path, 1)
    _tiny(tmp_path, 2, extra=extra)
    predictor = Predictor(str(tmp_path))
    assert predictor.poll() == 1  # the newest is refused at once, the one before it serves
    assert needle in predictor.refused[2] and "ForbiddenOpError" in predictor.refused[2]
    assert _status_codes(predictor)[2] == ("END", "PERMISSION_DENIED")
    outputs, version = predictor.predict({"x": np.array([[1, 2]], np.float32)})
    assert version == 1 and outputs["y"].tolist() == [3.0]
    predictor.close()
    if case == "erfc":  # a custom model's op, accepted when named
        predictor = Predictor(str(tmp_path), allow_ops=["Erfc"])
        assert predictor.poll() == 2
        predictor.close()


def _after(op, y):
    with tf.control_dependencies([op]):
        return tf.identity(y)


def test_the_allowlist_covers_every_export_and_refuses_io(stream, tmp_path):
    export, _, _ = stream
    write(tmp_path / "data", ["20240101/00"], rows=32)
    for kind in ("dlrm", "dcn"):  # wide_deep is the stream's
        train(tmp_path / "data", tmp_path / f"work_{kind}", tmp_path / kind,
              model=dataclasses.replace(MODEL, kind=kind))
    for folder in (export / "1", tmp_path / "dlrm" / "1", tmp_path / "dcn" / "1"):
        ModelInstance(str(folder)).close()  # loads: every op is allowed
    with pytest.raises(ValueError, match="'ReadFile' reads or writes outside the process"):
        Predictor(str(tmp_path), allow_ops=["ReadFile"])
    with pytest.raises(ValueError, match="'NoSuchOp' is not a TensorFlow op type"):
        Predictor(str(tmp_path), allow_ops=["NoSuchOp"])
    assert allowed_ops.allowed(["Erfc"]) == allowed_ops.ALLOWED_OPS | {"Erfc"}
    verbosity = absl_logging.get_verbosity()
    with pytest.raises(SystemExit) as exit_info:
        serving_main(["--export-base", str(tmp_path), "--model-name", "m", "--allow-op",
                      "PyFunc"])
    absl_logging.set_verbosity(verbosity)  # main() turned it up for its own log lines
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        serving_main(["--export-base", str(tmp_path), "--model-name", "m",
                      "--rest-api-num-threads", "0"])


def test_graph_errors_are_400s_and_the_status_is_tf_servings(tmp_path, monkeypatch):
    _tiny(tmp_path, 1)
    predictor = Predictor(str(tmp_path))
    server = ModelServer(predictor, "tiny", port=0, poll_interval=None, num_threads=2).start()
    path = "/v1/models/tiny"
    try:
        # The first load: LOADING, never AVAILABLE, and the probe still fails.
        entered, release = threading.Event(), threading.Event()
        real = predictor._instance

        def slow(version):
            entered.set()
            release.wait(60)
            return real(version)

        monkeypatch.setattr(predictor, "_instance", slow)
        poller = threading.Thread(target=predictor.poll)
        poller.start()
        assert entered.wait(60)
        code, _, body = request(server.port, "GET", path)
        assert code == 404 and body["model_version_status"] == [{
            "version": "1", "state": "LOADING",
            "status": {"error_code": "OK", "error_message": ""}}]
        release.set()
        poller.join(60)
        code, _, body = request(server.port, "GET", path)
        assert code == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
        code, _, body = request(server.port, "GET", path + "/versions/1")
        assert code == 200 and [e["version"] for e in body["model_version_status"]] == ["1"]
        code, _, body = request(server.port, "GET", path + "/versions/9")
        assert code == 404 and body["error"] == "Could not find version 9 of model tiny"

        code, _, body = request(server.port, "POST", path + ":predict",
                                {"instances": [[1, 2], [3, 4]]})
        assert code == 200 and body == {"predictions": [3.0, 7.0]}
        code, _, body = request(server.port, "POST", path + ":predict",
                                {"instances": [[1, 2, 3]]})  # the graph's reshape fails
        assert code == 400 and body["error"].startswith("the model refused the request's "
                                                        "values: Input to reshape")
        instance = predictor._current
        for error, status, needle in [
                (tf.errors.DeadlineExceededError(None, None, "late"), 504,
                 "--rest-api-timeout-in-ms"),
                (tf.errors.ResourceExhaustedError(None, None, "OOM"), 429, "smaller batches"),
                (tf.errors.OutOfRangeError(None, None, "index 7"), 400, "index 7"),
                (tf.errors.InternalError(None, None, "broken"), 500, "InternalError")]:
            def fail(inputs, signature=None, timeout=None, error=error):
                assert 0 < timeout <= server.timeout
                raise error

            monkeypatch.setattr(instance, "predict", fail)
            code, _, body = request(server.port, "POST", path + ":predict",
                                    {"instances": [[1, 2]]})
            assert code == status and needle in body["error"], body
        monkeypatch.undo()
        code, _, body = request(server.port, "POST", path + ":predict",
                                {"instances": [[1, 2]]})
        assert code == 200
    finally:
        server.stop()


def _trickle(port, head: bytes, then: bytes, pause: float, stop: threading.Event, out: dict):
    """Sends `head`, then `then` a byte at a time every `pause` s until the server answers
    or closes; records (seconds from the first byte, what came back)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    start = time.monotonic()
    sock.sendall(head)
    sock.settimeout(pause)
    answer = b""
    try:
        for byte in then * 1000:
            if stop.is_set():
                break
            try:
                sock.send(bytes([byte]))
            except OSError:
                break
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                break
            answer += chunk
            break  # an answer, or the server closed (b"")
        sock.settimeout(5)
        while True:
            try:
                chunk = sock.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
    finally:
        out["seconds"] = time.monotonic() - start
        out["answer"] = answer
        sock.close()


def test_handler_threads_are_bounded_and_a_request_has_a_deadline(tmp_path):
    _tiny(tmp_path, 1)
    predictor = Predictor(str(tmp_path))
    predictor.poll()
    server = ModelServer(predictor, "tiny", port=0, poll_interval=None, num_threads=2,
                         timeout=1.5, max_queued=1).start()
    path = "/v1/models/tiny:predict"
    body = json.dumps({"instances": [[1, 2]]}).encode()
    stop = threading.Event()
    try:
        # Idle keep-alive connections hold no thread: 6 of them, then a 7th still answered.
        idle = []
        for _ in range(6):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            connection.request("POST", path, body=body)
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read()) == {
                "predictions": [3.0]}
            idle.append(connection)
        code, _, _ = request(server.port, "POST", path, {"instances": [[1, 2]]}, timeout=5)
        assert code == 200
        for connection in idle:  # and each is still usable
            connection.request("POST", path, body=body)
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            connection.close()

        # Two slow clients take both threads: one trickles its headers, one its body.
        slow = [{}, {}]
        threads = [
            threading.Thread(target=_trickle, args=(
                server.port, b"POST " + path.encode() + b" HTTP/1.1\r\n",
                b"X-Slow: " + b"y" * 200, 0.1, stop, slow[0])),
            threading.Thread(target=_trickle, args=(
                server.port, b"POST " + path.encode() + b" HTTP/1.1\r\nContent-Length: 100"
                b"\r\n\r\n", b"{" * 100, 0.1, stop, slow[1]))]
        for thread in threads:
            thread.start()
        time.sleep(0.4)
        # One request waits for a thread (max_queued=1); the next is answered 503 at once.
        waiting = {}
        queued = threading.Thread(target=lambda: waiting.update(zip(
            ("code", "headers", "body"), request(server.port, "POST", path,
                                                 {"instances": [[1, 2]]}, timeout=30))))
        queued.start()
        time.sleep(0.2)
        start = time.monotonic()
        code, headers, answer = request(server.port, "POST", path, {"instances": [[1, 2]]},
                                        timeout=30)
        assert code == 503 and time.monotonic() - start < 1.0, answer
        assert "--rest-api-num-threads" in answer["error"] and headers["Retry-After"] == "1"
        for thread in threads:
            thread.join(30)
        queued.join(30)
        # The slow clients were cut at their deadline (1.5 s), not held while they trickled.
        for record in slow:
            assert 1.3 < record["seconds"] < 4.0, record
            assert record["answer"].startswith(b"HTTP/1.1 408"), record
            assert b"not received within 1.5 s" in record["answer"]
        # The waiting request was answered by then, 200 or (its deadline spent waiting) 503.
        assert waiting["code"] in (200, 503), waiting
        code, _, answer = request(server.port, "POST", path, {"instances": [[1, 2]]},
                                  timeout=5)
        assert code == 200 and answer == {"predictions": [3.0]}, (answer, waiting, slow)
    finally:
        stop.set()
        server.stop()
    with pytest.raises(ValueError, match="num_threads must be an integer >= 1, got 0"):
        ModelServer(Predictor(str(tmp_path)), "tiny", port=0, num_threads=0)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        ModelServer(Predictor(str(tmp_path)), "tiny", port=0, timeout=0)
    assert server_module.default_threads() >= 4

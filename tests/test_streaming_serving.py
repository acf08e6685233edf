"""mxrec.serving: versions applied in place equal fresh loads, atomic reload under concurrent
REST requests, damaged versions refused, the replay client, the CLI."""

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from test_streaming_trainer import PARTITIONS, SCHEMA_SPEC, write_stream

from mxrec.serving import versions
from mxrec.serving.predictor import DELTA_FILE, ModelInstance, Predictor
from mxrec.serving.server import ModelServer
from mxrec.streaming import models, parsers
from mxrec.streaming.trainer import StreamConfig, StreamingTrainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Four serving versions (full, delta, delta, full) in both delta forms."""
    import tensorflow as tf

    from mxrec.util import initialize

    root = tmp_path_factory.mktemp("stream")
    data = root / "data"
    write_stream(str(data), PARTITIONS[:4], rows=120)
    out = {}
    for mode in ("savedmodel", "delta_only"):
        initialize.terminate_config_initializer()
        tf.compat.v1.reset_default_graph()
        config = StreamConfig(data=str(data), schema=parsers.parse_schema_spec(SCHEMA_SPEC),
                              workdir=str(root / f"work_{mode}"),
                              export_base=str(root / f"export_{mode}"), batch_size=32,
                              validation="batch", delta_export=mode, progress=False,
                              tensorboard=False)
        StreamingTrainer(config, models.make_model_fn(models.ModelConfig(
            "wide_deep", dim=4, hidden=(8,), vocabulary=3000, init_stddev=0.05))).run()
        out[mode] = root / f"export_{mode}"
    return root, data, out


def _query(rows=40, seed=5):
    rng = np.random.default_rng(seed)
    import tensorflow as tf

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        values = tf.constant([[f"v{v}" for v in row] for row in
                              rng.integers(0, 60, size=(rows, 3))])
        sparse = sess.run(parsers.hash_categorical(values, [0, 1, 2]))
    return {"sparse": sparse, "dense": rng.integers(0, 50, size=(rows, 2)).astype(np.float32)}


def _publish(src_base, dst_base, version):
    """Copies a version in and renames it into place, as a trainer would."""
    tmp = os.path.join(dst_base, f".tmp-{version}")
    shutil.copytree(os.path.join(src_base, str(version)), tmp)
    os.rename(tmp, os.path.join(dst_base, str(version)))


def test_deltas_in_place_equal_fresh_loads(exports, tmp_path):
    _, _, bases = exports
    query = _query()
    assert [versions.read_manifest(str(bases["savedmodel"] / str(v)))["kind"]
            for v in (1, 2, 3, 4)] == ["full", "delta", "delta", "full"]
    assert not os.path.exists(bases["delta_only"] / "2" / "saved_model.pb")
    assert os.path.exists(bases["delta_only"] / "2" / DELTA_FILE)
    expected = {}
    for v in (1, 2, 3, 4):
        instance = ModelInstance(str(bases["savedmodel"] / str(v)))
        expected[v] = instance.predict(query)["prob"]
        instance.close()
    assert not np.allclose(expected[1], expected[2])
    for mode in ("savedmodel", "delta_only"):
        base = tmp_path / mode
        base.mkdir()
        predictor = Predictor(str(base))
        assert predictor.poll() is None
        for v in (1, 2, 3, 4):
            _publish(str(bases[mode]), str(base), v)
            assert predictor.poll() == v
            outputs, served = predictor.predict(query)
            assert served == v
            np.testing.assert_allclose(outputs["prob"], expected[v], atol=1e-6,
                                       err_msg=f"{mode} version {v}")
        assert predictor.refused == {}
        predictor.close()
    # A predictor started on a chain of delta-only versions loads the full one and
    # applies the rest.
    base = tmp_path / "late_start"
    base.mkdir()
    for v in (1, 2, 3):
        _publish(str(bases["delta_only"]), str(base), v)
    predictor = Predictor(str(base))
    assert predictor.poll() == 3 and predictor.loaded == [1, 2, 3]
    np.testing.assert_allclose(predictor.predict(query)[0]["prob"], expected[3], atol=1e-6)
    predictor.close()


def _post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.headers["X-Model-Version"]), json.loads(response.read())


def test_atomic_reload_under_concurrent_requests_and_damaged_versions(exports, tmp_path):
    _, _, bases = exports
    source = bases["delta_only"]
    base = tmp_path / "base"
    base.mkdir()
    _publish(str(source), str(base), 1)
    query = _query(rows=64)
    expected = {}
    probe = Predictor(str(tmp_path / "probe"))
    (tmp_path / "probe").mkdir()
    for v in (1, 2, 3, 4):
        _publish(str(source), str(tmp_path / "probe"), v)
        probe.poll()
        expected[v] = probe.predict(query)[0]["prob"]
    probe.close()

    predictor = Predictor(str(base))
    predictor.poll()
    server = ModelServer(predictor, "ctr", port=0, poll_interval=0.05).start()
    url = f"http://127.0.0.1:{server.port}/v1/models/ctr"
    seen, errors = [], []
    stop = threading.Event()
    instances = [{"sparse": s.tolist(), "dense": d.tolist()}
                 for s, d in zip(query["sparse"], query["dense"])]

    def client(columnar):
        for _ in range(20000):  # bounded; ends when the reloads are done (stop)
            if stop.is_set():
                return
            try:
                if columnar:
                    version, body = _post(url + ":predict", {"inputs": {
                        "sparse": query["sparse"].tolist(), "dense": query["dense"].tolist()}})
                    prob = np.asarray(body["outputs"]["prob"])
                else:
                    version, body = _post(url + ":predict", {"instances": instances})
                    prob = np.asarray([p["prob"] for p in body["predictions"]])
                matches = [v for v in expected if np.allclose(prob, expected[v], atol=1e-6)]
                seen.append(version)
                if matches != [version]:
                    errors.append((version, matches))
            except Exception as error:  # noqa: BLE001 (reported below)
                errors.append(repr(error))

    threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        for v in (2, 3, 4):
            _publish(str(source), str(base), v)
            for _ in range(1200):
                if predictor.version == v:
                    break
                threading.Event().wait(0.05)
            assert predictor.version == v
            for _ in range(600):  # until a request has been answered by it (bounded)
                if v in seen:
                    break
                threading.Event().wait(0.05)
        # Damaged versions: a delta with a changed byte, a SavedModel with a truncated file.
        shutil.copytree(source / "3", base / ".tmp-5")
        delta = base / ".tmp-5" / DELTA_FILE
        raw = bytearray(delta.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        delta.write_bytes(bytes(raw))
        os.rename(base / ".tmp-5", base / "5")
        shutil.copytree(source / "4", base / ".tmp-6")
        variables = sorted((base / ".tmp-6" / "variables").glob("variables.data-*"))[0]
        variables.write_bytes(variables.read_bytes()[:100])
        os.rename(base / ".tmp-6", base / "6")
        for _ in range(1200):
            if len(predictor.refused) == 2:
                break
            threading.Event().wait(0.05)
        threading.Event().wait(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    status = json.loads(urllib.request.urlopen(url, timeout=10).read())
    server.stop()
    assert not errors, errors[:5]
    assert set(seen) >= {2, 3, 4} and seen, sorted(set(seen))
    assert sorted(predictor.refused) == [5, 6]
    assert "SHA-256" in predictor.refused[5] and "bytes" in predictor.refused[6]
    assert status["model_version_status"][0] == {
        "version": "4", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    assert [s["version"] for s in status["model_version_status"][1:]] == ["5", "6"]


def test_replay_client_and_cli_errors(exports, tmp_path):
    _, data, bases = exports
    predictor = Predictor(str(bases["savedmodel"]))
    predictor.poll()
    server = ModelServer(predictor, "ctr", port=0, poll_interval=60).start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "mxrec.streaming", "replay", "--data",
             str(data / "20240101" / "02"), "--url",
             f"http://127.0.0.1:{server.port}/v1/models/ctr", "--schema", SCHEMA_SPEC,
             "--batch_size", "50"],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
        assert result.returncode == 0, result.stderr[-2000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["rows"] == 120 and report["requests"] == 4 and 0 <= report["auc"] <= 1
        with pytest.raises(urllib.error.HTTPError) as error:
            _post(f"http://127.0.0.1:{server.port}/v1/models/ctr:predict",
                  {"inputs": {"sparse": [[1, 2, 3]]}})
        assert error.value.code == 400
        with pytest.raises(urllib.error.HTTPError) as error:
            _post(f"http://127.0.0.1:{server.port}/v1/models/other:predict", {"inputs": {}})
        assert error.value.code == 404
    finally:
        server.stop()
    result = subprocess.run(
        [sys.executable, "-m", "mxrec.serving", "--export-base", str(tmp_path / "none"),
         "--model-name", "ctr"], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 2 and "--export-base" in result.stderr and "none" in \
        result.stderr
    from mxrec.serving.__main__ import build_parser

    assert all(a.help for a in build_parser()._actions)

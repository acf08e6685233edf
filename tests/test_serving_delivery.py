"""Delivery that survives a damaged serving version: the trainer verifies the version a
delta would build on and delivers a full one instead; the predictor refuses the damaged
version and serves the next ones; a restarted trainer and a restarted predictor go on
from the newest good version at once."""

import dataclasses
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from serving_streams import MODEL, hashed, read_rows, request, train, truncate, write

from mxrec.serving import versions
from mxrec.serving.predictor import Predictor
from mxrec.serving.server import ModelServer
from mxrec.streaming.trainer import StreamingTrainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTITIONS = [f"20240101/{hour:02d}" for hour in range(6)]
# Zero init: a restarted trainer's model equals an uninterrupted run's.
EXACT = dataclasses.replace(MODEL, init_stddev=0.0)


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """Six partitions of one day and a reference run over them, never damaged, per mode."""
    root = tmp_path_factory.mktemp("delivery")
    write(root / "data", PARTITIONS, rows=80)
    query = hashed(read_rows(str(root / "data" / PARTITIONS[-1]))[:16])
    reference = {}
    for mode in ("savedmodel", "delta_only"):
        train(root / "data", root / f"ref_work_{mode}", root / f"ref_{mode}", model=EXACT,
              delta_export=mode)
        reference[mode] = {}
        base = root / f"ref_follow_{mode}"
        base.mkdir()
        predictor = Predictor(str(base))
        for version in range(1, len(PARTITIONS) + 1):  # the versions one by one, chained
            os.symlink(root / f"ref_{mode}" / str(version), base / str(version))
            assert predictor.poll() == version
            reference[mode][version] = predictor.predict(query)[0]["prob"]
        predictor.close()
    return root, query, reference


def _answer(port, query):
    code, headers, body = request(port, "POST", "/v1/models/ctr:predict", {"inputs": {
        "sparse": query["sparse"].tolist(), "dense": query["dense"].tolist()}})
    assert code == 200, body
    return int(headers["X-Model-Version"]), np.array(body["outputs"]["prob"], np.float32)


def _following_trainer(predictor, port, query, damage_step, export, served):
    """A trainer that damages version `damage_step` as soon as it is published (before any
    predictor saw it) and lets the predictor poll after each export."""

    class Following(StreamingTrainer):
        def _export(self, step, kind, previous_version):
            version = super()._export(step, kind, previous_version)
            if step == damage_step:
                truncate(os.path.join(str(export), str(step)))
            predictor.poll()
            served[step] = _answer(port, query)
            return version

    return Following


@pytest.mark.parametrize("mode", ["savedmodel", "delta_only"])
def test_damaged_version_then_two_partitions_delivered_and_served(stream, tmp_path, mode):
    root, query, reference = stream
    data = tmp_path / "data"
    write(data, PARTITIONS[:4], rows=80)
    export = tmp_path / "export"
    predictor = Predictor(str(export))
    server = ModelServer(predictor, "ctr", port=0, poll_interval=None).start()
    served = {}
    try:
        _, entries = train(data, tmp_path / "work", export, model=EXACT, delta_export=mode,
                           trainer_class=_following_trainer(predictor, server.port, query, 2,
                                                            export, served))
    finally:
        server.stop()
    assert [e["step"] for e in entries] == [1, 2, 3, 4]
    kinds = [(versions.read_manifest(str(export / str(v)))["kind"],
              versions.read_manifest(str(export / str(v)))["base"]) for v in (1, 2, 3, 4)]
    # Version 2 was damaged: 3 is a full version, 4 a delta on 3.
    assert kinds == [("full", None), ("delta", 1), ("full", None), ("delta", 3)]
    assert sorted(predictor.refused) == [2]
    assert [served[s][0] for s in (1, 2, 3, 4)] == [1, 1, 3, 4]
    for step, version in ((1, 1), (2, 1), (3, 3), (4, 4)):
        np.testing.assert_allclose(served[step][1], reference[mode][version], atol=1e-6,
                                   err_msg=f"after step {step}")


def test_restarted_predictor_and_trainer_serve_the_newest_good_version(stream, tmp_path):
    root, query, reference = stream
    data = tmp_path / "data"
    write(data, PARTITIONS, rows=80)
    export = tmp_path / "export"
    train(data, tmp_path / "work", export, model=EXACT, max_partitions=4)
    assert versions.list_versions(str(export)) == [1, 2, 3, 4]
    truncate(str(export / "4"))  # the newest version is damaged while nothing runs

    # A restarted predictor serves version 3 from its first poll, and says so.
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxrec.serving", "--export-base", str(export), "--model-name",
         "ctr", "--port", "0", "--poll-interval", "0.2", "--max-seconds", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
    stderr = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        first = proc.stdout.readline()
        assert first.startswith("serving ctr version 3 on http://127.0.0.1:"), \
            first + "".join(stderr)
        port = int(first.split("http://127.0.0.1:")[1].split("/")[0])
        version, prob = _answer(port, query)
        assert version == 3
        np.testing.assert_allclose(prob, reference["savedmodel"][3], atol=1e-6)

        # A restarted trainer: version 4 cannot be built on, so 5 is full and 6 a delta on 5.
        _, entries = train(data, tmp_path / "work", export, model=EXACT)
        assert [e["step"] for e in entries] == [5, 6]
        assert [(versions.read_manifest(str(export / str(v)))["kind"],
                 versions.read_manifest(str(export / str(v)))["base"]) for v in (5, 6)] == \
            [("full", None), ("delta", 5)]
        for _ in range(1200):  # the predictor's polls pick both up (bounded)
            version, prob = _answer(port, query)
            if version == 6:
                break
            threading.Event().wait(0.05)
        assert version == 6
        np.testing.assert_allclose(prob, reference["savedmodel"][6], atol=1e-6)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        reader.join(timeout=10)
    log = "".join(stderr)
    assert "refused version 4 (nothing serves yet)" in log and "variables.data" in log
    for line in (r"serving version 3 \(was None\): SavedModel of a delta version, loaded whole",
                 r"serving version 5 \(was 3\): SavedModel of a full version, loaded whole",
                 r"serving version 6 \(was 5\): delta of version 5, applied in place"):
        assert re.search(r"predictor: " + line + r" in \d+\.\d{3} s", log), (line, log[-3000:])

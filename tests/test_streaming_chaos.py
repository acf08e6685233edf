"""Chaos on the streaming loop: partitions with poisoned lines and a NaN-making record land
among folders with bad names while the trainer and the predictor are SIGKILLed at seeded
moments, a second model tries the same export base and the donefile is lost once. At the
end every answer the predictor gave came from a version listed in the donefile and was
finite, nothing another writer put in the export base is gone, and the trainer has caught
up: every valid partition once, in order, the NaN one skipped."""

import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
from nan_model_trainer import NAN_BELOW
from test_streaming_trainer import SCHEMA_SPEC, write_stream

from mxrec.streaming import donefile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
PARTITIONS = ["20240101/00", "20240101/01", "20240101/02", "20240101/03", "20240102/00",
              "20240102/01", "20240102/02"]
NAN_PARTITION = "20240101/03"
POISON = {  # partition: lines the parser must count as bad (bytes: one is no UTF-8)
    "20240101/01": [b"1\t1e39\t3\tv1\tv2\tv3", b"0\t" + b"9" * 40 + b"\t3\tv1\tv2\tv3"],
    "20240102/00": [b"nan\t1\t2\tv1\tv2\tv3", b"1\t2\t3\tv\xff1\tv2\tv3", b"1\tinf\t1\ta\tb\tc"],
}
BAD_FOLDERS = ["20241301/00", "20240101/24", "20240230"]
QUERY = {"inputs": {"sparse": [[11, 22, 33], [1 << 60, 5, 7]], "dense": [[1.0, 2.0], [0.0, 9.0]]}}


def _land(staging, data, name):
    os.makedirs(os.path.dirname(os.path.join(data, name)), exist_ok=True)
    os.rename(os.path.join(staging, name), os.path.join(data, name))


def _snapshot(root):
    """{relative path: sha256} of the files under root (the trainers' lock file aside)."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name == "trainer.lock":
                continue
            with open(os.path.join(folder, name), "rb") as f:
                out[os.path.relpath(os.path.join(folder, name), root)] = hashlib.sha256(
                    f.read()).hexdigest()
    return out


class _Predictor:
    """`python -m mxrec.serving` on a port of its own, restartable."""

    def __init__(self, export):
        self.export, self.proc, self.port = export, None, None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mxrec.serving", "--export-base", self.export,
             "--model-name", "ctr", "--port", "0", "--poll-interval", "0.2"],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        self.port = int(match.group(1))

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.port = None


class _Client(threading.Thread):
    """Asks the predictor for the same rows again and again; records (version, probs)."""

    def __init__(self, predictor):
        super().__init__(daemon=True)
        self.predictor, self.stop = predictor, threading.Event()
        self.answers, self.refusals = [], []

    def run(self):
        while not self.stop.is_set():
            port = self.predictor.port
            if port is None:
                time.sleep(0.05)
                continue
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("POST", "/v1/models/ctr:predict", json.dumps(QUERY),
                             {"Content-Type": "application/json"})
                response = conn.getresponse()
                body = response.read()
                if response.status == 200:
                    self.answers.append((int(response.getheader("X-Model-Version")),
                                         json.loads(body)["outputs"]["prob"]))
                elif response.status != 503:  # 503: no version loaded yet
                    self.refusals.append((response.status, body[:500]))
                conn.close()
            except (ConnectionError, OSError):
                pass  # the predictor is being killed or restarted
            time.sleep(0.03)


def _wait(condition, what, timeout=180):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.2)


def _entries(work):
    path = os.path.join(work, "donefile.jsonl")
    return donefile.read(path) if os.path.exists(path) else []


def _trainer(data, work, export):
    return subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "nan_model_trainer.py"), "--data", data,
         "--model-dir", work, "--export-base", export, "--on-nonfinite", "skip",
         "--watch", "600"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)


def test_streaming_loop_under_chaos(tmp_path):
    rng = random.Random(52)
    staging, data = str(tmp_path / "staging"), str(tmp_path / "data")
    work, export = str(tmp_path / "work"), str(tmp_path / "export")
    write_stream(staging, PARTITIONS, rows=64, seed=5)
    for name, lines in POISON.items():
        with open(os.path.join(staging, name, "part-00001"), "ab") as f:
            f.write(b"\n".join(lines) + b"\n")
    with open(os.path.join(staging, NAN_PARTITION, "part-00000"), "a") as f:
        f.write(f"1\t{NAN_BELOW * 10:g}\t3\tv1\tv2\tv3\n")
    for name in BAD_FOLDERS:  # ready, with data, but no date or hour: skipped, never a crash
        write_stream(os.path.join(str(tmp_path), "bad"), [name], rows=8)
        _land(os.path.join(str(tmp_path), "bad"), data, name)
    os.makedirs(export)
    predictor = _Predictor(export)
    predictor.start()
    client = _Client(predictor)
    client.start()
    trainer = _trainer(data, work, export)
    foreign = None
    try:
        for index, name in enumerate(PARTITIONS):
            _land(staging, data, name)
            time.sleep(rng.uniform(0.2, 2.5))
            if index in (1, 3, 5):  # the trainer killed at a seeded moment, restarted
                if index == 3:  # (after two partitions, so that the donefile has lines)
                    _wait(lambda t=trainer: len(_entries(work)) >= 2 or t.poll() is not None,
                          "two partitions trained")
                    assert trainer.poll() is None, trainer.communicate()[1][-3000:]
                trainer.send_signal(signal.SIGKILL)
                trainer.wait(timeout=60)
                if index == 3:  # the donefile lost while the trainer is down
                    os.rename(os.path.join(work, "donefile.jsonl"), str(tmp_path / "backup"))
                    before = _snapshot(str(tmp_path / "work"))
                    refused = _trainer(data, work, export)
                    _, err = refused.communicate(timeout=120)
                    assert refused.returncode != 0 and "donefile.jsonl is missing" in err, \
                        err[-2000:]
                    assert _snapshot(str(tmp_path / "work")) == before
                    os.rename(str(tmp_path / "backup"), os.path.join(work, "donefile.jsonl"))
                trainer = _trainer(data, work, export)
            if index in (2, 4):  # the predictor killed, restarted
                predictor.kill()
                predictor.start()
            if index == 2:
                _wait(lambda: os.path.exists(os.path.join(export, "mxrec_owner.json")),
                      "claim of the export base")
                # Another writer's folder in the export base (an operator's copy, another
                # tool): the predictor refuses it (no manifest), nobody deletes it.
                foreign = os.path.join(export, "999999")
                os.makedirs(foreign)
                with open(os.path.join(foreign, "saved_model.pb"), "wb") as f:
                    f.write(b"another writer's")
                other = subprocess.run(
                    [sys.executable, "-m", "mxrec.streaming", "train", "--data", data,
                     "--model-dir", str(tmp_path / "other_model"), "--export-base", export,
                     "--schema", SCHEMA_SPEC, "--no_progress"],
                    env=ENV, capture_output=True, text=True, timeout=180)
                assert other.returncode == 1 and "belongs to model" in other.stderr, \
                    other.stderr[-2000:]
        deadline = time.time() + 300
        while time.time() < deadline:
            entries = _entries(work)
            if len(entries) == len(PARTITIONS):
                break
            assert trainer.poll() is None, trainer.communicate()[1][-3000:]
            time.sleep(0.5)
        last = [e for e in entries if not e.get("skipped")][-1]["export_version"]
        while time.time() < deadline and not any(v == last for v, _ in client.answers[-5:]):
            time.sleep(0.2)
    finally:
        client.stop.set()
        client.join(timeout=30)
        trainer.send_signal(signal.SIGTERM)
        trainer.communicate(timeout=60)
        predictor.kill()

    # The trainer caught up: each valid partition once, in order; none of the bad folders.
    assert [e["partition"] for e in entries] == PARTITIONS
    assert [e["partition"] for e in entries if e.get("skipped")] == [NAN_PARTITION]
    assert [e["bad_lines"] for e in entries if e["partition"] in POISON] == [
        len(lines) for lines in POISON.values()]
    delivered = {e["export_version"] for e in entries if not e.get("skipped")}
    assert sorted(delivered) == list(range(1, len(PARTITIONS)))
    # Every answer: a version the donefile lists, finite probabilities.
    assert not client.refusals, client.refusals[:3]
    assert len(client.answers) > 20, len(client.answers)
    served = {version for version, _ in client.answers}
    assert served <= delivered, (served, delivered)
    assert last in served
    for version, probs in client.answers:
        assert np.isfinite(np.asarray(probs, np.float64)).all(), (version, probs)
    # Nothing another writer put there is gone; the other model wrote nothing.
    with open(os.path.join(foreign, "saved_model.pb"), "rb") as f:
        assert f.read() == b"another writer's"
    assert not os.path.exists(tmp_path / "other_model" / "checkpoints")
    shutil.rmtree(foreign)

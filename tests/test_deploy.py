"""The image's helpers under deploy/image: the health check the probes run, against a real
predictor (an empty export base, then a served version, then a stopped server), how it finds
the predictor's flags in /proc, and the entry point's roles. The manifests and the Dockerfile
are checked by scripts/check_deploy.sh (hadolint, kubernetes-validate, the MPIJob's CRD)."""

import os
import socket
import subprocess
import sys

import tensorflow as tf

from mxrec.serving import versions
from mxrec.serving.predictor import Predictor
from mxrec.serving.server import ModelServer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEALTHCHECK = os.path.join(REPO, "deploy", "image", "healthcheck.py")
ENTRYPOINT = os.path.join(REPO, "deploy", "image", "entrypoint.sh")
sys.path.insert(0, os.path.dirname(HEALTHCHECK))
import healthcheck  # noqa: E402 (deploy/image is no package)


def _health(*args):
    """(exit status, its one line) of the health check as a probe runs it: a process."""
    proc = subprocess.run([sys.executable, HEALTHCHECK, *args], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout.strip()


def _publish(base, version):
    """A one-variable SavedModel published as `version` of `base`, as the trainer publishes."""
    staging = versions.staging_dir(str(base), version)
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(2.0), use_resource=True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(staging)
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], signature_def_map={
                    "serving_default": tf.compat.v1.saved_model.predict_signature_def(
                        {"x": x}, {"y": x * w})})
            builder.save()
    versions.publish(staging, str(base), version, {"kind": "full", "base": None})


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_live_and_ready_follow_the_predictors_status(tmp_path):
    flags = ["--model-name", "ctr", "--host", "127.0.0.1"]
    port = _free_port()
    code, line = _health("--live", "--port", str(port), *flags)
    assert code == 1 and "no answer" in line, line  # nothing listens yet

    predictor = Predictor(str(tmp_path))
    server = ModelServer(predictor, "ctr", port=0, poll_interval=None, num_threads=2).start()
    try:
        port = str(server.port)
        code, line = _health("--live", "--port", port, *flags)
        assert code == 0 and "404, no version serves yet" in line, line
        code, line = _health("--ready", "--port", port, *flags)
        assert code == 1 and "404" in line, line
        code, _ = _health("--port", port, *flags)
        assert code == 1  # --ready is the default
        code, line = _health("--ready", "--port", port, "--model-name", "other", "--host",
                             "127.0.0.1")
        assert code == 1, line  # another model's status is no evidence for this one
        code, line = _health("--live", "--port", port, "--model-name", "other")
        assert code == 1 and "no model at /v1/models/other" in line, line  # a misnamed probe

        _publish(tmp_path, 1)
        predictor.poll()
        assert predictor.version == 1
        code, line = _health("--ready", "--port", port, *flags)
        assert code == 0 and "200, a version is AVAILABLE" in line, line
        code, line = _health("--live", "--port", port, *flags)
        assert code == 0, line
        # A predictor on 0.0.0.0 is asked on the loopback address.
        code, line = _health("--ready", "--port", port, "--model-name", "ctr", "--host",
                             "0.0.0.0")
        assert code == 0 and line.startswith("http://127.0.0.1:"), line
    finally:
        server.stop()
    code, line = _health("--live", "--port", port, *flags)
    assert code == 1 and "no answer" in line, line


def test_the_predictors_flags_are_read_from_its_command_line(tmp_path):
    proc = tmp_path / "proc"
    entries = {
        "1": ["/usr/bin/tini", "--", "mxrec-entrypoint", "serve"],
        "7": ["/opt/mxrec/venv/bin/python", "-m", "mxrec.serving", "--export-base", "/m",
              "--model_name", "ctr", "--port=9001", "--host", "0.0.0.0", "--threads", "2"],
        "self": ["not", "a", "pid"],
    }
    for pid, argv in entries.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "9").mkdir()  # a process that ended between the listing and the read
    found = healthcheck.find_predictor(str(proc))
    assert healthcheck.predictor_flags(found) == ("0.0.0.0", 9001, "ctr")
    assert healthcheck.predictor_flags(["--model-name=x"]) == ("127.0.0.1", 8501, "x")
    (proc / "7" / "cmdline").write_bytes(b"python\0-m\0mxrec.streaming\0train\0")
    assert healthcheck.find_predictor(str(proc)) is None


def test_without_flags_the_check_asks_the_predictor_it_finds(tmp_path, monkeypatch, capsys):
    # In-process, with the search of /proc replaced: this machine may run other predictors.
    monkeypatch.setattr(healthcheck, "find_predictor", lambda: None)
    assert healthcheck.main([]) == 0  # a trainer's or a worker's container
    assert capsys.readouterr().out == "no predictor runs in this container: nothing to check\n"

    server = ModelServer(Predictor(str(tmp_path)), "ctr", port=0, poll_interval=None,
                         num_threads=2).start()
    try:
        argv = ["--export-base", str(tmp_path), "--model_name", "ctr", f"--port={server.port}"]
        monkeypatch.setattr(healthcheck, "find_predictor", lambda: argv)
        assert healthcheck.main(["--live"]) == 0
        assert healthcheck.main([]) == 1  # no version yet
        assert healthcheck.main(["--live", "--model-name", "other"]) == 1  # a flag wins
    finally:
        server.stop()


def _entry(*args, home):
    env = dict(os.environ, HOME=str(home),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               PYTHONPATH=REPO)
    return subprocess.run(["bash", ENTRYPOINT, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_entry_point_picks_the_role(tmp_path):
    shown = _entry("help", home=tmp_path)
    assert shown.returncode == 0 and "serve ARGS" in shown.stdout and "worker" in shown.stdout
    assert _entry(home=tmp_path).stdout == shown.stdout  # no argument: the same text
    serve = _entry("serve", "--help", home=tmp_path)
    assert serve.returncode == 0 and "python -m mxrec.serving" in serve.stdout
    train = _entry("train", "--help", home=tmp_path)
    assert train.returncode == 0 and "--export-base" in train.stdout
    launch = _entry("launch", "--help", home=tmp_path)
    assert launch.returncode == 0 and "--num_ranks" in launch.stdout
    other = _entry("sh", "-c", "echo as given", home=tmp_path)
    assert other.returncode == 0 and other.stdout == "as given\n"
    worker = _entry("worker", home=tmp_path)  # no keys mounted
    assert worker.returncode == 2
    assert f"no {tmp_path}/.ssh/id_rsa and authorized_keys" in worker.stderr

"""Where the gRPC engine's server listens (issue 52).

TensorFlow's gRPC server listens on every interface whatever address the cluster spec
names (the first test pins that premise: if a TensorFlow ever binds the named address, it
fails, and docs/MULTIWORKER.md must say so). For a loopback address mxrec confines the
listening socket to the loopback interface: a connection to the port through this host's
own non-loopback address, which reaches the listener as one from another host would,
is refused, while the ranks' collectives over loopback still work.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _own_address():
    """An IPv4 address of this host that is not a loopback one, or None."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # a route lookup only: UDP sends nothing here
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


OWN = _own_address()
needs_own_address = pytest.mark.skipif(
    OWN is None, reason="this host has no non-loopback IPv4 address to connect through")

# Prints, as JSON, whether a connection to the port succeeds through loopback and through
# this host's own address (argv[1]).
PROBE = textwrap.dedent("""
    def reach(port, own):
        import socket
        out = {}
        for name, host in (("loopback", "127.0.0.1"), ("own", own)):
            try:
                socket.create_connection((host, port), timeout=5).close()
                out[name] = True
            except ConnectionRefusedError:
                out[name] = False
        return out
""")

SERVER = PROBE + textwrap.dedent("""
    import json, os, socket, sys
    import tensorflow as tf
    from mxrec.distributed import communication

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    spec = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{port}"]})
    server = tf.distribute.Server(spec, job_name="worker", task_index=0, start=True)
    before = reach(port, sys.argv[1])
    confined = communication.confine_to_loopback(port)
    after = reach(port, sys.argv[1])
    with tf.compat.v1.Session(server.target) as sess:
        served = int(sess.run(tf.constant(3) + 4))
    print("RESULT", json.dumps({"before": before, "confined": confined, "after": after,
                                "served": served,
                                "unknown_port": communication.confine_to_loopback(1)}))
""")

RANK = PROBE + textwrap.dedent("""
    import json, os, sys
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    from mxrec.distributed import communication

    rank, size = int(os.environ["MXREC_RANK"]), int(os.environ["MXREC_SIZE"])
    cluster = communication.setup(rank, size)
    _, port = communication.split_address(cluster.addresses[rank])
    total = communication.allreduce(tf.constant([float(rank + 1)]))
    with tf.compat.v1.Session(**communication.session_kwargs()) as sess:
        value = float(sess.run(total)[0])
    print("RESULT", json.dumps({"rank": rank, "sum": value, **reach(port, sys.argv[1])}),
          flush=True)
""")


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE"):
        env.pop(name, None)
    return env


def _results(stdout):
    return [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines()
            if "RESULT " in line]


@needs_own_address
def test_tensorflow_listens_everywhere_and_confining_keeps_it_serving(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    result = subprocess.run([sys.executable, str(script), OWN], env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (got,) = _results(result.stdout)
    # TensorFlow's own binding: reachable through any address of the host.
    assert got["before"] == {"loopback": True, "own": True}, got
    assert got["confined"] is True
    assert got["after"] == {"loopback": True, "own": False}, got
    assert got["served"] == 7
    assert got["unknown_port"] is False  # nothing listens there: nothing was confined


@needs_own_address
def test_local_ranks_listen_on_loopback_only_and_still_exchange(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    for _ in range(3):
        result = subprocess.run(
            [sys.executable, "-m", "mxrec.launch", "-n", "2", "--engine", "grpc",
             "--threads_per_rank", "1", str(script), OWN],
            env=_env(), capture_output=True, text=True, timeout=240)
        # A port taken between the launcher's choice and the server's bind: new ports.
        if "Could not start gRPC server" not in result.stdout + result.stderr:
            break
    assert result.returncode == 0, result.stdout + result.stderr
    got = sorted(_results(result.stdout), key=lambda r: r["rank"])
    assert got == [{"rank": r, "sum": 3.0, "loopback": True, "own": False} for r in (0, 1)], \
        result.stdout
    assert "listens on every interface" not in result.stdout + result.stderr


@pytest.mark.parametrize("address, split", [
    ("127.0.0.1:5000", ("127.0.0.1", 5000)),
    ("[::1]:7", ("::1", 7)),
    ("host-a.example:65535", ("host-a.example", 65535)),
])
def test_split_address(address, split):
    from mxrec.distributed import communication  # noqa: PLC0415 (TensorFlow: import late)

    assert communication.split_address(address) == split


@pytest.mark.parametrize("address", ["127.0.0.1", "host:", ":x", "host:12ab"])
def test_split_address_refuses_what_is_no_address(address):
    from mxrec.distributed import communication  # noqa: PLC0415

    with pytest.raises(ValueError, match="MXREC_CLUSTER: .* is no host:port address"):
        communication.split_address(address)


def test_which_hosts_are_loopback():
    from mxrec.distributed import communication  # noqa: PLC0415

    assert communication.is_loopback_host("127.0.0.1")
    assert communication.is_loopback_host("127.8.9.10")
    assert communication.is_loopback_host("::1")
    assert communication.is_loopback_host("localhost")
    assert not communication.is_loopback_host("0.0.0.0")
    assert not communication.is_loopback_host("192.0.2.7")
    assert not communication.is_loopback_host("fd00::2")
    assert not communication.is_loopback_host("no-such-host.invalid")

"""Ranks on two hosts, simulated: `python -m mxrec.launch --hostfile F` on host0 starts ranks
there and, through Open MPI's daemon, on host1; the MPI engine's exchanges travel over TCP
between the hosts' addresses only (bench/simulated_hosts.py: network + UTS namespaces on a
bridge, an ssh stand-in, the machine's filesystem as the shared storage).

- 2 hosts x 1 rank and 2 x 2 train what one process trains on the same global batches,
  within 1e-5 (tests/test_multiworker.py's comparison); with 2 ranks a host, each rank sizes
  its thread pools by the ranks on its own host;
- a sharded save (full, then delta) on 2 hosts restores on one process, which goes on to
  equal 20 straight steps;
- a folder that host1 does not share (a folder of its own mounted there) stops every rank,
  naming the folder and the rank: mxrec's Saver at its first save, the streaming trainer at
  start;
- the streaming CLI on 2 hosts delivers one serving version per partition, the versions of
  one process.

Needs root and `ip netns` (skipped with the reason otherwise) and the MPI engine.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from test_multiworker import _assert_equal_to_one_process, _shards
from test_streaming_ranks_equal import (
    ALL_PARTITIONS,
    assert_same_versions,
    command,
    held_out,
    predictions,
    write_data,
)

from bench import simulated_hosts
from mxrec import launch
from mxrec.streaming import donefile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "multiworker" / "train.py")
COMMON = ["--optimizer", "adagrad", "--steps", "20"]
TIMEOUT = 300


def _skip_reason():
    reason = simulated_hosts.unavailable()
    if reason is None and launch.default_engine() != "mpi":
        reason = "the MPI engine is not available here (mpirun and mxrec's MPI ops)"
    return reason


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with simulated_hosts.SimulatedHosts(2, str(tmp_path_factory.mktemp("hosts"))) as made:
        yield made


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One process, 20 steps: what every run here must train."""
    out = tmp_path_factory.mktemp("straight")
    _check(subprocess.run([sys.executable, SCRIPT, "--out", str(out)] + COMMON, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT))
    return out


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               MXREC_COLLECTIVE_TIMEOUT="120")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE",
                 "MXREC_THREADS_PER_RANK", *launch.THREAD_VARIABLES):
        env.pop(name, None)
    env.update(extra)
    return env


def _check(result):
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    return result


def _on_hosts(hosts, per_host, argv, env=None):
    """`python -m mxrec.launch --hostfile` on host0 with `per_host` ranks a host."""
    launcher = [sys.executable, "-m", "mxrec.launch", "--hostfile", hosts.hostfile(per_host),
                "-n", str(2 * per_host), *hosts.launcher_flags(), *argv]
    return subprocess.run(hosts.on(0, launcher), env=env or _env(), capture_output=True,
                          text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("per_host", [1, 2], ids=["2x1", "2x2"])
def test_ranks_on_two_hosts_equal_one_process(hosts, straight, tmp_path, per_host):
    out = tmp_path / "many"
    result = _check(_on_hosts(hosts, per_host, [SCRIPT, "--out", str(out)] + COMMON))
    _assert_equal_to_one_process(straight, out, 2 * per_host)
    if per_host == 2:  # each rank's pools: its host's cores among that host's 2 ranks
        share = max(1, len(os.sched_getaffinity(0)) // 2)
        for name in hosts.names:
            said = f"2 ranks on host {name} share its"
            assert result.stdout.count(said) == 2, result.stdout[-3000:]
            assert f"thread pools of {share} " in result.stdout


def test_a_sharded_save_on_two_hosts_restores_on_one(hosts, straight, tmp_path):
    ckpt = tmp_path / "ckpt"
    _check(_on_hosts(hosts, 1, [SCRIPT, "--out", str(tmp_path / "unused"), "--ckpt", str(ckpt),
                                "--full_at", "6", "--delta_at", "10", "--stop_at", "10"]
                     + COMMON))
    assert sorted(os.listdir(ckpt)) == ["delta-000000000010", "full-000000000006"]
    assert sorted(os.listdir(ckpt / "full-000000000006")) == [
        "dense.npz", "manifest.json", "table-000-rank00000.npz", "table-000-rank00001.npz"]
    out = tmp_path / "one"
    _check(subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--ckpt", str(ckpt),
                           "--restore"] + COMMON, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT))
    want, (want_w,) = _shards(straight, 1)
    got, (got_w,) = _shards(out, 1)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=str(key))
    np.testing.assert_allclose(got_w, want_w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("program", ["saver", "streaming"])
def test_a_folder_one_host_does_not_share_stops_every_rank(hosts, tmp_path, program):
    """host1 mounts a folder of its own where host0 has the shared one: mxrec's Saver at its
    first save (the checkpoint folder), the streaming trainer at start (its model dir)."""
    private = tmp_path / "private"
    private.mkdir()
    if program == "saver":
        argv = [SCRIPT, "--out", str(tmp_path / "unused"), "--ckpt", str(private),
                "--full_at", "4", "--steps", "6"]
        env, said = None, "NotSharedError: mxrec Saver: the checkpoint folder"
        alone = "1 of 2 ranks do not see"
    else:
        write_data(tmp_path / "data")
        argv, env = command(1, tmp_path / "data", private, tmp_path / "export")
        argv = argv[1:]
        env.pop("MXREC_EXCHANGE", None)
        said = "NotSharedError: every rank must see the same folder"
        alone = f"the model dir (--model-dir) {private}: rank(s) [1] do not see"
    hosts.set_private([str(private)])
    try:
        result = _on_hosts(hosts, 1, argv, env=env)
    finally:
        hosts.set_private([])
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert said in output and alone in output, output[-3000:]
    # Nothing saved, rank 0's marker or temporary folder removed (the trainer's lock and
    # donefile stay: rank 0 made them before the ranks met).
    assert not [n for n in os.listdir(private) if n.startswith((".", "full-"))], \
        os.listdir(private)


def test_the_streaming_cli_on_two_hosts(hosts, tmp_path):
    """A version per partition (each verified), the versions one process delivers."""
    data = tmp_path / "data"
    write_data(data)
    one, env = command(1, data, tmp_path / "work1", tmp_path / "export1")
    _check(subprocess.run(one, env=env, capture_output=True, text=True, timeout=TIMEOUT))
    argv, env = command(1, data, tmp_path / "work2", tmp_path / "export2")
    env.pop("MXREC_EXCHANGE", None)
    result = _check(_on_hosts(hosts, 1, argv[1:], env=env))
    entries = donefile.read(str(tmp_path / "work2" / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == ALL_PARTITIONS
    assert {(e["ranks"], e["exchange"]) for e in entries} == {(2, "mpi")}
    assert "[1] " in result.stdout  # rank 1 (on host1) ran and spoke
    query = held_out(tmp_path / "held_out")
    want = predictions(tmp_path / "export1", query)
    assert len(want) == len(ALL_PARTITIONS)
    assert_same_versions(want, predictions(tmp_path / "export2", query), "2 hosts")
    shutil.rmtree(tmp_path / "export1")


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                          check=True).stdout


def test_the_hosts_are_removed_after_a_run_and_after_their_maker_is_killed(tmp_path):
    """close() removes the namespaces (their links and bridge with them); a maker killed
    before it closed leaves them to its reaper, which removes them and what runs there."""
    reason = simulated_hosts.unavailable()
    if reason is not None:
        pytest.skip(reason)
    with simulated_hosts.SimulatedHosts(2, str(tmp_path / "closed")) as made:
        names = [made.switch, *made.namespaces]
        assert all(name in _namespaces() for name in names)
    assert not [name for name in names if name in _namespaces()]
    maker = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from bench import simulated_hosts\n"
         f"h = simulated_hosts.SimulatedHosts(2, {str(tmp_path / 'killed')!r}).__enter__()\n"
         "import subprocess\n"
         "subprocess.Popen(h.on(1, ['sleep', '613.7']))\n"
         "print(' '.join([h.switch] + h.namespaces), flush=True)\n"
         "time.sleep(600)\n"],
        env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        names = maker.stdout.readline().split()
        assert len(names) == 3 and all(name in _namespaces() for name in names)
    finally:
        maker.kill()
        maker.wait()
    deadline = time.monotonic() + 30
    while [name for name in names if name in _namespaces()] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name in names if name in _namespaces()], _namespaces()
    sleeping = subprocess.run(["pgrep", "-f", "^sleep 613.7$"], capture_output=True, text=True)
    assert not sleeping.stdout.split(), "a process of a removed host still runs"

"""`python -m mxrec.launch --hostfile F / -H HOSTS`: the mpirun command it runs, the settings
it refuses, the variables it forwards to other hosts, and how a rank on another host is
bound (to its host's MPI daemon, since the launcher is not among its ancestors there).

The runs across (simulated) hosts are tests/test_several_hosts.py."""

import os
import signal
import subprocess
import sys

import pytest

from mxrec import launch

ENV = {"PYTHONPATH": "/repo", "MXREC_COLLECTIVE_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "2",
       "KEY_PROCESS_THREAD_NUM": "3", "USE_COMBINE_FAAE": "1", "HOME": "/root",
       "PATH": "/usr/bin", "MXREC_EXCHANGE": "mpi", "SSH_AUTH_SOCK": "/tmp/agent"}


def _pairs(argv, flag):
    return [tuple(argv[i + 1:i + 3]) for i, a in enumerate(argv) if a == flag]


def _values(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_mpirun_for_several_hosts(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\n")
    options = launch.MpiOptions(
        hostfile=str(hostfile), mca=[("btl_tcp_if_include", "10.0.0.0/24")],
        prtemca=[("oob_tcp_if_include", "10.0.0.0/24"), ("plm_ssh_agent", "/bin/agent")],
        forward=["LD_LIBRARY_PATH", "MY_SETTING=1"])
    argv = launch.mpirun_command(64, ["python", "train.py"], mpirun="/x/mpirun", options=options,
                                 env=ENV)
    assert argv[:3] == ["/x/mpirun", "-n", "64"] and argv[-2:] == ["python", "train.py"]
    assert _values(argv, "--hostfile") == [str(hostfile)]
    assert "--oversubscribe" not in argv  # the hostfile's slots decide, not this machine's cores
    assert _pairs(argv, "--mca") == [("btl_tcp_if_include", "10.0.0.0/24")]
    assert _pairs(argv, "--prtemca") == [("oob_tcp_if_include", "10.0.0.0/24"),
                                         ("plm_ssh_agent", "/bin/agent")]
    # Ranks on other hosts get only what -x names: mxrec's, TensorFlow's, Python's
    # variables and the pools', then the user's own; not the rest of this shell's.
    assert _values(argv, "-x") == [
        "KEY_PROCESS_THREAD_NUM", "MXREC_COLLECTIVE_TIMEOUT", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL",
        "USE_COMBINE_FAAE", "LD_LIBRARY_PATH", "MY_SETTING=1", "MXREC_EXCHANGE=mpi"]


def test_mpirun_on_this_machine_is_as_before():
    argv = launch.mpirun_command(2, ["python", "t.py"], mpirun="/x/mpirun", env=ENV)
    assert _values(argv, "-x") == ["MXREC_EXCHANGE=mpi"]  # local ranks inherit everything
    assert "--hostfile" not in argv and "--host" not in argv
    many = launch.mpirun_command((os.cpu_count() or 1) + 1, ["t"], mpirun="/x/mpirun", env=ENV)
    assert "--oversubscribe" in many
    hosts = launch.mpirun_command(2, ["t"], mpirun="/x/mpirun", env={},
                                  options=launch.MpiOptions(hosts="a:2,b"))
    assert _values(hosts, "--host") == ["a:2,b"]


@pytest.mark.parametrize("kwargs, message", [
    ({"hostfile": "/no/such/hostfile"}, "--hostfile: no such file: /no/such/hostfile"),
    ({"hosts": "a:0"}, "-H: 'a:0' in 'a:0' is not HOST or HOST:SLOTS"),
    ({"hosts": "a,,b"}, "-H: '' in 'a,,b' is not HOST"),
    ({"hosts": "a:two"}, "is not HOST or HOST:SLOTS"),
    ({"mca": [("btl", "")]}, "--mca: give KEY VALUE"),
    ({"forward": ["1BAD"]}, "-x: '1BAD' is no variable name"),
])
def test_bad_settings_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        launch.MpiOptions(**kwargs)


def test_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        launch.main(["--hostfile", str(tmp_path / "none"), "-n", "2", "t.py"])
    assert exited.value.code == 2
    assert "--hostfile: no such file" in capsys.readouterr().err


def test_threads_with_several_hosts_are_each_ranks_own(monkeypatch):
    """Only a rank knows how many ranks share its host: the launcher sets the pools only
    when told (--threads_per_rank or MXREC_THREADS_PER_RANK), and forwards that."""
    several = launch.MpiOptions(hosts="a,b")
    assert launch._threads(4, None, {}, several) is None  # noqa: SLF001
    assert launch._threads(4, 3, {}, several) == 3  # noqa: SLF001
    assert launch._threads(4, None, {"MXREC_THREADS_PER_RANK": "0"}, several) == 0  # noqa: SLF001
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert launch._threads(4, None, {}, launch.MpiOptions()) == 2  # noqa: SLF001
    env = launch.thread_env({"OMP_NUM_THREADS": "1"}, 3)
    assert env == {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "3",
                   "TF_NUM_INTEROP_THREADS": "3", "KEY_PROCESS_THREAD_NUM": "3",
                   "MXREC_THREADS_PER_RANK": "3"}


PROBE = ("import ctypes, os; v = ctypes.c_int(-1); "
         "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "  # 2: PR_GET_PDEATHSIG
         "print('pdeathsig', v.value)")


def test_a_rank_on_another_host_is_bound_to_its_parent():
    """On another host (its hostname or boot id differ from the launcher's) a rank has no
    launcher among its ancestors: it starts with the parent-death signal set on its parent
    (there, the host's MPI daemon) and does not look for the launcher."""
    bound = launch.bound_to_launcher([sys.executable, "-c", PROBE], generations=2,
                                     other_hosts=True)
    host = bound.index(launch.this_host())
    assert launch.this_host().startswith(os.uname().nodename + "/")
    # On this host: the launcher must be the grandparent, which this test process is not.
    here = subprocess.run(bound, capture_output=True, text=True, timeout=60)
    assert here.returncode == 1 and "the launcher (pid" in here.stderr
    elsewhere = bound[:host] + ["another-host/another-boot"] + bound[host + 1:]
    there = subprocess.run(elsewhere, capture_output=True, text=True, timeout=60)
    assert there.returncode == 0, there.stderr
    assert there.stdout.strip() == f"pdeathsig {int(signal.SIGKILL)}"

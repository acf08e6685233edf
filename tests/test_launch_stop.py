"""mxrec.launch stops in bounded time and names the failing rank (issue 23's launcher part),
and no rank outlives it (issue 52).

The ranks are small Python scripts (no TensorFlow): each writes its pid, then rank 0 fails
or everybody waits. For both engines (mpi: the launcher's mpirun; grpc: its own processes):
a rank that ignores SIGTERM, a frozen (SIGSTOPped) rank, and SIGTERM or SIGHUP to the
launcher leave no process behind within the grace period plus a margin, and the exit status
is the failing rank's; a launcher killed by a signal it cannot handle (SIGKILL, the OOM
killer's) or does not handle (SIGUSR1) takes every rank, and mpirun, with it within
seconds; under `nohup` SIGHUP stops nothing. Also `-m MODULE`.
"""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from mxrec import launch

ROOT = Path(__file__).resolve().parents[1]
GRACE = 2.0
MARGIN = 25.0  # process start-up under load, mpirun's own teardown

RANK_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("MXREC_RANK", "-1")))
    pids = sys.argv[1]
    with open(os.path.join(pids, f"rank-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    mode = sys.argv[2]
    print(f"rank {rank} up", flush=True)
    if mode == "ignore_term" and rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "freeze" and rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    if mode in ("ignore_term", "freeze") and rank == 0:
        time.sleep(1.5)
        sys.exit(3)
    time.sleep(600)
""")


def _engines():
    engines = ["grpc"]
    if launch.mpirun_path() is not None:
        engines.append("mpi")
    return engines


def _start(tmp_path, engine, mode, ranks=2, preexec_fn=None):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxrec.launch", "-n", str(ranks), "--engine", engine,
         "--grace", str(GRACE), str(script), str(pids), mode],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=preexec_fn)
    return proc, pids


def _rank_pids(pids, ranks, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [pids / f"rank-{r}" for r in range(ranks)]
        if all(p.exists() and p.read_text() for p in found):
            return [int(p.read_text()) for p in found]
        time.sleep(0.1)
    raise AssertionError("the ranks did not start")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waits only for its parent to reap it: gone for our purpose.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_all_gone(pids_of_ranks, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(_alive(p) for p in pids_of_ranks):
        time.sleep(0.1)
    left = [p for p in pids_of_ranks if _alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks still running: {left}"


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("mode", ["ignore_term", "freeze"])
def test_a_failed_rank_stops_every_rank_within_the_grace(tmp_path, engine, mode):
    proc, pids = _start(tmp_path, engine, mode)
    ranks = _rank_pids(pids, 2)
    start = time.monotonic()
    out, _ = proc.communicate(timeout=GRACE + MARGIN + 30)
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, out
    assert "rank 0 failed with exit status 3" in out, out
    assert elapsed < 1.5 + GRACE + MARGIN, (elapsed, out)
    _assert_all_gone(ranks, within=1.0)


@pytest.mark.parametrize("engine", _engines())
def test_sigterm_to_the_launcher_stops_every_rank(tmp_path, engine):
    proc, pids = _start(tmp_path, engine, "wait")
    ranks = _rank_pids(pids, 2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=GRACE + MARGIN)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "got SIGTERM" in out, out
    _assert_all_gone(ranks, within=1.0)


@pytest.mark.one_tf
@pytest.mark.parametrize("engine", _engines())
def test_sighup_to_the_launcher_stops_every_rank_as_sigterm_does(tmp_path, engine):
    """A closed terminal or a dropped ssh session. The launcher starts with SIGHUP at its
    default: a suite run under `nohup` would otherwise hand it an ignored SIGHUP, which it
    rightly keeps (the test below), and this test would wait out its whole timeout."""
    proc, pids = _start(tmp_path, engine, "wait",
                        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    ranks = _rank_pids(pids, 2)
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=GRACE + MARGIN)
    assert proc.returncode == 128 + signal.SIGHUP, out
    assert "got SIGHUP; stopping every rank" in out, out
    _assert_all_gone(ranks, within=1.0)


def _children(pid):
    """The processes whose parent is `pid` (any of its threads)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.one_tf
@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGUSR1], ids=["SIGKILL", "SIGUSR1"])
def test_a_launcher_killed_by_a_signal_takes_every_rank_with_it(tmp_path, engine, sig):
    """SIGKILL (the OOM killer's) runs no handler of the launcher; SIGUSR1 has none. Every
    rank, and under the MPI engine mpirun too, ends within seconds all the same."""
    proc, pids = _start(tmp_path, engine, "wait")
    ranks = _rank_pids(pids, 2)
    children = _children(proc.pid)  # grpc: the ranks; mpi: mpirun
    assert children, "the launcher has no child"
    if engine == "grpc":
        assert sorted(children) == sorted(ranks)
    os.kill(proc.pid, sig)
    proc.communicate(timeout=30)
    assert proc.returncode == -sig
    try:
        _assert_all_gone(ranks + children, within=5.0)
    finally:
        # prterun killed outright leaves its session directory (ompi.PID) behind.
        for pid in children:
            shutil.rmtree(Path(tempfile.gettempdir()) / f"ompi.{pid}", ignore_errors=True)


@pytest.mark.one_tf
def test_under_nohup_sighup_stops_nothing(tmp_path):
    """SIGHUP ignored when the launcher starts (what `nohup` does) stays ignored."""
    proc, pids = _start(tmp_path, "grpc", "wait",
                        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    ranks = _rank_pids(pids, 2)
    proc.send_signal(signal.SIGHUP)
    time.sleep(1.5)
    assert proc.poll() is None
    assert all(_alive(pid) for pid in ranks)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=GRACE + MARGIN)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "SIGHUP" not in out, out
    _assert_all_gone(ranks, within=1.0)


PDEATHSIG_PROBE = (
    "import ctypes, sys; v = ctypes.c_int(-1); "
    "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "  # 2: PR_GET_PDEATHSIG
    "print('pdeathsig', v.value, sys.argv[1:])")


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_bound_command_runs_with_the_parent_death_signal_set():
    """The wrapper execs the command (same argv, same environment) with SIGKILL as its
    parent-death signal; this test process plays the launcher."""
    command = launch.bound_to_launcher([sys.executable, "-c", PDEATHSIG_PROBE, "a b", "--x"])
    result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, MXREC_PROBE="kept"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"pdeathsig {int(signal.SIGKILL)} ['a b', '--x']"
    own = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(own), 0, 0, 0)
    assert own.value == 0  # set in the child only
    with pytest.raises(ValueError, match="generations must be >= 1"):
        launch.bound_to_launcher(["true"], generations=0)


def test_a_child_whose_launcher_is_gone_does_not_start(tmp_path, monkeypatch):
    """A launcher that died before the child set its parent-death signal would never send
    it: the child refuses to start. Also a grandchild whose parent's parent is not the
    launcher (a rank under an mpirun whose launcher died)."""
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    dead = _dead_pid()
    monkeypatch.setattr(os, "getpid", lambda: dead)
    bound = launch.bound_to_launcher(command)
    monkeypatch.undo()
    refused = subprocess.run(bound, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert f"the launcher (pid {dead}) is gone; not starting" in refused.stderr
    assert not marker.exists()
    # This process is the parent, not the grandparent, of what it starts.
    wrong = subprocess.run(launch.bound_to_launcher(command, generations=2), capture_output=True,
                           text=True, timeout=60)
    assert wrong.returncode == 1 and "is gone; not starting" in wrong.stderr
    assert not marker.exists()
    missing = subprocess.run(launch.bound_to_launcher([str(tmp_path / "no-such-program")]),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "cannot run" in missing.stderr


def test_module_runs_as_python_dash_m(tmp_path):
    package = tmp_path / "pkg_launch_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import os, sys\nprint('module rank', os.environ.get('OMPI_COMM_WORLD_RANK', "
        "os.environ.get('MXREC_RANK')), sys.argv[1:])\n")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    result = subprocess.run(
        [sys.executable, "-m", "mxrec.launch", "-n", "2", "--engine", "grpc", "-m",
         "pkg_launch_probe", "train", "--flag"],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"[{rank}] module rank {rank} ['train', '--flag']" in result.stdout, result.stdout


def test_grace_setting_is_checked(monkeypatch):
    monkeypatch.setenv("MXREC_LAUNCH_GRACE", "soon")
    with pytest.raises(ValueError, match="MXREC_LAUNCH_GRACE"):
        launch._grace(None)  # noqa: SLF001


THREADS_PROBE = textwrap.dedent("""
    import os
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("MXREC_RANK"))
    names = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "KEY_PROCESS_THREAD_NUM",
             "OMP_NUM_THREADS")
    print("threads", rank, ",".join(os.environ.get(n, "-") for n in names), flush=True)
""")


@pytest.mark.parametrize("engine", _engines())
def test_each_rank_gets_its_share_of_the_cores(tmp_path, engine, monkeypatch):
    """N local ranks share the cores: each rank's pools default to cores // N (at least 1);
    a variable the user set stays; --threads_per_rank 0 sets none."""
    script = tmp_path / "probe.py"
    script.write_text(THREADS_PROBE)
    cores = len(os.sched_getaffinity(0))  # what the launcher's own process will see
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert launch.default_threads_per_rank(1) == 0
    assert launch.default_threads_per_rank(2) == 4
    assert launch.default_threads_per_rank(3) == 2
    assert launch.default_threads_per_rank(16) == 1
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE",
                 *launch.THREAD_VARIABLES):
        env.pop(name, None)

    def run(extra, **more):
        result = subprocess.run(
            [sys.executable, "-m", "mxrec.launch", "-n", "2", "--engine", engine, *extra,
             str(script)], env=dict(env, **more), capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return sorted(line.split("threads ", 1)[1] for line in result.stdout.splitlines()
                      if "threads " in line)

    assert run(["--threads_per_rank", "3"]) == ["0 3,3,3,3", "1 3,3,3,3"]
    assert run(["--threads-per-rank", "3"], OMP_NUM_THREADS="7") == ["0 3,3,3,7", "1 3,3,3,7"]
    assert run(["--threads_per_rank", "0"]) == ["0 -,-,-,-", "1 -,-,-,-"]
    share = str(max(1, cores // 2))
    assert run([]) == [f"0 {share},{share},{share},{share}", f"1 {share},{share},{share},{share}"]
    with pytest.raises(ValueError, match="threads_per_rank must be >= 0"):
        launch.launch(2, [sys.executable, str(script)], threads_per_rank=-1)

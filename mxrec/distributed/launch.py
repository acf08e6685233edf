"""Starts N local training processes without MPI: `python -m mxrec.launch -n N script.py ...`.

Each process runs `script.py` with the same arguments and MXREC_RANK, MXREC_SIZE and
MXREC_CLUSTER (one loopback host:port per rank) in its environment, which `init(use_mpi=True)`
(or any init() under the launcher) reads. Output lines are prefixed with the rank. When a rank
fails, the others are stopped and the launcher exits with that rank's status; it exits 0 only
when every rank did.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional


def _free_ports(count: int) -> List[int]:
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


def _relay(rank: int, stream, out):
    for line in iter(stream.readline, b""):
        out.write(f"[{rank}] {line.decode(errors='replace')}")
        out.flush()
    stream.close()


def launch(num: int, command: List[str], env: Optional[dict] = None,
           timeout: Optional[float] = None) -> int:
    """Runs `command` as `num` ranks; returns the exit status (the first failing rank's)."""
    if num < 1:
        raise ValueError(f"mxrec.launch: -n must be >= 1, got {num}")
    ports = _free_ports(num)
    cluster = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs, relays = [], []
    for rank in range(num):
        child_env = dict(os.environ if env is None else env)
        child_env.update(MXREC_RANK=str(rank), MXREC_SIZE=str(num), MXREC_CLUSTER=cluster)
        proc = subprocess.Popen(command, env=child_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        procs.append(proc)
        relay = threading.Thread(target=_relay, args=(rank, proc.stdout, sys.stdout), daemon=True)
        relay.start()
        relays.append(relay)
    status = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        running = set(range(num))
        while running:
            for rank in sorted(running):
                code = procs[rank].poll()
                if code is None:
                    continue
                running.discard(rank)
                if code != 0 and status == 0:
                    status = code if code > 0 else 128 - code
                    sys.stderr.write(f"mxrec.launch: rank {rank} exited with {code}; stopping "
                                     "the other ranks\n")
                    for other in running:
                        procs[other].send_signal(signal.SIGTERM)
            if deadline is not None and time.monotonic() > deadline and running:
                sys.stderr.write(f"mxrec.launch: ranks {sorted(running)} still running after "
                                 f"{timeout} s; stopping them\n")
                for rank in running:
                    procs[rank].kill()
                status = status or 124
                deadline = None
            time.sleep(0.05)
    except KeyboardInterrupt:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        status = 130
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    for relay in relays:
        relay.join(timeout=5)
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mxrec.launch",
        description="Run a training script as N local ranks (multi-worker mxrec without MPI).")
    parser.add_argument("-n", "--num_ranks", type=int, required=True,
                        help="number of ranks (processes) to start")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop every rank after this many seconds (exit status 124)")
    parser.add_argument("script", help="the training script (or -m module)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = parser.parse_args(argv)
    if args.script == "-m":
        if not args.args:
            parser.error("-m needs a module name")
        command = [sys.executable, "-m"] + args.args
    else:
        if not os.path.exists(args.script):
            parser.error(f"no such script: {args.script}")
        command = [sys.executable, args.script] + args.args
    return launch(args.num_ranks, command, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())

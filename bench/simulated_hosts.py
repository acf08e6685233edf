"""Several hosts on one Linux machine, for the several-hosts test and benchmark (as root).

Each host is a network namespace with an address of its own (198.18.0.H/24, the range RFC
2544 sets aside for benchmarks) and, in every process started on it, a UTS namespace with a
hostname of its own (`host0`, `host1`, ...): Open MPI tells hosts apart by name, so with one
shared hostname it would take every rank for a local one. The hosts' links meet on a bridge
in a namespace of its own (the switch), so nothing is added to the machine's own network
namespace and two runs at once cannot collide; each host's link can be capped with
`tc ... tbf` (this kernel has no netem: a rate, no added delay). Open MPI's mpirun starts its
daemon on another host through an ssh stand-in, the agent: a script that enters that host's
namespaces with a clean environment, as ssh would give a fresh login one. The filesystem is
the machine's on every host: a folder is shared, as a cluster's shared storage is.

    with SimulatedHosts(2, workdir) as hosts:
        subprocess.run(hosts.on(0, [sys.executable, "-m", "mxrec.launch",
                                    "--hostfile", hosts.hostfile(1), "-n", "2",
                                    *hosts.launcher_flags(), "train.py"]))

Everything a run made (namespaces, their links and bridge, what still runs in them) is
removed by `close()`, whatever happened. A maker killed before it closed (SIGKILL, a
SIGTERM that ends Python without `finally`) leaves them to its reaper: a process of its own
session that reads a pipe from the maker until EOF, which the kernel gives it when the
maker ends however it ends, and then removes the same namespaces. Namespaces whose maker and
reaper are both gone (their names carry the maker's pid) are removed by the next run.
"""

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

SUBNET = "198.18.0.0/24"
_PREFIX = "mxrec-hosts-"
_NAME = re.compile(rf"^{_PREFIX}(\d+)-[0-9a-f]+-(sw|h\d+)$")


class Unavailable(RuntimeError):
    """This machine cannot simulate hosts (not root, no `ip netns`, ...)."""


def _run(argv: List[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise Unavailable(f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


# The reaper (module docstring): `python -I -S -c _REAPER NAMESPACE...`, its stdin the pipe.
_REAPER = """\
import os, subprocess, sys
sys.stdin.buffer.read()
for name in sys.argv[1:]:
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in listed.stdout.split():
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
"""


def unavailable() -> Optional[str]:
    """Why hosts cannot be simulated here, or None: not Linux, not root, `ip`, `unshare` or
    `tc` missing, or the kernel refusing network namespaces, veth links or bridges."""
    if not sys.platform.startswith("linux"):
        return f"simulated hosts need Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "simulated hosts need root (network and UTS namespaces)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}` (iproute2, util-linux), not found on PATH"
    try:
        with SimulatedHosts(2, rate=None, probe=True):
            pass
    except (Unavailable, subprocess.TimeoutExpired) as error:
        return f"this machine cannot simulate hosts: {error}"
    return None


class SimulatedHosts:
    """`count` hosts in namespaces of their own, joined by a bridge (module docstring).

    Args:
        count: how many hosts (2 to 200).
        workdir: where the agent and hostfiles are written (None: no files; probe only).
        rate: each host's link rate as tc writes it ("10gbit"), None for uncapped.
        probe: only make and remove the namespaces and links (unavailable()).
    """

    def __init__(self, count: int, workdir: Optional[str] = None, rate: Optional[str] = None,
                 probe: bool = False):
        if not 2 <= count <= 200:
            raise ValueError(f"SimulatedHosts: 2 to 200 hosts, got {count}")
        self.count = count
        self.workdir = None if workdir is None else Path(workdir)
        self.rate = rate
        self.probe = probe
        tag = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{tag}-sw"
        self.namespaces = [f"{tag}-h{i}" for i in range(count)]
        self.names = [f"host{i}" for i in range(count)]
        self.addresses = [f"198.18.0.{i + 1}" for i in range(count)]
        self._made: List[str] = []
        self._reaper: Optional[subprocess.Popen] = None

    # ------------------------------------------------------------------ life

    def __enter__(self) -> "SimulatedHosts":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_):
        self.close()

    def start(self) -> None:
        remove_abandoned()
        self._reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER, *reversed(self.namespaces), self.switch],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # a Ctrl-C to the maker's process group spares it
        self._namespace(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for index, namespace in enumerate(self.namespaces):
            self._namespace(namespace)
            # Made in the switch's namespace with its peer put straight into the host's: no
            # interface ever appears in the machine's own namespace.
            port = f"p{index}"
            _run(["ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
                  "eth0", "netns", namespace])
            _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "-n", namespace, "addr", "add", f"{self.addresses[index]}/24", "dev",
                  "eth0"])
            _run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
            _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        if self.probe:
            _run(["unshare", "--uts", "--mount", "true"])
            return
        self.set_rate(self.rate)
        if self.workdir is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._write_agent()
        self._check_link()

    def _namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._made.append(name)

    def close(self) -> None:
        """Ends what runs in the namespaces and removes them (their links with them)."""
        for name in reversed(self._made):
            _remove_namespace(name)
        self._made = []
        if self._reaper is not None:  # EOF: it finds nothing left to remove
            self._reaper.stdin.close()
            self._reaper.wait(timeout=60)
            self._reaper = None

    # ------------------------------------------------------------------ use

    def set_rate(self, rate: Optional[str]) -> None:
        """Caps what each host sends at `rate` ("1gbit"; None: uncapped): a token bucket
        (tbf) on its interface, so every flow between two hosts is capped at its sender.

        The bucket holds 64 KiB (one GSO packet of the veth link; a smaller bucket would make
        tbf split those): a NIC sends at its line rate, so the bucket must stay small against
        the megabyte a step sends, or a step's first megabyte would pass at the speed of
        memory while the bucket refills during the step's compute. The queue holds 10 ms."""
        for namespace in self.namespaces:
            _run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", "eth0", "root"],
                 check=False)
            if rate is not None:
                _run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "eth0",
                      "root", "tbf", "rate", rate, "burst", "64kb", "latency", "10ms"])
        self.rate = rate

    def tx_bytes(self) -> List[int]:
        """The bytes each host has sent on its link so far (its interface's counter)."""
        return [int(_run(["ip", "netns", "exec", namespace, "cat",
                          "/sys/class/net/eth0/statistics/tx_bytes"]).stdout)
                for namespace in self.namespaces]

    def on(self, host: int, argv: List[str]) -> List[str]:
        """`argv` run on host `host` (its network namespace and hostname), in this
        process's environment."""
        return ["ip", "netns", "exec", self.namespaces[host], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.names[host], *argv]

    def hostfile(self, slots: int) -> str:
        """A hostfile of every host with `slots` slots; its path."""
        path = self.workdir / f"hostfile-{slots}"
        path.write_text("".join(f"{name} slots={slots}\n" for name in self.names))
        return str(path)

    @property
    def agent(self) -> str:
        return str(self.workdir / "agent.sh")

    def launcher_flags(self) -> List[str]:
        """mxrec.launch's flags for these hosts: the agent, and the network to use for
        mpirun's daemons and for the ranks' TCP transport."""
        return ["--prtemca", "plm_ssh_agent", self.agent,
                "--prtemca", "oob_tcp_if_include", SUBNET,
                "--mca", "btl_tcp_if_include", SUBNET]

    def set_private(self, folders: List[str]) -> None:
        """Daemons started from now on (on every host but host0, where the launcher runs)
        see an empty folder of their own at each of `folders`: a host's own disk mounted
        where the others mount shared storage."""
        Path(self._private_list).write_text("".join(f"{folder}\n" for folder in folders))

    @property
    def _private_list(self) -> str:
        return str(self.workdir / "private-folders")

    def _write_agent(self) -> None:
        """The ssh stand-in: `agent [OPTIONS] HOST COMMAND...` runs COMMAND (one shell line,
        as ssh passes it) on HOST with an environment as bare as a fresh ssh login's, in a
        mount namespace of its own (set_private)."""
        cases = "".join(f"  {name}) ns={shlex.quote(ns)} ;;\n"
                        for name, ns in zip(self.names, self.namespaces))
        enter = str(self.workdir / "enter.sh")
        Path(enter).write_text(
            "#!/bin/sh\n"
            "# enter.sh HOST LINE: on a simulated host, its hostname, its private folders\n"
            'hostname "$1" || exit 1\n'
            f"if [ -s {shlex.quote(self._private_list)} ]; then\n"
            '  while IFS= read -r folder; do\n'
            '    mount -t tmpfs mxrec-private "$folder" || exit 1\n'
            f"  done < {shlex.quote(self._private_list)}\n"
            "fi\n"
            'exec sh -c "$2"\n')
        Path(self.agent).write_text(
            "#!/bin/sh\n"
            "# ssh stand-in for simulated hosts (bench/simulated_hosts.py)\n"
            'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\n'
            'host=$1; shift\n'
            'case "$host" in\n'
            f"{cases}"
            '  *) echo "agent: no simulated host $host" >&2; exit 255 ;;\n'
            "esac\n"
            'exec env -i PATH="$PATH" HOME="${HOME:-/root}" ip netns exec "$ns" '
            f'unshare --uts --mount {shlex.quote(enter)} "$host" "$*"\n')
        for script in (enter, self.agent):
            os.chmod(script, 0o755)

    def _check_link(self) -> None:
        """host1 reaches a TCP port of host0 (a firewall on bridges would stop Open MPI)."""
        server = ("import socket; s = socket.socket(); s.settimeout(20); "
                  f"s.bind(('{self.addresses[0]}', 0)); s.listen(1); "
                  "print(s.getsockname()[1], flush=True); s.accept()")
        listening = subprocess.Popen(["ip", "netns", "exec", self.namespaces[0], sys.executable,
                                      "-c", server], stdout=subprocess.PIPE, text=True)
        try:
            port = listening.stdout.readline().strip()
            client = (f"import socket; socket.create_connection(('{self.addresses[0]}', {port}), "
                      "timeout=10)")
            done = _run(["ip", "netns", "exec", self.namespaces[1], sys.executable, "-c", client],
                        check=False)
            if done.returncode != 0:
                raise Unavailable(f"simulated host1 cannot reach host0 over TCP: "
                                  f"{done.stderr.strip()[-300:]}")
        finally:
            listening.kill()
            listening.wait()


def _remove_namespace(name: str) -> None:
    pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    _run(["ip", "netns", "del", name], check=False)


def remove_abandoned() -> List[str]:
    """Removes the namespaces of runs whose maker is gone (killed before it closed them);
    returns their names. Only names this module gives, of a pid no process has now."""
    listed = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    removed = []
    for line in listed:
        name = line.split(" ")[0].strip()
        match = _NAME.match(name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        _remove_namespace(name)
        removed.append(name)
    return removed

"""A tiered table of more values than its process may hold: tests/tier_memory_worker.py
trains 3 M IDs x dim 64 with Adagrad (1.4 GiB of rows and slots; a device cache of 100 k rows,
a host tier of 200 k, the rest on the SSD tier) inside a memory cgroup of 1 GiB that counts
page cache, as a pod's limit does, and checks 64 probe IDs, which come back from every tier,
against Adagrad's updates computed in NumPy (the same worker in a cgroup of 400 MiB is killed
for memory, so the limit binds). Skipped where no cgroup v1 memory controller is
writable (it needs root)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CGROUPS = Path("/sys/fs/cgroup/memory")
LIMIT = 1 << 30
IDS = 3_000_000


@pytest.fixture
def memory_cgroup():
    if not os.access(CGROUPS, os.W_OK):
        pytest.skip(f"no writable cgroup v1 memory controller at {CGROUPS} (needs root)")
    path = CGROUPS / f"mxrec-test-tiers-{os.getpid()}"
    path.mkdir()
    try:
        (path / "memory.limit_in_bytes").write_text(str(LIMIT))
        yield path
    finally:
        path.rmdir()


def test_a_table_larger_than_its_memory_limit_trains_exactly(memory_cgroup, tmp_path):
    procs = str(memory_cgroup / "cgroup.procs")
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            [sys.executable, str(root / "tests" / "tier_memory_worker.py"), str(IDS),
             str(tmp_path)],
            preexec_fn=lambda: Path(procs).write_text(str(os.getpid())),
            env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True,
            timeout=600)
    finally:
        # The worker exits with its table, whose SSD file (1.4 GB) stays on disk.
        for leftover in tmp_path.glob("mxrec-ssd-*"):
            shutil.rmtree(leftover)
    oom = (memory_cgroup / "memory.oom_control").read_text()
    assert "oom_kill 0" in oom, oom
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["value_bytes"] > 1.3 * LIMIT and got["ssd_rows"] > 2_500_000, got
    assert got["checked"] > 300 and got["worst"] <= 4e-6, got

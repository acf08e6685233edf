"""C++ unit tests of the engine (tests/cc/engine_units_test.cc), built against the engine
library: the ID map grows on insert and keeps its records when growth fails; the thread pool
hands an item's exception to the caller instead of ending the process."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIB_DIR = ROOT / "mxrec" / "_lib"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the C++ tests")
def test_engine_units(tmp_path):
    assert (LIB_DIR / "libmxrec_engine.so").exists(), "build the engine first (setup.py)"
    binary = tmp_path / "engine_units_test"
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
         f"-I{ROOT / 'cc_ops'}", str(ROOT / "tests" / "cc" / "engine_units_test.cc"),
         "-o", str(binary), f"-L{LIB_DIR}", "-lmxrec_engine", f"-Wl,-rpath,{LIB_DIR}"],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    # A map that cannot grow on insert would probe for a free bucket forever.
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

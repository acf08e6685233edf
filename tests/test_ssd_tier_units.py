"""C++ unit tests of the SSD tier (tests/cc/ssd_tier_test.cc), built against the engine
library: its open-addressing index and its records (puts, per-component reads, erases,
compactions) against std::unordered_map references."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIB_DIR = ROOT / "mxrec" / "_lib"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the C++ tests")
def test_ssd_tier_units(tmp_path):
    assert (LIB_DIR / "libmxrec_engine.so").exists(), "build the engine first (setup.py)"
    binary = tmp_path / "ssd_tier_test"
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
         f"-I{ROOT / 'cc_ops'}", str(ROOT / "tests" / "cc" / "ssd_tier_test.cc"),
         "-o", str(binary), f"-L{LIB_DIR}", "-lmxrec_engine", f"-Wl,-rpath,{LIB_DIR}"],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    scratch = tmp_path / "ssd"
    scratch.mkdir()
    result = subprocess.run([str(binary), str(scratch)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:2] == ["ssd index: ok", "ssd tier records: ok"]
    assert not list(scratch.iterdir()), "the tier's file outlives the tier"

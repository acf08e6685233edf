"""The SSD tier's files (tests/cc/ssd_tier_files_test.cc, built against the engine library):
a private 0700 directory per tier under ssd_data_path, files created with O_EXCL and
O_NOFOLLOW (a symlink or file planted at a name is neither followed, truncated nor removed,
and the error names the path and ssd_data_path), and dropping a tier removes only what it
created, also when its process exits with the table alive (but not a forked child)."""

import os
import subprocess
import sys
from pathlib import Path

from support import build_cc_test, needs_gxx


@needs_gxx
def test_ssd_tier_files(tmp_path):
    binary = build_cc_test("ssd_tier_files_test", tmp_path)
    scratch = tmp_path / "ssd"
    scratch.mkdir()
    result = subprocess.run([str(binary), str(scratch)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "private directory: ok", "planted restride file: ok",
        "drop removes only its own: ok", "directory errors: ok"]
    assert not list(scratch.iterdir())


EXITING = r"""
import os, sys
import numpy as np
from mxrec._lib import loader

engine = loader.engine()
key = "exiting/t"
engine.create_table(key=key, name="exiting", dim=4, capacity=16, host_capacity=16,
                    ssd_capacity=1000, ssd_path=sys.argv[1])
engine.tier_register(key, "slot")
device = np.zeros((16, 4), np.float32)
for step in range(40):
    (_, _, reused), = engine.process([key], [np.arange(step * 8, step * 8 + 8)], True, step)
    for component in ("embedding", "slot"):
        engine.tier_swap(key, component, reused, device[reused])
assert engine.tier_stats(key)["ssd_rows"] > 0
(directory,) = os.listdir(sys.argv[1])
assert os.listdir(os.path.join(sys.argv[1], directory)) == ["rows.dat"]
child = os.fork()
if child == 0:
    sys.exit(0)  # a forked child's exit leaves its parent's file alone
os.waitpid(child, 0)
assert os.listdir(os.path.join(sys.argv[1], directory)) == ["rows.dat"]
print("exiting with the table alive")
"""


def test_a_process_that_exits_leaves_no_ssd_file(tmp_path):
    """Tables are not dropped when their process exits; their SSD files and directories
    go with it all the same (a forked child's exit does not take its parent's)."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", EXITING, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "exiting with the table alive"
    assert list(tmp_path.iterdir()) == []

"""C++ unit tests of the ID map's layout (tests/cc/key_map_growth_test.cc), built against the
engine library: probe arrays grow by 1.5x steps with multiply-shift home slots, deletion by
backward shift across the array's wrap-around leaves no tombstones, an erased ID comes back
with a fresh record, shrink ages exist from the first shrink on, and a device-only table whose
rows run out refuses the batch with an error naming the table, the limit and the setting."""

import subprocess

from support import build_cc_test, needs_gxx


@needs_gxx
def test_key_map_growth(tmp_path):
    binary = build_cc_test("key_map_growth_test", tmp_path)
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok") == 4, result.stdout

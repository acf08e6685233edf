"""C++ unit tests of the engine (tests/cc/engine_units_test.cc), built against the engine
library: the ID map grows on insert and keeps its records when growth fails; the thread pool
hands an item's exception to the caller instead of ending the process."""

import subprocess

from support import build_cc_test, needs_gxx


@needs_gxx
def test_engine_units(tmp_path):
    binary = build_cc_test("engine_units_test", tmp_path)
    # A map that cannot grow on insert would probe for a free bucket forever.
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

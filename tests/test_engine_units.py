"""C++ unit tests of the engine (tests/cc/engine_units_test.cc), built against the engine
library: the ID map grows on insert and keeps its records when growth fails; the thread pool
hands an item's exception to the caller instead of ending the process. And the built
library's key-stage probe still prefetches (a compiler can drop prefetches silently)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support import build_cc_test, needs_gxx

from mxrec._lib import loader


@needs_gxx
def test_engine_units(tmp_path):
    binary = build_cc_test("engine_units_test", tmp_path)
    # A map that cannot grow on insert would probe for a free bucket forever.
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _function_bodies(disassembly: str, name: str) -> list:
    """The instruction lines of every function in `disassembly` (objdump -d -C) whose
    symbol starts with `name`, one string per function (clones included)."""
    bodies, current = [], None
    for line in disassembly.splitlines():
        if line.endswith(">:"):
            symbol = line.split("<", 1)[1][:-2]
            current = [] if symbol.startswith(name) else None
            if current is not None:
                bodies.append(current)
        elif current is not None:
            current.append(line)
    return ["\n".join(body) for body in bodies]


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_key_stage_probe_keeps_its_prefetches():
    # GCC deletes a call to a function whose only effect is a prefetch (it takes it for a
    # pure one): the probe loop of FindIds lost every prefetch of the ID map and the dedupe
    # table that way once its prefetch wrapper stopped being inlined (one-thread planning of
    # one large table 0.6x). The wrappers are always inlined now; the built library must
    # still prefetch inside FindIds.
    library = Path(loader.__file__).resolve().parent / "libmxrec_engine.so"
    disassembly = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(library)],
                                 capture_output=True, text=True, check=True).stdout
    bodies = _function_bodies(disassembly, "mxrec::BatchPlanner::FindIds(")
    assert bodies, "BatchPlanner::FindIds is not in the engine library"
    prefetches = sum(len(re.findall(r"\t(prefetch\w*|prfm)\s", body)) for body in bodies)
    # The one-pass scan and the scattered path each prefetch the map slot and the dedupe
    # entry, ahead and in the first run.
    assert prefetches >= 4, f"FindIds has {prefetches} prefetch instructions"

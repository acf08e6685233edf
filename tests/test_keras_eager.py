"""mxrec.keras' eager tests (tests/keras_eager/eager_*.py) in a process of their own, and
the refusal of mxrec.keras in this one (conftest.py turned eager execution off)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import mxrec.keras as mk

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_eager_suite():
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--noconftest", "-p", "no:cacheprovider", "-q",
         "-o", "python_files=eager_*.py", str(ROOT / "tests" / "keras_eager")],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", done.stdout), done.stdout[-3000:]
    assert not re.search(r"\b\d+ (failed|error)", done.stdout), done.stdout[-6000:]


def test_graph_mode_is_refused():
    with pytest.raises(RuntimeError, match="eager mode"):
        mk.init()
    with pytest.raises(RuntimeError, match="eager mode"):
        mk.Embedding(4, "t", 10)

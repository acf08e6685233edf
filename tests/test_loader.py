"""Loading the native libraries: a build for another TensorFlow is refused, not crashed on."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script):
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)


def test_op_library_refuses_a_build_for_another_tensorflow():
    proc = _run("import tensorflow as tf\n"
                "tf.__version__ = '2.99.0'\n"
                "from mxrec._lib import loader\n"
                "loader.op_library()\n")
    assert proc.returncode != 0
    assert "ImportError: mxrec's ops were built for TensorFlow" in proc.stderr
    assert "2.99.0" in proc.stderr and "pip install ." in proc.stderr


def test_op_library_loads_for_this_tensorflow():
    proc = _run("from mxrec._lib import loader\n"
                "lib = loader.op_library()\n"
                "assert hasattr(lib, 'mxrec_key_stage') and hasattr(lib, 'mxrec_set_threshold')\n"
                "assert loader.op_library() is lib\n")
    assert proc.returncode == 0, proc.stderr

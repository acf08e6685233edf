"""Helpers several test files share (the references they compare against are in reference.py)."""

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import tensorflow as tf

from mxrec._lib import loader
from mxrec.optimizers import adagrad, gradient_descent, lazy_adam


def _has_estimator() -> bool:
    try:
        return hasattr(tf, "estimator") and hasattr(tf.estimator, "Estimator")
    except ImportError:
        return False


needs_estimator = pytest.mark.skipif(
    not _has_estimator(), reason="tf.estimator (tensorflow_estimator) is not available; it "
    "ships with TensorFlow <= 2.15 only")

# The hash optimizers the host/SSD tier tests train with: each has its own slots to swap.
TIER_OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(0.1),
    "adagrad": lambda: adagrad.create_hash_optimizer(0.1),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(0.01),
}


def read_scalars(logdir) -> dict:
    """{tag: {step: value}} of the scalar summaries written under logdir."""
    tf.compat.v1.summary.FileWriterCache.clear()  # flush the writers
    values = {}
    for path in glob.glob(os.path.join(str(logdir), "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                values.setdefault(value.tag, {})[event.step] = value.simple_value
    return values


def wait_for_planned_batches(table, batches: int, timeout: float = 10.0) -> None:
    """Waits until `batches` batches of `table` are planned ahead of their step.

    The graph modifier's pipeline plans asynchronously: how many batches are pending when a
    test evicts or restores depends on its progress. Waiting for the refilled prefetch buffer
    makes runs comparable.
    """
    engine = loader.engine()
    deadline = time.monotonic() + timeout
    while engine.pending_batches(table.table_key) < batches and time.monotonic() < deadline:
        time.sleep(0.001)
    assert engine.pending_batches(table.table_key) == batches


_ROOT = Path(__file__).resolve().parent.parent
_LIB_DIR = _ROOT / "mxrec" / "_lib"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="needs g++ to build the C++ tests")


def build_cc_test(name: str, out_dir) -> Path:
    """Builds tests/cc/<name>.cc against the engine library into `out_dir`; returns the
    binary (the build's errors fail the calling test)."""
    assert (_LIB_DIR / "libmxrec_engine.so").exists(), "build the engine first (setup.py)"
    binary = Path(out_dir) / name
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
         f"-I{_ROOT / 'cc_ops'}", f"-I{_ROOT / 'tests' / 'cc'}",
         str(_ROOT / "tests" / "cc" / f"{name}.cc"), "-o", str(binary), f"-L{_LIB_DIR}",
         "-lmxrec_engine", f"-Wl,-rpath,{_LIB_DIR}"],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return binary

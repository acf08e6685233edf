"""Helpers several test files share (the references they compare against are in reference.py)."""

import glob
import os
import time

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

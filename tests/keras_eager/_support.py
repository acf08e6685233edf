"""What every eager test module shares (run with --noconftest: see tests/test_keras_eager.py)."""

import pytest
import tensorflow as tf

import mxrec.keras as mk
from mxrec.util import initialize


@pytest.fixture(autouse=True)
def fresh():
    """Each test under its own mk.init() and a cleared Keras session."""
    mk.init()
    yield
    initialize.terminate_config_initializer()
    tf.keras.backend.clear_session()

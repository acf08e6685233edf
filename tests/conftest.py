"""Shared fixtures: TF1 graph mode, one mxrec init() per test, sessions."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

from mxrec._lib import loader  # noqa: E402
from mxrec.util import initialize  # noqa: E402


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """Every test starts with a fresh default graph, no init() in force and no
    KEY_PROCESS_THREAD_NUM / USE_COMBINE_FAAE from the caller's environment."""
    monkeypatch.delenv("KEY_PROCESS_THREAD_NUM", raising=False)
    monkeypatch.delenv("USE_COMBINE_FAAE", raising=False)
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    yield
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()


@pytest.fixture
def mx():
    """Calls init(**kwargs) (once per call) and returns the ConfigInitializer."""

    def _init(**kwargs):
        return initialize.init(**kwargs)

    return _init


@pytest.fixture
def engine():
    return loader.engine()


def _session_config():
    return tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)


@pytest.fixture
def make_session():
    """make_session(graph=None) -> a Session on graph with global variables initialised."""
    sessions = []

    def _make(graph=None):
        graph = graph or tf.compat.v1.get_default_graph()
        sess = tf.compat.v1.Session(graph=graph, config=_session_config())
        with graph.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
        sessions.append(sess)
        return sess

    yield _make
    for sess in sessions:
        sess.close()


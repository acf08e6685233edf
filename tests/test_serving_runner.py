"""The predictor's signature runner (`mxrec.serving.runner`): the same answers and refusals
as `session.run` on the same feeds, through the direct session call on the TensorFlow
versions mxrec supports, and through `session.run` where that call is missing."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.serving import runner


@pytest.fixture
def model():
    """A session over a small graph: int64 IDs [B, 3] and float32 dense [B, 2] in, two
    outputs; plus a slow output for deadlines."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 3], name="ids")
        dense = tf.compat.v1.placeholder(tf.float32, [None, 2], name="dense")
        words = tf.compat.v1.placeholder(tf.string, [None], name="words")
        score = tf.reduce_sum(tf.cast(ids % 1000, tf.float32), 1, keepdims=True) * \
            tf.reduce_prod(dense, 1, keepdims=True)
        checked = tf.debugging.assert_non_negative(ids, message="ids must be >= 0")
        with tf.control_dependencies([checked]):
            top = tf.reduce_max(ids, 1)
        length = tf.strings.length(words)
        # Seconds of loop steps (bounded, so a deadline not honoured fails, not hangs).
        slow = tf.while_loop(lambda i: i < 10 ** 6 + tf.reduce_sum(ids) * 0,
                             lambda i: i + 1, [tf.constant(0, tf.int64)])[0]
        graph.finalize()
    session = tf.compat.v1.Session(graph=graph)
    yield session, {"ids": ids, "dense": dense, "words": words}, \
        {"score": score, "top": top, "length": length, "slow": slow}
    session.close()


def _feeds():
    rng = np.random.default_rng(3)
    ids = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, [5, 3],
                       dtype=np.int64, endpoint=True)
    ids[0] = [np.iinfo(np.int64).max, 0, 1]
    return np.abs(ids // 2), rng.standard_normal([5, 2]).astype(np.float32)


def test_the_direct_call_is_used_and_answers_as_session_run(model):
    session, inputs, outputs = model
    assert runner.available(session)  # TensorFlow 2.15 to 2.21: not a silent fallback
    ids, dense = _feeds()
    chosen = {k: outputs[k] for k in ("score", "top")}
    for direct in (True, False):
        run = runner.SignatureRunner(session, {k: inputs[k] for k in ("ids", "dense")},
                                     chosen)
        run.direct = direct and run.direct
        # A list and a float64 array are converted as session.run converts them.
        got = run({"ids": ids.tolist(), "dense": dense.astype(np.float64)}, timeout=30)
        want = session.run(chosen, {inputs["ids"]: ids, inputs["dense"]: dense})
        assert sorted(got) == ["score", "top"]
        for key in want:
            assert got[key].dtype == want[key].dtype
            np.testing.assert_array_equal(got[key], want[key])
        words = np.array([b"a", b"\xff\x00bc", b""], object)
        strings = runner.SignatureRunner(session, {"words": inputs["words"]},
                                         {"length": outputs["length"]})
        strings.direct = direct and strings.direct
        np.testing.assert_array_equal(strings({"words": words})["length"], [1, 4, 0])


def test_refusals_are_session_runs(model):
    session, inputs, outputs = model
    ids, dense = _feeds()
    run = runner.SignatureRunner(session, {"ids": inputs["ids"]}, {"top": outputs["top"]})
    with pytest.raises(ValueError, match=r"shape \(5, 2\) for input 'ids', which has shape "
                                         r"\[None, 3\]"):
        run({"ids": ids[:, :2]})
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids must be >= 0"):
        run({"ids": -ids - 1})
    slow = runner.SignatureRunner(session, {"ids": inputs["ids"]}, {"i": outputs["slow"]})
    with pytest.raises(tf.errors.DeadlineExceededError):
        slow({"ids": ids}, timeout=0.05)
    session.close()
    with pytest.raises(RuntimeError, match="closed Session"):
        run({"ids": ids})

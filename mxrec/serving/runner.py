"""One signature's run, with `session.run`'s per-call Python work done once.

`Session.run` rebuilds its fetch and feed structures on every call (a fetch mapper, a
graph lookup and a shape check per feed): about 0.14 ms of a 0.2 ms run of a small
ranking model, more than the model's own kernels. A `SignatureRunner` resolves the
signature's tensors once and each call goes straight to the C call `Session.run` ends in
(`BaseSession._call_tf_sessionrun`, with `pywrap_tf_session`'s buffers for the run
options), after the checks `Session.run` makes: each feed converted to its tensor's dtype
and its shape checked against the tensor's. Errors are the same `tf.errors.OpError`
classes, without the Python trace of where the graph was built.

These are TensorFlow's own private names, the same in TensorFlow 2.15 through 2.21;
where a TensorFlow lacks them, `available()` is False and the runner calls `session.run`.

Example:
    >>> run = SignatureRunner(session, inputs, outputs)  # {name: tf.Tensor} each
    >>> run({"ids": np.zeros([4, 3], np.int64)}, timeout=0.5)   # {name: array}
"""

from typing import Dict, Optional

import numpy as np
import tensorflow as tf

try:
    from tensorflow.python.client import pywrap_tf_session as _tf_session
except ImportError:  # pragma: no cover (another TensorFlow layout: session.run is used)
    _tf_session = None


# A longer timeout runs without one: TensorFlow turns the milliseconds into an int64
# point in time, which a value near the field's int64 limit overflows (an instant
# DeadlineExceeded).
_MAX_TIMEOUT_S = 30 * 86400.0


def available(session: tf.compat.v1.Session) -> bool:
    """Whether this TensorFlow has the session call `SignatureRunner` makes directly."""
    return (_tf_session is not None and hasattr(_tf_session, "TF_NewBufferFromString")
            and hasattr(_tf_session, "TF_DeleteBuffer")
            and callable(getattr(session, "_call_tf_sessionrun", None))
            and callable(getattr(session, "_extend_graph", None))
            and isinstance(getattr(session, "_closed", None), bool))


class SignatureRunner:
    """Runs fixed fetches for fixed feeds of one session.

    Args:
        session: the session (its graph finalized: the tensors are resolved once).
        inputs: {name: placeholder tensor}.
        outputs: {name: tensor} to fetch.
    """

    def __init__(self, session: tf.compat.v1.Session, inputs: Dict[str, tf.Tensor],
                 outputs: Dict[str, tf.Tensor]):
        self.session = session
        self.outputs = outputs
        self.direct = available(session)
        self._names = list(outputs)
        self._dtypes = {k: object if t.dtype == tf.string else t.dtype.as_numpy_dtype
                        for k, t in inputs.items()}
        self._shapes = {k: None if t.shape.rank is None else tuple(t.shape.as_list())
                        for k, t in inputs.items()}
        self._inputs = inputs
        if self.direct:
            # pylint: disable=protected-access (see the module docstring)
            session._extend_graph()  # the C session holds every node the signature needs
            self._feeds = {k: t._as_tf_output() for k, t in inputs.items()}
            self._fetches = [outputs[k]._as_tf_output() for k in self._names]

    def __call__(self, feeds: Dict[str, np.ndarray],
                 timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """The outputs for `feeds` (exactly the runner's inputs), cancelled with
        tf.errors.DeadlineExceededError after `timeout` seconds (None, or over 30 days: no
        limit).

        Raises:
            ValueError: a feed whose shape does not fit its tensor's.
            tf.errors.OpError: the run failed.
        """
        arrays = {}
        for key, value in feeds.items():
            array = np.asarray(value, self._dtypes[key])
            shape = self._shapes[key]
            if shape is not None and (len(shape) != array.ndim or any(
                    d is not None and d != n for d, n in zip(shape, array.shape))):
                raise ValueError(f"Cannot feed value of shape {array.shape} for input "
                                 f"{key!r}, which has shape {list(shape)}")
            arrays[key] = array
        options = None
        if timeout is not None and timeout <= _MAX_TIMEOUT_S:
            # 0 would mean "no limit" to TensorFlow: a spent deadline still gets 1 ms.
            options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(timeout * 1000)))
        if not self.direct:
            return self.session.run(self.outputs, {self._inputs[k]: v for k, v in
                                                   arrays.items()}, options=options)
        # pylint: disable=protected-access (see the module docstring)
        if self.session._closed:  # the C call would be handed a released session
            raise RuntimeError("Attempted to use a closed Session.")
        buffer = None
        if options is not None:
            buffer = _tf_session.TF_NewBufferFromString(options.SerializeToString())
        try:
            values = self.session._call_tf_sessionrun(
                buffer, {self._feeds[k]: v for k, v in arrays.items()}, self._fetches, [],
                None)
        finally:
            if buffer is not None:
                _tf_session.TF_DeleteBuffer(buffer)
        return dict(zip(self._names, values))


__all__ = ["SignatureRunner", "available"]

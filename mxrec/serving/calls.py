"""What a request means, whatever its transport: the REST server (`server`) and the gRPC
server (`grpc_server`) both answer through these, so a model, a version, a signature and a
refusal are read the same way on both.

Each refusal is a `RequestError` with the HTTP status TF Serving's REST API gives; the gRPC
server maps it to the status code TF Serving's gRPC API gives (`GRPC_CODES`).

Example:
    >>> with calls.serving(predictor, "ctr", "ctr", version=None) as instance:
    ...     name, specs = requests.signature_specs(instance.input_specs, "", "serving_default")
    ...     outputs = calls.run(instance, feeds, name, deadline, "--rest-api-timeout-in-ms")
"""

import re
import time
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from mxrec.serving.predictor import NoVersionError, Predictor
from mxrec.serving.requests import RequestError

_NODE_LINE = re.compile(r"^Node: '[^'\n]*'\n", re.MULTILINE)

# TF Serving's gRPC status code for each HTTP status its REST API answers with.
GRPC_CODES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED",
              411: "INVALID_ARGUMENT", 413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED",
              500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def check_model(model_name: str, served_name: str) -> None:
    """Refuses a request for a model this server does not serve (TF Serving's words)."""
    if model_name != served_name:
        raise RequestError(f"Servable not found for request: Latest({model_name}); this "
                           f"server serves model {served_name!r}", 404)


def serving(predictor: Predictor, model_name: str, served_name: str,
            version: Optional[int] = None, label: str = "") -> "_Serving":
    """The serving instance, held for one request (a context manager), if it is the version
    asked for.

    Args:
        predictor: the predictor answering.
        model_name: the model the request names.
        served_name: the model this server serves.
        version: the version the request names (None: whichever serves).
        label: a version label (TF Serving's `version_label`); this server has no labels
            configured, so any label is refused as TF Serving refuses an unknown one.

    Raises:
        RequestError: 404 for another model or a version that is not serving, 400 for a
            label, 503 while no version is loaded.
    """
    check_model(model_name, served_name)
    if label:
        raise RequestError(f"Unrecognized servable version label: {label} (this server has "
                           "no version labels; name a version or none)", 400)
    return _Serving(predictor, model_name, version)


class _Serving:
    """`serving`'s hold (a class, not a generator: it is taken on every request)."""

    __slots__ = ("held", "model_name", "version")

    def __init__(self, predictor: Predictor, model_name: str, version: Optional[int]):
        self.held = predictor.serving()
        self.model_name = model_name
        self.version = version

    def __enter__(self):
        try:
            instance = self.held.__enter__()
        except NoVersionError as error:
            raise RequestError(str(error), 503) from None
        if self.version is not None and self.version != instance.version:
            self.held.__exit__(None, None, None)
            raise RequestError(f"Servable not found for request: Specific({self.model_name}, "
                               f"{self.version}): version {self.version} is not serving "
                               f"(version {instance.version} is)", 404)
        return instance

    def __exit__(self, *exc):
        return self.held.__exit__(*exc)


def run(instance, feeds: Dict, signature: str, deadline: Optional[float], flag: str,
        outputs: Optional[Sequence[str]] = None) -> Dict:
    """The model's outputs for checked feeds, within `deadline` (time.monotonic(); None: no
    limit). Errors the graph raises for the request's values are 400s (TF Serving's
    mapping), a run past the deadline a 504 (cancelled at the deadline, or, run in the
    caller's thread, answered so when it ends), memory exhausted a 429; `flag` names the
    setting that sets the deadline, for the message.
    """
    timeout = None
    if deadline is not None:
        timeout = deadline - time.monotonic()
        if timeout <= 0:  # spent waiting for a thread: not computed at all
            raise RequestError(f"the request's deadline passed before the model ran "
                               f"({flag})", 504)
    try:
        if outputs:
            answer = instance.predict(feeds, signature, timeout=timeout, outputs=outputs)
        else:
            answer = instance.predict(feeds, signature, timeout=timeout)
        # A run in the caller's thread (--tensorflow_inter_op_parallelism -1) is not cut
        # at its timeout: one that ended past the deadline is late all the same.
        if deadline is not None and time.monotonic() > deadline:
            raise RequestError(f"the model did not answer within the request's deadline "
                               f"({flag})", 504)
        return answer
    except (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError) as error:
        raise RequestError(f"the model refused the request's values: {op_words(error)}",
                           400) from None
    except tf.errors.DeadlineExceededError:
        raise RequestError(f"the model did not answer within the request's deadline ({flag})",
                           504) from None
    except tf.errors.ResourceExhaustedError as error:
        raise RequestError(f"the model ran out of memory for this request (send smaller "
                           f"batches): {op_words(error)}", 429) from None


def op_words(error: tf.errors.OpError) -> str:
    """The failing op's own message and node, without the Python trace of where this
    process defined the node (TensorFlow prepends it: nothing for a client)."""
    text = error.message
    node = _NODE_LINE.search(text)
    return (text[node.end():] if node else text).strip()


def model_status(predictor: Predictor, model_name: str, served_name: str,
                 version: Optional[int] = None) -> List[Dict]:
    """TF Serving's model_version_status entries (`Predictor.status`), of `version` alone
    when given.

    Raises:
        RequestError: 404 for another model, a version the predictor does not know, or no
            version AVAILABLE (TF Serving's answer before a version loads; the entries are
            on the error as `.entries`, for the operator).
    """
    if model_name != served_name:
        raise RequestError(f"Could not find any versions of model {model_name}; this server "
                           f"serves model {served_name!r}", 404)
    entries = predictor.status()["model_version_status"]
    if version is not None:
        entries = [e for e in entries if e["version"] == str(version)]
        if not entries:
            raise RequestError(f"Could not find version {version} of model {model_name}", 404)
        return entries
    if not any(e["state"] == "AVAILABLE" for e in entries):
        error = RequestError(f"Could not find any versions of model {model_name}", 404)
        error.entries = entries
        raise error
    return entries


__all__ = ["GRPC_CODES", "check_model", "serving", "run", "op_words", "model_status"]

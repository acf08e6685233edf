"""A small client of TF Serving's gRPC Predict, on TF Serving's own stubs: what
`python -m mxrec.streaming replay --grpc` and bench/bench_serving.py call. Works against
mxrec's predictor and TensorFlow Serving alike.

Example:
    >>> client = PredictClient("127.0.0.1:8500", "ctr")
    >>> outputs, version = client.predict({"sparse": ids, "dense": dense}, timeout=5)
    >>> outputs["prob"]                   # float32 [B, 1]
    >>> client.close()
"""

from typing import Dict, Mapping, Optional, Tuple

import grpc
import numpy as np
import tensorflow as tf

from mxrec.serving.grpc_server import MAX_MESSAGE, predict_pb2, prediction_service_pb2_grpc
from mxrec.serving.tensors import to_proto


def parse_target(target: str) -> str:
    """HOST:PORT (IPv6 as [ADDR]:PORT), checked.

    Raises:
        ValueError: not HOST:PORT with a port 1-65535.
    """
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:8500), got {target!r}")
    return target


class PredictClient:
    """One channel to a predictor's gRPC API and its Predict calls.

    Args:
        target: HOST:PORT.
        model_name: the model the requests name.
        signature: the signature ("": the server's default).
        max_message: the largest message either way (the server's limit applies too).
    """

    def __init__(self, target: str, model_name: str, signature: str = "",
                 max_message: int = MAX_MESSAGE):
        self.model_name = model_name
        self.signature = signature
        self.channel = grpc.insecure_channel(
            parse_target(target), options=[("grpc.max_receive_message_length", max_message),
                                           ("grpc.max_send_message_length", max_message)])
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def request(self, inputs: Mapping[str, np.ndarray],
                version: Optional[int] = None) -> predict_pb2.PredictRequest:
        """The PredictRequest of `inputs` (numbers as raw bytes, strings as bytes)."""
        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.model_name
        request.model_spec.signature_name = self.signature
        if version is not None:
            request.model_spec.version.value = version
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(to_proto(value))
        return request

    def predict(self, inputs: Mapping[str, np.ndarray], timeout: Optional[float] = None,
                version: Optional[int] = None) -> Tuple[Dict[str, np.ndarray], int]:
        """(outputs, the version that answered).

        Raises:
            grpc.RpcError: the server refused the call (its code and message) or could not be
                reached.
        """
        answer = self.stub.Predict(self.request(inputs, version), timeout=timeout)
        return ({k: tf.make_ndarray(v) for k, v in answer.outputs.items()},
                answer.model_spec.version.value)

    def close(self) -> None:
        self.channel.close()


__all__ = ["PredictClient", "parse_target"]

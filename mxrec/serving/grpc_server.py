"""TensorFlow Serving's gRPC API over a Predictor, with TF Serving's own messages.

    tensorflow.serving.PredictionService/Predict            PredictRequest -> PredictResponse
    tensorflow.serving.PredictionService/GetModelMetadata   the "signature_def" field: a
                                                            SignatureDefMap in an Any
    tensorflow.serving.ModelService/GetModelStatus          ModelVersionStatus per version

The messages and service stubs are TF Serving's published ones (the `tensorflow-serving-api`
wheel, Apache 2.0, installed without its TensorFlow pin by scripts/setup.sh), so TF
Serving's clients in any language call this server unchanged. Classify, Regress,
MultiInference and HandleReloadConfigRequest answer UNIMPLEMENTED.

A request means what it means over REST (`mxrec.serving.calls`, `mxrec.serving.requests`):
`model_spec.name` must be the served model (else NOT_FOUND), `model_spec.version` if set
must be the serving version (else NOT_FOUND), a `version_label` is refused
(INVALID_ARGUMENT: no labels are configured), an empty `signature_name` is the default
signature; the inputs must be exactly the signature's, each of its dtype and shape, one
batch size, finite floats (else INVALID_ARGUMENT naming the input); `output_filter` picks
outputs. Each request is answered by one version, named in the response's `model_spec`.
Before any version loads, Predict and GetModelMetadata answer UNAVAILABLE.

Limits: `num_threads` handler threads (a fixed pool); at most `num_threads + max_queued`
calls in the server at once, one more answered RESOURCE_EXHAUSTED at once; messages up to
`max_message` bytes either way (a larger one: RESOURCE_EXHAUSTED from the gRPC runtime);
the client's deadline bounds the model run, and a call whose deadline passed while it
waited for a thread is answered DEADLINE_EXCEEDED without running the model.

Example:
    >>> server = GrpcServer(predictor, "ctr", port=8500).start()
    >>> # a client: prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(...)
    >>> server.stop()
"""

import threading
import time
from concurrent import futures
from typing import Optional

import grpc
from absl import logging

from mxrec.serving import calls, requests, tensors
from mxrec.serving.predictor import Predictor
from mxrec.serving.requests import RequestError

try:
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )
except ImportError as error:  # pragma: no cover (scripts/setup.sh installs it)
    raise ImportError(
        "gRPC serving needs TF Serving's Python API, the tensorflow-serving-api wheel of this "
        "TensorFlow's version, installed without its TensorFlow pin: bash scripts/setup.sh, or "
        "pip install --no-deps tensorflow-serving-api==<TensorFlow's version> "
        f"({error})") from error

MAX_MESSAGE = 64 << 20  # as the REST body limit; gRPC's own default is 4 MiB
# gRPC's message limits are C ints.
MAX_MESSAGE_LIMIT = (1 << 31) - 1
# Time left beyond this (about 31 years) is a call without a deadline.
NO_DEADLINE = 1e9
STOP_GRACE = 10.0  # seconds the calls being answered get to finish at stop()
_SIGNATURE_DEF = "signature_def"


class PortInUseError(OSError):
    """The gRPC port is taken (or cannot be bound)."""


def _default_threads() -> int:
    from mxrec.serving.server import default_threads

    return default_threads()


class GrpcServer:
    """TF Serving's gRPC API on a port.

    Args:
        predictor: the Predictor to serve (shared with a REST ModelServer if there is one).
        model_name: the model name requests must name.
        port: TCP port (0: any free one; see `.port`).
        host: the address to listen on (127.0.0.1; 0.0.0.0: every interface).
        max_message: the largest message in bytes, received or sent.
        num_threads: handler threads (None: 4 per usable core, as REST).
        max_queued: calls that may wait for a thread (None: num_threads); one more is
            answered RESOURCE_EXHAUSTED.
        poll_interval: seconds between polls of the export base in a thread of this
            server's (None: none; a REST ModelServer beside it polls).

    Raises:
        ValueError: a setting out of range (named).
        PortInUseError: the port is taken or the address cannot be bound.
    """

    def __init__(self, predictor: Predictor, model_name: str, port: int = 8500,
                 host: str = "127.0.0.1", max_message: int = MAX_MESSAGE,
                 num_threads: Optional[int] = None, max_queued: Optional[int] = None,
                 poll_interval: Optional[float] = None):
        num_threads = _default_threads() if num_threads is None else num_threads
        max_queued = num_threads if max_queued is None else max_queued
        requests.check_integers(
            ("max_message", max_message, 1, MAX_MESSAGE_LIMIT),
            ("num_threads", num_threads, 1, 1 << 16), ("max_queued", max_queued, 0, 1 << 20),
            ("port", port, 0, 65535))
        if poll_interval is not None and not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds or None, got {poll_interval}")
        self.predictor = predictor
        self.model_name = model_name
        self.max_message = max_message
        self.num_threads = num_threads
        self.max_queued = max_queued
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self._poller: Optional[threading.Thread] = None
        self._pool = futures.ThreadPoolExecutor(max_workers=num_threads,
                                                thread_name_prefix="mxrec-grpc")
        self._server = grpc.server(
            self._pool, maximum_concurrent_rpcs=num_threads + max_queued,
            # No SO_REUSEPORT: a port another server holds is an error, not shared.
            options=[("grpc.max_receive_message_length", max_message),
                     ("grpc.max_send_message_length", max_message),
                     ("grpc.so_reuseport", 0)])
        services = _Services(self)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(services, self._server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(self),
                                                                  self._server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as error:  # grpcio >= 1.50 raises; older ones return 0
            self.port = 0
            why = str(error)
        else:
            why = ""
        if not self.port:
            self._pool.shutdown(wait=False)
            raise PortInUseError(f"cannot listen for gRPC on {address} (in use by another "
                                 f"server?); stop it or pass another --grpc-port {why}".strip())

    def start(self) -> "GrpcServer":
        self._server.start()
        if self.poll_interval is not None:
            self._poller = threading.Thread(
                target=self.predictor.follow, args=(self.poll_interval, self._stop), daemon=True)
            self._poller.start()
        return self

    def close(self) -> None:
        """Releases the port of a server that was never started."""
        self._server.stop(None)
        self._pool.shutdown(wait=False)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stops accepting calls, lets those being answered finish (up to `grace` seconds)
        and stops the poll thread; the predictor stays open (its owner closes it)."""
        self._stop.set()
        self._server.stop(grace).wait()
        self._pool.shutdown(wait=True)
        if self._poller is not None:
            self._poller.join()

    # ---------------------------------------------------------------- calls

    def answer(self, context, method, request):
        """Calls `method(request, deadline)`; a RequestError ends the call with TF Serving's
        status code for it, any other failure with INTERNAL (logged)."""
        remaining = context.time_remaining()
        # A call without a deadline reports gRPC's infinite future (about 9e18 s).
        deadline = (None if remaining is None or remaining > NO_DEADLINE
                    else time.monotonic() + remaining)
        try:
            return method(request, deadline)
        except RequestError as error:
            code = grpc.StatusCode[calls.GRPC_CODES.get(error.status, "INTERNAL")]
            context.abort(code, str(error))
        except Exception as error:  # noqa: BLE001 (answered as INTERNAL, logged)
            logging.exception("serving: internal error in a gRPC call")
            context.abort(grpc.StatusCode.INTERNAL,
                          f"internal error: {type(error).__name__}: {error}")

    def predict(self, request, deadline: Optional[float]):
        if deadline is not None and deadline <= time.monotonic():
            raise RequestError("the call's deadline passed before it was answered", 504)
        spec = request.model_spec
        # Converted before a version is held: a large request does not delay a switch.
        feeds = {key: tensors.to_array(key, proto, self.max_message)
                 for key, proto in request.inputs.items()}
        version = spec.version.value if spec.HasField("version") else None
        with calls.serving(self.predictor, spec.name, self.model_name, version,
                           spec.version_label) as instance:
            name, specs = requests.signature_specs(instance.input_specs, spec.signature_name,
                                                   instance.default_signature)
            requests.check_arrays(feeds, specs, "the request's inputs")
            outputs = calls.run(instance, feeds, name, deadline, "the client's deadline",
                                list(request.output_filter))
            response = predict_pb2.PredictResponse()
            self._spec(response.model_spec, instance.version, name)
        for key, value in outputs.items():
            tensors.fill(response.outputs[key], value)
        return response

    def metadata(self, request, deadline: Optional[float]):
        fields = list(request.metadata_field)
        if not fields:
            raise RequestError("GetModelMetadataRequest must specify at least one "
                               f"metadata_field ({_SIGNATURE_DEF!r})")
        for field in fields:
            if field != _SIGNATURE_DEF:
                raise RequestError(f"Metadata field {field} is not supported (only "
                                   f"{_SIGNATURE_DEF!r})")
        spec = request.model_spec
        version = spec.version.value if spec.HasField("version") else None
        with calls.serving(self.predictor, spec.name, self.model_name, version,
                           spec.version_label) as instance:
            signatures = get_model_metadata_pb2.SignatureDefMap()
            for name, signature in instance.signature_defs.items():
                signatures.signature_def[name].CopyFrom(signature)
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            self._spec(response.model_spec, instance.version, "")
        response.metadata[_SIGNATURE_DEF].Pack(signatures)
        return response

    def status(self, request, deadline: Optional[float]):
        spec = request.model_spec
        if spec.version_label:
            raise RequestError(f"Unrecognized servable version label: {spec.version_label} "
                               "(this server has no version labels)")
        version = spec.version.value if spec.HasField("version") else None
        entries = calls.model_status(self.predictor, spec.name, self.model_name, version)
        response = get_model_status_pb2.GetModelStatusResponse()
        for entry in entries:
            status = response.model_version_status.add()
            status.version = int(entry["version"])
            status.state = get_model_status_pb2.ModelVersionStatus.State.Value(entry["state"])
            # TensorFlow's error codes are gRPC's, number for number.
            status.status.error_code = grpc.StatusCode[entry["status"]["error_code"]].value[0]
            status.status.error_message = entry["status"]["error_message"]
        return response

    def _spec(self, spec, version: int, signature: str) -> None:
        spec.name = self.model_name
        spec.version.value = version
        spec.signature_name = signature


class _Services(prediction_service_pb2_grpc.PredictionServiceServicer):
    """PredictionService's Predict and GetModelMetadata (the rest: UNIMPLEMENTED)."""

    def __init__(self, server: GrpcServer):
        self.server = server

    def Predict(self, request, context):  # noqa: N802 (TF Serving's method names)
        return self.server.answer(context, self.server.predict, request)

    def GetModelMetadata(self, request, context):  # noqa: N802
        return self.server.answer(context, self.server.metadata, request)


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """ModelService's GetModelStatus (HandleReloadConfigRequest: UNIMPLEMENTED; versions
    come from the export base)."""

    def __init__(self, server: GrpcServer):
        self.server = server

    def GetModelStatus(self, request, context):  # noqa: N802
        return self.server.answer(context, self.server.status, request)


__all__ = ["GrpcServer", "PortInUseError", "MAX_MESSAGE"]

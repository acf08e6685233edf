"""TensorFlow Serving's REST API over a Predictor, on Python's ThreadingHTTPServer.

    GET  /v1/models/NAME                       model status (the serving version AVAILABLE)
    GET  /v1/models/NAME/metadata              TF Serving's signature-def map: every
                                               signature's inputs and outputs with
                                               dtype, shape and tensor name
    POST /v1/models/NAME:predict               {"instances": [{input: value}, ...]} (row
                                               format) -> {"predictions": [...]}, or
                                               {"inputs": {input: [...]}} (columnar) ->
                                               {"outputs": {...}}
    POST /v1/models/NAME/versions/V:predict    the same, refused unless V is serving

A body may name "signature_name" (default: the predictor's default signature). Inputs
are parsed against that signature (`mxrec.serving.requests`: exact int64, finite
floats, shapes and batch sizes checked). Every refusal is a 4xx JSON {"error": "..."}
naming the input, the instance and what was expected (413 for a body over `max_body`,
read to its end first so the client gets the answer); any other failure a 500 JSON.
Each answer carries the header X-Model-Version: the one version that answered it.
A background thread polls the export base every `poll_interval` seconds.
"""

import errno
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from absl import logging

from mxrec.serving import requests
from mxrec.serving.predictor import NoVersionError, Predictor
from mxrec.serving.requests import RequestError

_PREDICT = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?:predict$")
_STATUS = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?(/metadata)?$")
MAX_BODY = 64 << 20
# A body over the limit is read and dropped up to this size, so that the client, which
# sends all of it before reading the answer, gets the 413 and not a broken pipe.
MAX_DRAIN = 1 << 30
SOCKET_TIMEOUT = 60.0


class _Handler(BaseHTTPRequestHandler):
    server_version = "mxrec-serving"
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT  # a client that stops sending does not hold a thread forever

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's name)
        logging.debug("http: " + format, *args)

    def _reply(self, code: int, body: dict, version: Optional[int] = None,
               close: bool = False):
        data = json.dumps(body, allow_nan=False).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if version is not None:
            self.send_header("X-Model-Version", str(version))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _error(self, code: int, message: str, close: bool = False):
        self._reply(code, {"error": message}, close=close)

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (a malformed request line, headers too long, an
        unsupported method) as JSON too."""
        text = message or explain or self.responses.get(code, ("error",))[0]
        if self.command == "HEAD" or code < 200 or code in (204, 304):
            self.send_response(code, message)
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            return
        self._error(code, str(text), close=True)

    def _not_allowed(self):
        self.send_response(405)
        data = json.dumps({"error": f"method {self.command} is not allowed on {self.path}; "
                                    "use GET (status, metadata) or POST (predict)"}).encode()
        self.send_header("Allow", "GET, POST")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815 (http.server's names)

    def _guarded(self, handler):
        """Every failure is answered: a RequestError with its 4xx, anything else a 500."""
        try:
            handler()
        except RequestError as error:
            self._error(error.status, str(error), close=getattr(error, "close", False))
        except (socket.timeout, TimeoutError):
            self._error(408, f"the request was not received within {self.timeout:g} s",
                        close=True)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as error:  # noqa: BLE001 (answered as a 500, logged)
            logging.exception("serving: internal error on %s %s", self.command, self.path)
            self._error(500, f"internal error: {type(error).__name__}: {error}", close=True)

    # ------------------------------------------------------------------ body

    def _length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            raise _closing(RequestError("send the body with a Content-Length (chunked "
                                        "transfer encoding is not supported)", 411))
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise _closing(RequestError("a Content-Length header is needed", 411))
        if not (raw.strip().isascii() and raw.strip().isdigit()):
            raise _closing(RequestError(f"invalid Content-Length {raw[:40]!r}: not a number "
                                        "of bytes"))
        return int(raw)

    def _too_large(self, length: int) -> RequestError:
        return RequestError(f"the body has {length} bytes, more than this server's limit of "
                            f"{self.server.max_body} (python -m mxrec.serving "
                            "--max-body-bytes)", 413)

    def handle_expect_100(self):
        """Refuses an oversized body before the client sends it (Expect: 100-continue)."""
        if self.command == "POST":
            try:
                length = self._length()
            except RequestError:
                length = None  # answered once the request is handled
            if length is not None and length > self.server.max_body:
                self._error(413, str(self._too_large(length)), close=True)
                return False
        return super().handle_expect_100()

    def _body(self) -> bytes:
        length = self._length()
        if length > self.server.max_body:
            error = self._too_large(length)
            if length <= MAX_DRAIN:
                left = length
                while left:
                    chunk = self.rfile.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    left -= len(chunk)
            raise _closing(error)
        if length == 0:
            raise RequestError("the body is empty; a predict request is a JSON object")
        data = self.rfile.read(length)
        if len(data) < length:
            raise _closing(RequestError(f"the body ended after {len(data)} of its {length} "
                                        "bytes (Content-Length)"))
        return data

    # --------------------------------------------------------------- answers

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._guarded(self._get)

    def do_POST(self):  # noqa: N802
        self._guarded(self._post)

    def _get(self):
        match = _STATUS.match(self.path)
        if not match or match.group(1) != self.server.model_name:
            raise RequestError(f"no model at {self.path}; this server has "
                               f"/v1/models/{self.server.model_name}", 404)
        predictor = self.server.predictor
        if not match.group(3):
            return self._reply(200, predictor.status())
        try:
            with predictor.serving() as instance:
                if match.group(2) is not None and int(match.group(2)) != instance.version:
                    raise RequestError(f"version {match.group(2)} is not serving (version "
                                       f"{instance.version} is)", 404)
                meta = instance.metadata()
                body = {"model_spec": {"name": self.server.model_name, "signature_name": "",
                                       "version": str(instance.version)},
                        "metadata": {"signature_def": meta,
                                     # mxrec's earlier form, kept for its clients
                                     "inputs": sorted(instance.inputs),
                                     "outputs": sorted(instance.outputs)}}
                version = instance.version
        except NoVersionError as error:
            raise RequestError(str(error), 503) from None
        return self._reply(200, body, version)

    def _post(self):
        match = _PREDICT.match(self.path)
        if not match or match.group(1) != self.server.model_name:
            error = RequestError(f"no predict endpoint at {self.path}; use "
                                 f"/v1/models/{self.server.model_name}:predict", 404)
            self._body()  # read, so that the connection stays usable
            raise error
        body = requests.parse_json(self._body())
        wanted = match.group(2)
        try:
            with self.server.predictor.serving() as instance:
                if wanted is not None and int(wanted) != instance.version:
                    raise RequestError(f"version {wanted} is not serving (version "
                                       f"{instance.version} is)", 404)
                name, feeds, row_format = requests.to_feeds(
                    body, instance.input_specs, instance.default_signature)
                outputs = instance.predict(feeds, name)
                version = instance.version
        except NoVersionError as error:
            raise RequestError(str(error), 503) from None
        return self._reply(200, requests.outputs_to_json(outputs, row_format), version)


def _closing(error: RequestError) -> RequestError:
    """Marks an error after which the connection cannot be reused (body not read)."""
    error.close = True
    return error


class ModelServer:
    """HTTP server + version poller.

    Args:
        predictor: the Predictor to serve.
        model_name: NAME in /v1/models/NAME.
        port: TCP port (0: any free one; see `.port`).
        poll_interval: seconds between polls of the export base; None: no poll thread (the
            caller calls `predictor.poll()`).
        host: the address to listen on: 127.0.0.1 (this machine only), 0.0.0.0 (every
            interface, as TF Serving; a container's port mapping needs it).
        max_body: the largest request body in bytes; a larger one is answered 413.

    Raises:
        PortInUseError: the port is taken.
        OSError: the address cannot be bound otherwise (errno and address in the message).
    """

    def __init__(self, predictor: Predictor, model_name: str, port: int = 8501,
                 poll_interval: Optional[float] = 2.0, host: str = "127.0.0.1",
                 max_body: int = MAX_BODY):
        if max_body < 1:
            raise ValueError(f"max_body must be >= 1 byte, got {max_body}")
        if poll_interval is not None and poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds or None, got {poll_interval}")
        self.predictor = predictor
        self.poll_interval = poll_interval
        self.host = host
        try:
            self.httpd = ThreadingHTTPServer((host, port), _Handler)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUseError(f"port {port} on {host} is in use (another server "
                                     "there?); stop it or pass another --port") from None
            raise OSError(error.errno, f"cannot listen on {host}:{port}: "
                                       f"{error.strerror or error}") from None
        self.httpd.daemon_threads = True
        self.httpd.predictor = predictor
        self.httpd.model_name = model_name
        self.httpd.max_body = max_body
        self.port = self.httpd.server_address[1]
        self._stop = threading.Event()
        self._threads = []

    def _poll_loop(self):
        while not self._stop.is_set():
            try:
                self.predictor.poll()
            except Exception as error:  # noqa: BLE001 (a bad poll must not end serving)
                logging.error("predictor: poll failed: %s", error)
            self._stop.wait(self.poll_interval)

    def start(self):
        targets = [self.httpd.serve_forever]
        if self.poll_interval is not None:
            targets.append(self._poll_loop)
        for target in targets:
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self):
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self.predictor.close()


class PortInUseError(OSError):
    """The server's port is taken."""


__all__ = ["ModelServer", "PortInUseError", "MAX_BODY"]

"""TensorFlow Serving's REST API over a Predictor, on Python's ThreadingHTTPServer.

    GET  /v1/models/NAME                       model status (the serving version AVAILABLE)
    GET  /v1/models/NAME/metadata              signature inputs and outputs
    POST /v1/models/NAME:predict               {"instances": [{input: value}, ...]} (row
                                               format) -> {"predictions": [...]}, or
                                               {"inputs": {input: [...]}} (columnar) ->
                                               {"outputs": {...}}
    POST /v1/models/NAME/versions/V:predict    the same, refused unless V is serving

Each answer carries the header X-Model-Version: the one version that answered it.
A background thread polls the export base every `poll_interval` seconds.
"""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

import numpy as np
from absl import logging

from mxrec.serving.predictor import Predictor

_PREDICT = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?:predict$")
_STATUS = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?(/metadata)?$")
MAX_BODY = 64 << 20


def _rows_to_columns(instances):
    if not isinstance(instances, list) or not instances:
        raise ValueError("'instances' must be a non-empty list")
    if all(isinstance(i, dict) for i in instances):
        keys = set(instances[0])
        if any(set(i) != keys for i in instances):
            raise ValueError("every instance must have the same inputs")
        return {k: [i[k] for i in instances] for k in keys}
    raise ValueError("instances must be objects {input: value} (the model has named inputs)")


def _jsonable(outputs):
    return {k: np.asarray(v).tolist() for k, v in outputs.items()}


class _Handler(BaseHTTPRequestHandler):
    server_version = "mxrec-serving"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's name)
        logging.debug("http: " + format, *args)

    def _reply(self, code: int, body: dict, version: Optional[int] = None):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if version is not None:
            self.send_header("X-Model-Version", str(version))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str):
        self._reply(code, {"error": message})

    def do_GET(self):  # noqa: N802 (http.server's name)
        match = _STATUS.match(self.path)
        if not match or match.group(1) != self.server.model_name:
            return self._error(404, f"no model at {self.path}; this server has "
                                    f"/v1/models/{self.server.model_name}")
        predictor = self.server.predictor
        if match.group(3):
            instance = predictor._current
            if instance is None:
                return self._error(503, "no model version is loaded")
            return self._reply(200, {"model_spec": {"name": self.server.model_name,
                                                    "version": str(instance.version)},
                                     "metadata": {"inputs": sorted(instance.inputs),
                                                  "outputs": sorted(instance.outputs)}})
        return self._reply(200, predictor.status())

    def do_POST(self):  # noqa: N802
        match = _PREDICT.match(self.path)
        if not match or match.group(1) != self.server.model_name:
            return self._error(404, f"no predict endpoint at {self.path}; use "
                                    f"/v1/models/{self.server.model_name}:predict")
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            return self._error(400, f"a JSON body of 1 to {MAX_BODY} bytes is needed")
        try:
            body = json.loads(self.rfile.read(length))
            if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
                raise ValueError("the body must have exactly one of 'instances' or 'inputs'")
            row_format = "instances" in body
            inputs = _rows_to_columns(body["instances"]) if row_format else body["inputs"]
            if not isinstance(inputs, dict):
                raise ValueError("'inputs' must be an object {input: values}")
            wanted = match.group(2)
            outputs, version = self.server.predictor.predict(
                {k: np.asarray(v) for k, v in inputs.items()})
        except LookupError as error:
            return self._error(503, str(error))
        except (ValueError, TypeError, OverflowError) as error:
            return self._error(400, str(error))
        if wanted is not None and int(wanted) != version:
            return self._error(404, f"version {wanted} is not serving (version {version} is)")
        if row_format:
            names = sorted(outputs)
            count = len(next(iter(outputs.values())))
            if len(names) == 1:
                predictions = np.asarray(outputs[names[0]]).tolist()
            else:
                predictions = [{k: np.asarray(outputs[k][i]).tolist() for k in names}
                               for i in range(count)]
            return self._reply(200, {"predictions": predictions}, version)
        return self._reply(200, {"outputs": _jsonable(outputs)}, version)


class ModelServer:
    """HTTP server + version poller. Binds 127.0.0.1 only.

    Args:
        predictor: the Predictor to serve.
        model_name: NAME in /v1/models/NAME.
        port: TCP port (0: any free one; see `.port`).
        poll_interval: seconds between polls of the export base.
    """

    def __init__(self, predictor: Predictor, model_name: str, port: int = 8501,
                 poll_interval: float = 2.0):
        self.predictor = predictor
        self.poll_interval = poll_interval
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.predictor = predictor
        self.httpd.model_name = model_name
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
        for target in (self.httpd.serve_forever, self._poll_loop):
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


__all__ = ["ModelServer"]

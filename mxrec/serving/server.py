"""TensorFlow Serving's REST API over a Predictor, on a fixed pool of handler threads.

    GET  /v1/models/NAME                       model status: the serving version AVAILABLE,
                                               one being loaded LOADING, refused ones END;
                                               404 "Could not find any versions of model
                                               NAME" while none is AVAILABLE (TF Serving's
                                               answer before a version loads), so that a
                                               readiness probe fails until one serves
    GET  /v1/models/NAME/versions/V            the same for version V alone (404 if unknown)
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
read to its end first so the client gets the answer); an error the graph raises for
the request's values (InvalidArgument, OutOfRange) is a 400 with its message, as TF
Serving answers; a run past the request's deadline a 504; any other failure a 500 JSON.
Each answer carries the header X-Model-Version: the one version that answered it.

Connections (TF Serving's `--rest_api_num_threads` and `--rest_api_timeout_in_ms`):
one thread accepts connections and watches the idle ones; `num_threads` handler
threads answer requests. A connection goes to a handler only once bytes of a request
have arrived, and goes back to the watcher between keep-alive requests (after at most
NEXT_REQUEST_WAIT for the next one, while no other request waits), so idle connections
hold no thread. Each request has `timeout` seconds from its first byte to
its answer: reading its headers and body, waiting for a handler, and running the model
(the session run is cancelled at the deadline). A client that trickles its request
gets a 408 (or is dropped mid-headers) at the deadline. At most `max_queued` requests
wait for a handler; one more, or a connection beyond MAX_CONNECTIONS, is answered 503
at once. A background thread polls the export base every `poll_interval` seconds.
"""

import collections
import errno
import io
import json
import os
import queue
import re
import select
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Optional

from absl import logging

from mxrec.serving import calls, requests
from mxrec.serving.predictor import Predictor
from mxrec.serving.requests import RequestError

_PREDICT = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?:predict$")
_STATUS = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?(/metadata)?$")
MAX_BODY = 64 << 20
# A body over the limit is read and dropped up to this size, so that the client, which
# sends all of it before reading the answer, gets the 413 and not a broken pipe.
MAX_DRAIN = 1 << 30
DEFAULT_TIMEOUT = 30.0  # TF Serving's --rest_api_timeout_in_ms default
# Open connections (idle, waiting, being answered) beyond which a new one gets a 503.
MAX_CONNECTIONS = 1024
# After an answer that closes the connection, what the client still sends is read and
# dropped this long, so that closing with unread bytes (a TCP reset) cannot destroy the
# answer before the client reads it.
LINGER = 2.0
# An answer may take this long past the deadline to go out (a 408 is sent after it).
WRITE_GRACE = 1.0
# A handler thread with no other request waiting for it waits this long for the
# connection's next request before handing the connection back to the watcher: a client
# sending back to back keeps its thread, without the two thread switches of the way
# through the watcher.
NEXT_REQUEST_WAIT = 0.002


def default_threads() -> int:
    """TF Serving's default --rest_api_num_threads: 4 per usable core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    return 4 * cores


class _DeadlineReader(io.RawIOBase):
    """A connection's reads, each bounded by what is left of the request's deadline (a
    client sending a byte at a time cannot stretch it); in poll mode a read returns what
    has arrived without waiting."""

    def __init__(self, sock: socket.socket, handler: "_Handler"):
        super().__init__()
        self.sock = sock
        self.handler = handler
        self.poll_only = False

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.poll_only:
            self.sock.settimeout(0.0)
            try:
                return self.sock.recv_into(buffer)
            except BlockingIOError:
                return None
        left = self.handler.deadline - time.monotonic()
        if left <= 0:
            self.handler.timed_out = True
            raise socket.timeout("the request's deadline passed")
        self.sock.settimeout(left)
        try:
            return self.sock.recv_into(buffer)
        except socket.timeout:
            self.handler.timed_out = True
            raise


class _Writer:
    """A connection's writes: sent whole, given what is left of the deadline plus a grace
    (so that a refusal still goes out at the deadline), never longer."""

    def __init__(self, sock: socket.socket, handler: "_Handler"):
        self.sock = sock
        self.handler = handler

    def write(self, data) -> int:
        left = max(self.handler.deadline - time.monotonic(), 0.0) + WRITE_GRACE
        self.sock.settimeout(left)
        self.sock.sendall(data)
        return len(data)

    def flush(self):
        pass


class _Handler(BaseHTTPRequestHandler):
    """One connection's HTTP state, kept between its requests; `handle_one_request` answers
    one request (the server's handler threads call it, not socketserver)."""

    server_version = "mxrec-serving"
    protocol_version = "HTTP/1.1"

    def __init__(self, sock: socket.socket, address, server: "ModelServer"):
        # BaseRequestHandler.__init__ would serve the connection to its end on this thread;
        # here each request is dispatched on its own, so only the streams are set up.
        self.request = self.connection = sock
        self.client_address = address
        self.server = server
        self.deadline = time.monotonic()
        self.timed_out = False
        self.answered = False
        self.close_connection = True
        self.command, self.requestline = None, ""
        self._reader = _DeadlineReader(sock, self)
        self.rfile = io.BufferedReader(self._reader)
        self.wfile = _Writer(sock, self)

    def answer_one(self, deadline: float) -> None:
        """Answers the next request of the connection within `deadline` (monotonic): a
        client that has not sent it all by then gets a 408 (nothing, mid-headers)."""
        self.deadline = deadline
        self.timed_out = self.answered = False
        self.close_connection = True
        self.command = None  # not the previous request's
        self.handle_one_request()
        if self.timed_out and not self.answered and self.command:
            self._error(408, self._late(), close=True)

    def pending(self) -> bool:
        """Whether bytes of a next request are already here (pipelined or buffered)."""
        self._reader.poll_only = True
        try:
            return bool(self.rfile.peek(1))
        except OSError:
            return True  # the next read reports it
        finally:
            self._reader.poll_only = False

    def _late(self) -> str:
        return (f"the request was not received within {self.server.timeout:g} s (python -m "
                "mxrec.serving --rest-api-timeout-in-ms)")

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's name)
        logging.debug("http: " + format, *args)

    def send_response(self, code, message=None):
        self.answered = True
        super().send_response(code, message)

    def _reply(self, code: int, body, version: Optional[int] = None,
               close: bool = False, headers: Optional[dict] = None):
        """Sends `body` (a dict, or JSON bytes already written) as the answer."""
        data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=False).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if version is not None:
                self.send_header("X-Model-Version", str(version))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client left, or does not read its answer
            self.close_connection = True

    def _error(self, code: int, message: str, close: bool = False):
        headers = {"Retry-After": "1"} if code == 503 else None
        self._reply(code, {"error": message}, close=close, headers=headers)

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
        self._reply(405, {"error": f"method {self.command} is not allowed on {self.path}; "
                                   "use GET (status, metadata) or POST (predict)"},
                    close=True, headers={"Allow": "GET, POST"})

    do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815 (http.server's names)

    def _guarded(self, handler):
        """Every failure is answered: a RequestError with its status, anything else a 500."""
        try:
            handler()
        except RequestError as error:
            self._error(error.status, str(error), close=getattr(error, "close", False))
        except socket.timeout:
            self._error(408, self._late(), close=True)
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

    def _status(self, wanted: Optional[str]):
        """TF Serving's model status; 404 while no version is AVAILABLE."""
        name = self.server.model_name
        try:
            entries = calls.model_status(self.server.predictor, name, name,
                                         None if wanted is None else int(wanted))
        except RequestError as error:
            if not hasattr(error, "entries"):
                raise
            # The versions it is loading or refused, for the operator.
            return self._reply(404, {"error": str(error),
                                     "model_version_status": error.entries})
        return self._reply(200, {"model_version_status": entries})

    def _get(self):
        match = _STATUS.match(self.path)
        if not match or match.group(1) != self.server.model_name:
            raise RequestError(f"no model at {self.path}; this server has "
                               f"/v1/models/{self.server.model_name}", 404)
        if not match.group(3):
            return self._status(match.group(2))
        name = self.server.model_name
        wanted = None if match.group(2) is None else int(match.group(2))
        with calls.serving(self.server.predictor, name, name, wanted) as instance:
            meta = instance.metadata()
            body = {"model_spec": {"name": name, "signature_name": "",
                                   "version": str(instance.version)},
                    "metadata": {"signature_def": meta,
                                 # mxrec's earlier form, kept for its clients
                                 "inputs": sorted(instance.inputs),
                                 "outputs": sorted(instance.outputs)}}
            version = instance.version
        return self._reply(200, body, version)

    def _post(self):
        match = _PREDICT.match(self.path)
        if not match or match.group(1) != self.server.model_name:
            error = RequestError(f"no predict endpoint at {self.path}; use "
                                 f"/v1/models/{self.server.model_name}:predict", 404)
            self._body()  # read, so that the connection stays usable
            raise error
        data = self._body()
        body = requests.parse_json(data)
        name = self.server.model_name
        wanted = None if match.group(2) is None else int(match.group(2))
        with calls.serving(self.server.predictor, name, name, wanted) as instance:
            signature, feeds, row_format = requests.to_feeds(
                body, instance.input_specs, instance.default_signature, data)
            outputs = calls.run(instance, feeds, signature, self.deadline,
                                f"{self.server.timeout:g} s, python -m mxrec.serving "
                                "--rest-api-timeout-in-ms")
            version = instance.version
        return self._reply(200, requests.answer_json(outputs, row_format), version)


def _closing(error: RequestError) -> RequestError:
    """Marks an error after which the connection cannot be reused (body not read)."""
    error.close = True
    return error


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.create_server((host, port), family=family, backlog=128)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} on {host} is in use (another server "
                                 "there?); stop it or pass another --port") from None
        raise OSError(error.errno, f"cannot listen on {host}:{port}: "
                                   f"{error.strerror or error}") from None
    listener.setblocking(False)
    return listener


class _Connection:
    """A client connection: its socket, its HTTP state (made by the first handler thread
    that answers it), since when it is waiting, and until when it lingers once closing."""

    def __init__(self, sock: socket.socket, address):
        self.sock = sock
        self.address = address
        self.handler: Optional[_Handler] = None
        self.since = time.monotonic()
        self.linger_until: Optional[float] = None


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
        num_threads: handler threads (None: 4 per usable core, TF Serving's default).
        timeout: seconds a request may take from its first byte to its answer (TF
            Serving's --rest_api_timeout_in_ms, 30 s); a keep-alive connection idle this
            long is closed.
        max_queued: requests that may wait for a handler thread (None: num_threads); one
            more is answered 503 at once.

    Raises:
        ValueError: a setting out of range (named).
        PortInUseError: the port is taken.
        OSError: the address cannot be bound otherwise (errno and address in the message).
    """

    def __init__(self, predictor: Predictor, model_name: str, port: int = 8501,
                 poll_interval: Optional[float] = 2.0, host: str = "127.0.0.1",
                 max_body: int = MAX_BODY, num_threads: Optional[int] = None,
                 timeout: float = DEFAULT_TIMEOUT, max_queued: Optional[int] = None):
        num_threads = default_threads() if num_threads is None else num_threads
        max_queued = num_threads if max_queued is None else max_queued
        requests.check_integers(("max_body", max_body, 1, None),
                                ("num_threads", num_threads, 1, None),
                                ("max_queued", max_queued, 1, None), ("port", port, 0, 65535))
        if poll_interval is not None and not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds or None, got {poll_interval}")
        if not (isinstance(timeout, (int, float)) and 0 < timeout < float("inf")):
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.predictor = predictor
        self.model_name = model_name
        self.poll_interval = poll_interval
        self.host = host
        self.max_body = max_body
        self.num_threads = num_threads
        self.timeout = float(timeout)
        self.max_queued = max_queued
        self._listener = _bind(host, port)
        self.port = self._listener.getsockname()[1]
        self._ready: queue.Queue = queue.Queue()  # _Connection, None: stop
        self._in_flight = 0  # handed to the threads (answered or waiting), not back yet
        self._returned = collections.deque()  # (connection, "park" | "linger" | "close")
        self._returned_lock = threading.Lock()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_write.setblocking(False)
        self._stop = threading.Event()
        self._closed = False  # the watcher is gone: connections handed back are closed
        self._open = 0  # connections accepted and not closed (the watcher's count)
        self._threads = []

    # ------------------------------------------------------------ the watcher

    def _watch(self):
        """Accepts connections, watches idle and lingering ones, hands readable ones to the
        handler threads; owns every connection not being answered."""
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, "accept")
        selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        watched = {}  # socket -> _Connection, for expiry
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(self._next_expiry(watched)):
                    if key.data == "accept":
                        self._accept(selector, watched)
                    elif key.data == "wake":
                        self._take_returned(selector, watched)
                    else:
                        self._readable(selector, watched, key.data)
                self._expire(selector, watched)
        finally:
            with self._returned_lock:
                self._closed = True
                returned = list(self._returned)
            for connection in list(watched.values()) + [c for c, _ in returned]:
                self._close(connection)
            self._listener.close()
            selector.close()

    def _next_expiry(self, watched) -> float:
        now = time.monotonic()
        ends = [c.linger_until if c.linger_until is not None else c.since + self.timeout
                for c in watched.values()]
        return min([1.0] + [max(0.0, end - now) for end in ends])

    def _accept(self, selector, watched):
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of descriptors: the rest wait in the backlog
                logging.error("serving: cannot accept a connection: %s", error)
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(sock, address)
            self._open += 1
            if self._open > MAX_CONNECTIONS:
                self._busy(connection, f"{MAX_CONNECTIONS} connections are open")
                self._close(connection)
                continue
            self._park(selector, watched, connection)

    def _park(self, selector, watched, connection):
        connection.since = time.monotonic()
        selector.register(connection.sock, selectors.EVENT_READ, connection)
        watched[connection.sock] = connection

    def _unwatch(self, selector, watched, connection):
        selector.unregister(connection.sock)
        del watched[connection.sock]

    def _readable(self, selector, watched, connection):
        if connection.linger_until is not None:
            try:
                drained = connection.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                drained = b""
            if not drained:
                self._unwatch(selector, watched, connection)
                self._close(connection)
            return
        self._unwatch(selector, watched, connection)
        if self._closed_by_client(connection):
            self._close(connection)  # an idle keep-alive connection ended: no thread needed
            return
        connection.since = time.monotonic()  # the request's deadline starts now
        with self._returned_lock:
            taken = self._in_flight >= self.num_threads + self.max_queued
            if not taken:
                self._in_flight += 1
        if taken:
            self._busy(connection, f"all {self.num_threads} handler threads are taken and "
                                   f"{self.max_queued} requests wait")
            self._linger(selector, watched, connection)
        else:
            self._ready.put(connection)

    @staticmethod
    def _closed_by_client(connection) -> bool:
        """EOF (or a reset) on a watched connection. Its reader holds nothing read ahead: it
        was parked only after `pending()` found nothing."""
        try:
            connection.sock.setblocking(False)
            return not connection.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True  # reset

    def _busy(self, connection, why: str):
        """Answers 503 without reading the request (it never waits, nor blocks the watcher)."""
        body = json.dumps({"error": f"the server is busy: {why} (python -m mxrec.serving "
                                    "--rest-api-num-threads, --max-queued-requests); retry "
                                    "later"}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
        try:
            connection.sock.setblocking(False)
            connection.sock.send(head.encode() + body)
        except OSError:
            pass

    def _linger(self, selector, watched, connection):
        """Closes our side and drains the client's until it closes too (or LINGER)."""
        try:
            connection.sock.shutdown(socket.SHUT_WR)
            connection.sock.setblocking(False)
        except OSError:
            self._close(connection)
            return
        connection.linger_until = time.monotonic() + LINGER
        self._park(selector, watched, connection)

    def _expire(self, selector, watched):
        now = time.monotonic()
        for connection in list(watched.values()):
            end = (connection.linger_until if connection.linger_until is not None
                   else connection.since + self.timeout)
            if now >= end:  # idle past the timeout, or lingered long enough
                self._unwatch(selector, watched, connection)
                self._close(connection)

    def _take_returned(self, selector, watched):
        try:
            while self._wake_read.recv(4096) == 4096:
                pass
        except BlockingIOError:
            pass
        with self._returned_lock:
            returned = list(self._returned)
            self._returned.clear()
        for connection, action in returned:
            if action == "park":
                self._park(selector, watched, connection)
            elif action == "linger":
                self._linger(selector, watched, connection)
            else:
                self._close(connection)

    def _close(self, connection):
        try:
            connection.sock.close()
        except OSError:
            pass
        self._open -= 1

    # ------------------------------------------------------ the handler threads

    def _wake(self):
        try:
            self._wake_write.send(b"x")
        except (BlockingIOError, InterruptedError):
            pass  # a wake-up is pending already
        except OSError:
            pass  # stopped: nobody watches any more

    def _hand_back(self, connection, action: str):
        with self._returned_lock:
            self._in_flight -= 1
            if not self._closed:
                self._returned.append((connection, action))
                self._wake()
                return
        connection.sock.close()

    def _work(self):
        while True:
            connection = self._ready.get()
            if connection is None:
                return
            self._hand_back(connection, self._answer(connection))

    def _answer(self, connection) -> str:
        """Answers the connection's requests while they come back to back; returns what the
        watcher does with it next."""
        deadline = connection.since + self.timeout
        if time.monotonic() >= deadline:
            self._busy(connection, f"the request waited {self.timeout:g} s for one of the "
                                   f"{self.num_threads} handler threads")
            return "linger"
        try:
            if connection.handler is None:
                connection.handler = _Handler(connection.sock, connection.address, self)
            handler = connection.handler
            while True:
                handler.answer_one(deadline)
                if handler.close_connection:
                    return "linger"
                if not handler.pending() and not self._next_soon(connection):
                    return "park"
                deadline = time.monotonic() + self.timeout
        except OSError:
            return "close"
        except Exception:  # noqa: BLE001 (a handler thread outlives any one request)
            logging.exception("serving: a connection failed")
            return "close"

    def _next_soon(self, connection) -> bool:
        """Whether the connection's next request starts within NEXT_REQUEST_WAIT, waited
        for only while no other request is waiting for a thread."""
        if self._stop.is_set() or not self._ready.empty():
            return False
        poller = select.poll()
        poller.register(connection.sock, select.POLLIN)
        return bool(poller.poll(NEXT_REQUEST_WAIT * 1000))

    # --------------------------------------------------------------- lifetime

    def _poll_loop(self):
        self.predictor.follow(self.poll_interval, self._stop)

    def start(self):
        targets = [self._watch] + [self._work] * self.num_threads
        if self.poll_interval is not None:
            targets.append(self._poll_loop)
        for target in targets:
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self):
        """Releases the port of a server that was never started (the predictor stays open)."""
        self._listener.close()
        self._wake_read.close()
        self._wake_write.close()

    def stop(self):
        """Stops accepting, lets the requests being answered finish (each within its
        deadline), closes every connection and the predictor."""
        self._stop.set()
        self._wake()
        while True:  # requests still waiting for a thread are dropped
            try:
                connection = self._ready.get_nowait()
            except queue.Empty:
                break
            self._hand_back(connection, "close")
        if self._threads:
            for _ in range(self.num_threads):
                self._ready.put(None)  # one per handler thread, taken once it is free
            for thread in self._threads:
                thread.join(timeout=self.timeout + LINGER + 10)
        else:
            self._listener.close()
        self._wake_read.close()
        self._wake_write.close()
        self.predictor.close()


class PortInUseError(OSError):
    """The server's port is taken."""


__all__ = ["ModelServer", "PortInUseError", "MAX_BODY", "DEFAULT_TIMEOUT", "MAX_CONNECTIONS",
           "default_threads"]

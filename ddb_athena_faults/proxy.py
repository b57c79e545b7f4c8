"""A fault-injecting HTTP proxy in front of the AWS emulator: what the sync meets on AWS when S3 or DynamoDB throttle,
fail or lose a response.

Every request is forwarded to the emulator (method, path, headers, body) and its response streamed back, unless a
fault window of the plan picks it: S3 requests then get S3's 503 SlowDown or 500 InternalError (its XML error body),
DynamoDB and DynamoDB Streams requests (X-Amz-Target) a 400 ProvisionedThroughputExceededException or
ThrottlingException or a 500 (JSON bodies, as botocore parses them), without reaching the emulator; a lost response is
forwarded (it takes effect) and the connection then dropped unanswered, so the client retries a request that already
happened. `refuse` closes the port for a while (a restart of the endpoint: connections refused, open ones cut).
"""

import contextlib
import http.client
import json
import random
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

# Never copied from one hop to the next (RFC 9110); the body is re-sent with its length.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect", "content-length"}
_STREAM_CHUNK = 64 * 1024


class Fault(StrEnum):
    S3_SLOW_DOWN = "s3_503_slow_down"
    S3_INTERNAL_ERROR = "s3_500_internal_error"
    DYNAMODB_THROUGHPUT_EXCEEDED = "dynamodb_400_throughput_exceeded"
    DYNAMODB_THROTTLING = "dynamodb_400_throttling"
    DYNAMODB_INTERNAL_ERROR = "dynamodb_500_internal_error"
    LOST_RESPONSE = "lost_response"


S3, DYNAMODB = "s3", "dynamodb"
SERVICES_OF = {
    Fault.S3_SLOW_DOWN: {S3},
    Fault.S3_INTERNAL_ERROR: {S3},
    Fault.DYNAMODB_THROUGHPUT_EXCEEDED: {DYNAMODB},
    Fault.DYNAMODB_THROTTLING: {DYNAMODB},
    Fault.DYNAMODB_INTERNAL_ERROR: {DYNAMODB},
    Fault.LOST_RESPONSE: {S3, DYNAMODB},
}

_S3_ERRORS = {
    Fault.S3_SLOW_DOWN: (503, "SlowDown", "Please reduce your request rate."),
    Fault.S3_INTERNAL_ERROR: (500, "InternalError", "We encountered an internal error. Please try again."),
}
_DYNAMODB_ERRORS = {
    Fault.DYNAMODB_THROUGHPUT_EXCEEDED: (
        400,
        "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        "The level of configured provisioned throughput for the table was exceeded.",
    ),
    Fault.DYNAMODB_THROTTLING: (400, "com.amazon.coral.availability#ThrottlingException", "Rate of requests exceeds the allowed throughput."),
    Fault.DYNAMODB_INTERNAL_ERROR: (500, "com.amazonaws.dynamodb.v20120810#InternalServerError", "Internal server error"),
}


def service_of(path: str, target: str) -> str | None:
    """The service a request is for, among those faults are injected into (None: passed through untouched)."""
    if target:
        return DYNAMODB if target.startswith("DynamoDB") else None
    return None if path.startswith(("/moto-api", "/_bench")) else S3


@dataclass(frozen=True)
class FaultWindow:
    fault: Fault
    share: float
    until: float


class FaultPlan:
    """The fault windows in force, set by the nemesis, read by every request; and what was injected, by fault."""

    def __init__(self, rng: random.Random | None = None, clock=time.monotonic):
        self._rng, self._clock = rng or random.Random(), clock
        self._lock = threading.Lock()
        self._windows: list[FaultWindow] = []
        self.injected: Counter[Fault] = Counter()
        self.requests: Counter[str] = Counter()

    def open_window(self, fault: Fault, share: float, seconds: float) -> None:
        """For the next `seconds`, a `share` of the requests of the fault's services gets it."""
        with self._lock:
            self._windows.append(FaultWindow(fault, share, self._clock() + seconds))

    def pick(self, service: str | None) -> Fault | None:
        with self._lock:
            now = self._clock()
            self._windows = [window for window in self._windows if window.until > now]
            if service is None:
                return None
            self.requests[service] += 1
            for window in self._windows:
                if service in SERVICES_OF[window.fault] and self._rng.random() < window.share:
                    self.injected[window.fault] += 1
                    return window.fault
        return None


class FaultProxy:
    """The proxy on 127.0.0.1:`port` (0: a free one) in front of `upstream`, served from a thread."""

    def __init__(self, upstream: str, plan: FaultPlan, port: int = 0):
        parsed = urlparse(upstream)
        self._upstream = (parsed.hostname, parsed.port)
        self.plan = plan
        self.port = port
        self._server: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.refusals = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        proxy = self

        class Handler(_RelayHandler):
            owner = proxy

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by its client
                connection.shutdown(socket.SHUT_RDWR)

    def refuse(self, seconds: float) -> None:
        """Down for `seconds` (connections refused, open ones cut), then up again on the same port."""
        self.refusals += 1
        self.stop()
        time.sleep(seconds)
        self.start()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)


class _RelayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and `Expect: 100-continue` answered as the SDKs expect
    owner: FaultProxy

    def setup(self):
        super().setup()
        self.owner._opened(self.connection)

    def finish(self):
        self.owner._closed(self.connection)
        super().finish()

    def log_message(self, *args):
        pass  # one line a request would drown the harness's log

    def do_GET(self):
        self._relay()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_GET

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _relay(self) -> None:
        try:
            self._relay_request()
        except ConnectionError:
            self.close_connection = True  # the client hung up (its timeout, or the endpoint's restart cut it): as on AWS

    def _relay_request(self) -> None:
        body = self._body()
        fault = self.owner.plan.pick(service_of(self.path, self.headers.get("X-Amz-Target", "")))
        if fault in _S3_ERRORS:
            status, code, message = _S3_ERRORS[fault]
            request_id = uuid.uuid4().hex[:16].upper()
            error = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{request_id}</RequestId></Error>'
            self._answer(status, "application/xml", error.encode(), {"x-amz-request-id": request_id})
            return
        if fault in _DYNAMODB_ERRORS:
            status, error_type, message = _DYNAMODB_ERRORS[fault]
            error = json.dumps({"__type": error_type, "message": message})
            self._answer(status, "application/x-amz-json-1.0", error.encode(), {"x-amzn-RequestId": uuid.uuid4().hex})
            return
        headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(*self.owner._upstream, timeout=300)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            if fault is Fault.LOST_RESPONSE:
                response.read()  # the emulator has done it; the client never hears so
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._stream(response)
        finally:
            upstream.close()

    def _answer(self, status: int, content_type: str, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _stream(self, response: http.client.HTTPResponse) -> None:
        length = response.getheader("Content-Length")
        no_body = self.command == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200
        content = None if no_body or length is not None else response.read()
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if content is not None:
            self.send_header("Content-Length", str(len(content)))
        elif length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        if no_body:
            return
        if content is not None:
            self.wfile.write(content)
            return
        while chunk := response.read(_STREAM_CHUNK):
            self.wfile.write(chunk)

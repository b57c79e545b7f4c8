"""deploy/healthcheck.py, the platform container's health check: healthy only when the webserver answers and reports
every required daemon healthy (against the real webserver: the image's tests)."""

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ddb_athena.lib.settings import REPO_ROOT


def healthcheck():
    spec = importlib.util.spec_from_file_location("healthcheck", REPO_ROOT / "deploy" / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def webserver(statuses):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"data": {"instance": {"daemonHealth": {"allDaemonStatuses": statuses}}}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([{"daemonType": "SCHEDULER", "required": True, "healthy": True}, {"daemonType": "BACKFILL", "required": False, "healthy": False}], []),
        ([{"daemonType": "SENSOR", "required": True, "healthy": False}], ["daemon SENSOR is not healthy"]),
        ([{"daemonType": "SENSOR", "required": True, "healthy": None}], ["daemon SENSOR is not healthy"]),
    ],
)
def test_healthy_only_when_every_required_daemon_is(statuses, expected):
    server = webserver(statuses)
    try:
        assert healthcheck().problems(server.server_port) == expected
    finally:
        server.shutdown()


def test_a_webserver_that_does_not_answer_is_not_healthy():
    server = webserver([])
    port = server.server_port
    server.shutdown()
    server.server_close()
    (problem,) = healthcheck().problems(port, timeout=2)
    assert problem.startswith("the webserver did not report the daemons' health")

"""The benchmarks' AWS emulator: moto in server mode, as `ddb-athena local-stack` runs it, counting every request it
serves by service and operation, so a benchmark reports the requests a sync cycle makes instead of estimating them.

    GET  /_bench/requests    the counts so far, as JSON {"s3 GetObject books/metadata": 12, "dynamodb PutItem": 3, ...}
    POST /_bench/requests    the same, and the counts start again from zero
    GET  /_bench/files       the S3 requests on an Iceberg table's files, by the kind of file (`iceberg_file`):
                             {"PutObject books manifest list": 1, ...}; POST: the same, and they start again

The service is read from the request's SigV4 credential scope (what AWS itself routes on); the operation from the
JSON protocols' X-Amz-Target header, or for S3's REST protocol from the method, the key and the query string.

    .venv/bin/python -m ddb_athena_bench.counting_emulator --port 5055
"""

import argparse
import collections
import contextlib
import json
import re
import signal
import threading
from urllib.parse import parse_qs

from moto.moto_server.threaded_moto_server import MotoRequestHandler
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

COUNTS_PATH = "/_bench/requests"
FILE_COUNTS_PATH = "/_bench/files"
# Requests signed with this access key are a benchmark's own reads (its probe), counted as the service "probe".
PROBE_ACCESS_KEY = "bench-probe"
_SCOPE = re.compile(r"Credential=([^/]+)/\d{8}/[^/]+/([^/]+)/aws4_request")


def _s3_operation(method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]) -> str:
    has_key = "/" in path.strip("/")
    if method == "GET":
        return "GetObject" if has_key else "ListObjects"
    if method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    if method == "PUT":
        if "partNumber" in query:
            return "UploadPart"
        return "CopyObject" if "x-amz-copy-source" in headers else ("PutObject" if has_key else "CreateBucket")
    if method == "POST":
        if "delete" in query:
            return "DeleteObjects"
        return "CreateMultipartUpload" if "uploads" in query else ("CompleteMultipartUpload" if "uploadId" in query else "PostObject")
    if method == "DELETE":
        return "DeleteObject" if has_key else "DeleteBucket"
    return method


def _s3_area(path: str, query: dict[str, list[str]]) -> str:
    """Which files a request is about: an Iceberg table's `data` or `metadata` (`<table>/metadata`), else the key's
    first two folders (`books_source/changes/`); a listing's prefix stands for its key."""
    key = path.strip("/").partition("/")[2] or query.get("prefix", [""])[0]
    parts = key.split("/")
    for index, part in enumerate(parts[1:-1], start=1):
        if part in ("data", "metadata"):
            return f"{parts[index - 1]}/{part}"
    return "".join(f"{part}/" for part in parts[:-1][:2]) or key or "(bucket)"


def _s3_tag(path: str) -> str:
    """What only Hadoop's file system and catalog write: a directory marker (a key ending in '/') or the version hint
    (written to a temporary file, then renamed)."""
    key = path.strip("/").partition("/")[2]
    if path.endswith("/") and key:
        return " marker"
    return " version-hint" if key.endswith(("version-hint.text", "-version-hint.temp")) else ""


# The kind of an Iceberg table's file, by its name's ending (a manifest list is a manifest named `snap-...`).
_FILE_ENDINGS = (
    ("-deletes.parquet", "position deletes"),
    (".parquet", "data"),
    (".avro", "manifest"),
    (".metadata.json", "metadata"),
    ("version-hint.text", "version hint"),
    ("-version-hint.temp", "version hint"),
)


def _headers(environ: dict) -> dict[str, str]:
    return {key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")}


def iceberg_file(environ: dict) -> str | None:
    """'<operation> <table> <kind of file>' of an S3 request on a file of an Iceberg table (in its `data` or `metadata`
    folder): data, position deletes, manifest, manifest list, metadata, version hint. None for anything else, and for
    a benchmark's own reads (its probe)."""
    path = environ.get("PATH_INFO", "/")
    parts = path.strip("/").split("/")
    headers = _headers(environ)
    scope = _SCOPE.search(headers.get("authorization", ""))
    if len(parts) < 4 or parts[-2] not in ("data", "metadata") or (scope and scope.group(1) == PROBE_ACCESS_KEY):
        return None
    kind = next((kind for ending, kind in _FILE_ENDINGS if parts[-1].endswith(ending)), None)
    if kind is None:
        return None
    if kind == "manifest" and parts[-1].startswith("snap-"):
        kind = "manifest list"
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    return f"{_s3_operation(environ['REQUEST_METHOD'], path, query, headers)} {parts[-3]} {kind}"


def request_kind(environ: dict) -> str:
    """'<service> <operation>' of one request (WSGI environ); for S3, '<service> <operation> <area>[ marker| version-hint]' (`_s3_area`, `_s3_tag`)."""
    headers = _headers(environ)
    scope = _SCOPE.search(headers.get("authorization", ""))
    service = scope.group(2) if scope else "unsigned"
    label = "probe" if scope and scope.group(1) == PROBE_ACCESS_KEY else service
    target = headers.get("x-amz-target")
    if target:
        return f"{label} {target.rsplit('.', 1)[-1]}"
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    if service == "s3":
        path = environ.get("PATH_INFO", "/")
        return f"{label} {_s3_operation(environ['REQUEST_METHOD'], path, query, headers)} {_s3_area(path, query)}{_s3_tag(path)}"
    # The query protocol (STS, IAM, SQS's older one): the action is in the query string or the form body.
    action = query.get("Action", [""])[0]
    return f"{label} {action or environ['REQUEST_METHOD']}"


class CountingApp:
    """WSGI middleware: counts each request by `request_kind` and, on a table's files, by `iceberg_file`; serves the
    counts at COUNTS_PATH and FILE_COUNTS_PATH."""

    def __init__(self, app):
        self._app = app
        self._lock = threading.Lock()
        self._counts = {COUNTS_PATH: collections.Counter(), FILE_COUNTS_PATH: collections.Counter()}

    def __call__(self, environ, start_response):
        counts = self._counts.get(environ.get("PATH_INFO"))
        if counts is not None:
            with self._lock:
                body = json.dumps(dict(counts)).encode()
                if environ["REQUEST_METHOD"] == "POST":
                    counts.clear()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        kind, file = request_kind(environ), iceberg_file(environ)
        with self._lock:
            self._counts[COUNTS_PATH][kind] += 1
            if file is not None:
                self._counts[FILE_COUNTS_PATH][file] += 1
        return self._app(environ, start_response)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    server = make_server(
        "127.0.0.1", args.port, CountingApp(DomainDispatcherApplication(create_backend_app)), threaded=True, request_handler=MotoRequestHandler
    )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"AWS emulator (moto, counting requests at {COUNTS_PATH}) on http://127.0.0.1:{args.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

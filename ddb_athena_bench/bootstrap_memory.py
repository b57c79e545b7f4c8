"""Peak memory of a books bootstrap's scan (`make bench-bootstrap`): 100k and 1M items of ~1 KB, written as snapshot
parts of 64 MB (as the sync does) and, for comparison, as one object (the scan held whole, as before the parts).

Each bootstrap runs in a process of its own, whose peak RSS (`ru_maxrss`) is the figure. Its DynamoDB is a scan
served from memory, page by page (about 1 MB a page, as AWS's Scan returns them), so the figure is the bootstrap's own,
not the emulator's; its S3 is the emulator, in this process, over HTTP.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.bootstrap import DEFAULT_PART_BYTES, bootstrap_snapshot
from ddb_athena.streamed.capture.change_files import ChangeFileNamer
from ddb_athena_bench.capture_rate import book_item

ITEMS_PER_PAGE = 1000  # ~1 KB items: about AWS's 1 MB page
ONE_OBJECT = 1 << 62


class GeneratedScan:
    """A DynamoDB client whose scan yields `items` generated items of ~1 KB, a page at a time."""

    def __init__(self, items: int):
        self.items = items

    def get_paginator(self, operation):
        items = self.items

        class Pages:
            def paginate(self, **kwargs):
                for start in range(0, items, ITEMS_PER_PAGE):
                    yield {"Items": [book_item(index) for index in range(start, min(items, start + ITEMS_PER_PAGE))]}

        return Pages()


def _child(items: int, part_bytes: int, endpoint: str, bucket: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    started = time.monotonic()
    result = bootstrap_snapshot(GeneratedScan(items), s3, "books", ("id",), SourceLayout(bucket, f"bench-{items}-{part_bytes}"), ChangeFileNamer(), part_bytes)
    largest = max(s3.head_object(Bucket=bucket, Key=key)["ContentLength"] for key in result.parts)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {"items": result.items, "parts": len(result.parts), "largest_part": largest, "peak_rss_mib": peak_kib / 1024, "seconds": time.monotonic() - started}
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        items, part_bytes, endpoint, bucket = args.child
        _child(int(items), int(part_bytes), endpoint, bucket)
        return

    import logging
    import socket

    import boto3

    from ddb_athena.dev.local_stack import start_moto_server

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = start_moto_server(port)
    endpoint, bucket = f"http://127.0.0.1:{port}", "bench"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(
        Bucket=bucket
    )
    print("| items | written as | parts | largest object | peak RSS of the bootstrap process | seconds |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    try:
        for items in args.items:
            for label, part_bytes in (("parts of 64 MB", DEFAULT_PART_BYTES), ("one object (the scan held whole)", ONE_OBJECT)):
                command = [sys.executable, "-m", "ddb_athena_bench.bootstrap_memory", "--child", str(items), str(part_bytes), endpoint, bucket]
                output = subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ).stdout
                figures = json.loads(output.strip().splitlines()[-1])
                print(
                    f"| {figures['items']:,} | {label} | {figures['parts']} | {figures['largest_part'] / 2**20:,.0f} MiB | "
                    f"{figures['peak_rss_mib']:,.0f} MiB | {figures['seconds']:.0f} |",
                    flush=True,
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

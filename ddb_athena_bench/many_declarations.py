"""A deployment with many declared tables (issue 68): how long the code location takes to load, what it holds, how
long `make templates` takes to render, for N streamed and N exported tables (shaped as reviews and orders), and what
the checks a sync cycle evaluates for each streamed table cost as the tables add up.

    .venv/bin/python -m ddb_athena_bench.many_declarations --tables 25,25

Each load is a fresh process (as `dagster dev` and the ECS code server start one): the definitions and the
repository's serialized snapshot (what the code server sends the webserver), the median of `--rounds`."""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STREAMED = """
[streamed_{n}]
kind = "streamed"
dynamodb_table = "streamed_{n}"
dynamodb_table_variable = "DDB_ATHENA_STREAMED_{n}_TABLE"
iceberg_table = "streamed_{n}"
partition_key = {{ attribute = "book-id", type = "S", name = "book_id" }}
sort_key = {{ attribute = "review.id", type = "N", name = "review_id" }}
columns = [
    {{ name = "stars", attribute = "stars", transform = "decimal", precision = 2, scale = 1 }},
    {{ name = "reviewer", attribute = "reviewer" }},
    {{ name = "reviewed_at", attribute = "reviewed at", transform = "iso_timestamp" }},
]
freshness_minutes = 2
"""
EXPORTED = """
[exported_{n}]
kind = "exported"
dynamodb_table = "exported_{n}"
iceberg_table = "exported_{n}"
partition_key = {{ attribute = "order_id", type = "S" }}
columns = [
    {{ name = "amount", attribute = "amount", transform = "decimal", precision = 18, scale = 2 }},
    {{ name = "created_at", attribute = "created_at", transform = "iso_timestamp", required = true }},
    {{ name = "items", attribute = "items", transform = "json_list" }},
]
partition_by = ["days(created_at)"]
freshness_minutes = 1560
"""

# Run in a fresh process: the code location of the declarations in argv[1], loaded as `dagster dev` loads it.
_LOAD = """
import json, sys, time
from pathlib import Path
started = time.monotonic()
import ddb_athena.lib.declarations as declarations
declarations.DECLARATIONS_FILE = Path(sys.argv[1])
from ddb_athena.definitions import defs
repository = defs.get_repository_def()
assets = repository.asset_graph.get_all_asset_keys()
# What the code server sends the webserver and the daemon: the repository's snapshot, serialized.
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._serdes import serialize_value
snapshot_bytes = len(serialize_value(RepositorySnap.from_def(repository)))
print(json.dumps({
    "seconds": time.monotonic() - started,
    "snapshot_bytes": snapshot_bytes,
    "tables": len(declarations.declared_tables()),
    "assets": len(assets),
    "groups": len({repository.asset_graph.get(key).group_name for key in assets}),
    "checks": len(repository.asset_graph.asset_check_keys),
    "jobs": len(repository.get_all_jobs()),
    "schedules": len(repository.schedule_defs),
    "sensors": len(repository.sensor_defs),
}))
"""


def declarations_text(streamed: int, exported: int) -> str:
    """`streamed` tables shaped as reviews (a composite key, attribute names with a dash, a dot, a space) and
    `exported` tables shaped as orders."""
    return "".join(STREAMED.format(n=n) for n in range(streamed)) + "".join(EXPORTED.format(n=n) for n in range(exported))


def load_code_location(declarations: Path) -> dict:
    """The code location of these declarations, loaded in a fresh process: its counts and its load's seconds."""
    done = subprocess.run([sys.executable, "-c", _LOAD, str(declarations)], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cycle_checks(tables, rounds: int) -> dict:
    """The checks that list S3 (backlog, quarantine), as a sync cycle evaluates them for each of `tables` in the
    table's own thread, against the emulator in a process of its own: the wall time of one table's, of all side by
    side, the client CPU a table's take (thread CPU time: what shares the run's vCPU), and the S3 requests."""
    import socket
    import threading

    from ddb_athena.lib.resources import AwsClientsResource, sync_settings
    from ddb_athena.lib.settings import Settings
    from ddb_athena.streamed.check_results import cycle_check_results

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from ddb_athena.dev.local_stack import wait_for_endpoint

        wait_for_endpoint(endpoint)
        settings = Settings.from_env({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
        sync = sync_settings(settings)
        aws = AwsClientsResource(region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing")
        s3 = aws.client("s3")
        s3.create_bucket(Bucket=sync.bucket)
        requests = []
        s3.meta.events.register("before-call.s3", lambda model, **_: requests.append(model.name))

        def checks_of(table, cpu: list) -> None:
            started = time.thread_time()
            cycle_check_results(aws, sync, table, list_s3=True)
            cpu.append(time.thread_time() - started)

        cycle_check_results(aws, sync, tables[0], list_s3=True)  # the clients' first calls, as a run's first cycle
        alone, side_by_side, cpu = [], [], []
        for _ in range(rounds):
            started = time.monotonic()
            checks_of(tables[0], [])
            alone.append(time.monotonic() - started)
            requests.clear()
            threads = [threading.Thread(target=checks_of, args=(table, cpu)) for table in tables]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            side_by_side.append(time.monotonic() - started)
        return {
            "alone": statistics.median(alone),
            "side_by_side": statistics.median(side_by_side),
            "cpu_per_table": statistics.median(cpu),
            "requests_per_table": len(requests) / len(tables),
        }
    finally:
        server.terminate()
        server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="25,25", help="streamed,exported (default 25,25)")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args(argv)
    streamed, exported = (int(count) for count in arguments.tables.split(","))
    from ddb_athena.lib.declarations import parse_declarations
    from ddb_athena_build.templates import render

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tables.toml"
        path.write_text(declarations_text(streamed, exported), encoding="utf-8")
        loads = [load_code_location(path) for _ in range(arguments.rounds)]
        tables = list(parse_declarations(path.read_text(encoding="utf-8")).values())
        started = time.monotonic()
        rendered = {name: len(render(name, tables)) for name in ("ddb_athena.yaml", "dagster_ecs.yaml")}
        render_seconds = time.monotonic() - started
    counts = {key: value for key, value in loads[0].items() if key != "seconds"}  # the same every round
    seconds = sorted(load["seconds"] for load in loads)
    print(f"{streamed} streamed + {exported} exported tables: {json.dumps(counts)}")
    spread = f"min {seconds[0]:.1f}, max {seconds[-1]:.1f}; {len(seconds)} rounds"
    print(f"code location load, a fresh process: median {statistics.median(seconds):.1f} s ({spread})")
    print(f"templates rendered in {render_seconds:.2f} s: " + ", ".join(f"{name} {size:,} characters" for name, size in rendered.items()))
    streamed_tables = [table for table in tables if table.kind == "streamed"]
    for count in sorted({1, len(streamed_tables)}):
        if count:
            figures = cycle_checks(streamed_tables[:count], arguments.rounds)
            print(
                f"a cycle's S3 checks of {count} streamed table(s), each in its table's thread: one table's {figures['alone'] * 1000:.0f} ms, "
                f"all side by side {figures['side_by_side'] * 1000:.0f} ms, client CPU {figures['cpu_per_table'] * 1000:.1f} ms a table, "
                f"{figures['requests_per_table']:g} S3 requests a table (median of {arguments.rounds} rounds)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The memory and CPU of the platform task (`make bench-platform`): the image's platform container (deploy/platform.sh:
code server, webserver, daemon) on the image's own instance file, against a real PostgreSQL server and the emulator,
its schedules and sensors ticking, no run launched. Docker's own accounting (`docker stats`) every 10 s for MINUTES
after the UI first answers; the figures size deploy/dagster_ecs.yaml's PlatformCpu and PlatformMemory.

It needs a Docker daemon and an image built from deploy/Dockerfile (IMAGE; `make test-image` leaves a base image that
`docker build --build-arg BASE_IMAGE=local/bookworm:base --build-arg DOWNLOADS_OPTIONAL=1 -f deploy/Dockerfile -t
ddb-athena:bench .` builds from, offline).
"""

import argparse
import json
import re
import socket
import subprocess
import time
import urllib.request

from ddb_athena.dev.local_stack import start_moto_server
from ddb_athena_bench.postgres_server import postgres_server

UNITS = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _mebibytes(usage: str) -> float:
    amount, unit = re.fullmatch(r"([\d.]+)(\w+)", usage.split("/")[0].strip()).groups()
    return float(amount) * UNITS[unit]


def measure(image: str, minutes: float) -> dict:
    moto_port, webserver_port, code_port = _free_port(), _free_port(), _free_port()
    emulator = start_moto_server(moto_port)
    try:
        with postgres_server() as postgres:
            environment = {
                **postgres.environment(),
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{moto_port}",
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1",
                "DDB_ATHENA_BUCKET": "ddb-athena-bench",
                "DAGSTER_WEBSERVER_PORT": str(webserver_port),
                "DAGSTER_CODE_SERVER_PORT": str(code_port),
                "DAGSTER_RUN_FAMILY_PREFIX": "bench",
                "DAGSTER_CONTAINER_CONTEXT": json.dumps({"ecs": {"task_role_arn": "arn:aws:iam::123456789012:role/runs"}}),
            }
            options = [option for name, value in environment.items() for option in ("-e", f"{name}={value}")]
            command = ["docker", "run", "-d", "--rm", "--network", "host", "-v", f"{postgres.ca_file}:{postgres.ca_file}:ro", *options, image]
            container = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
            try:
                started = time.monotonic()
                while True:
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{webserver_port}/server_info", timeout=3).read()
                        break
                    except OSError:
                        if time.monotonic() - started > 600:
                            raise TimeoutError("the UI did not answer within 10 minutes") from None
                        time.sleep(2)
                ready_seconds = time.monotonic() - started
                samples = []
                until = time.monotonic() + minutes * 60
                while time.monotonic() < until:
                    time.sleep(10)
                    line = subprocess.run(
                        ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}};{{.CPUPerc}}", container], capture_output=True, text=True, check=True
                    ).stdout.strip()
                    memory, cpu = line.split(";")
                    samples.append((_mebibytes(memory), float(cpu.rstrip("%"))))
            finally:
                subprocess.run(["docker", "stop", "-t", "30", container], capture_output=True)
    finally:
        emulator.stop()
    memory = [sample[0] for sample in samples]
    cpu = sorted(sample[1] for sample in samples)
    return {
        "ui_ready_seconds": round(ready_seconds, 1),
        "samples": len(samples),
        "memory_mib_max": round(max(memory), 1),
        "memory_mib_last": round(memory[-1], 1),
        "cpu_percent_of_a_core_median": cpu[len(cpu) // 2],
        "cpu_percent_of_a_core_max": cpu[-1],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="ddb-athena:bench")
    parser.add_argument("--minutes", type=float, default=5.0)
    arguments = parser.parse_args(argv)
    result = measure(arguments.image, arguments.minutes)
    print(f"the UI answered after {result['ui_ready_seconds']:g} s; over {result['samples']} samples of 10 s:")
    print(f"  memory: max {result['memory_mib_max']:g} MiB, last {result['memory_mib_last']:g} MiB")
    print(f"  CPU: median {result['cpu_percent_of_a_core_median']:g}% of a core, max {result['cpu_percent_of_a_core_max']:g}%")


if __name__ == "__main__":
    main()

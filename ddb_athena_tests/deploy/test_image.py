"""The deployment image (deploy/Dockerfile), built and run: `make test-image` (scripts/test_image.sh provides Docker).

It is built from a local Debian 12 base, offline from Maven: Iceberg's AWS bundle cannot be fetched here, and the build
must say so. Inside the image, the code location loads and one books cycle runs against the emulator on loopback;
the table it writes is read back with PyIceberg."""

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from ddb_athena.lake.local_jars import IMAGE_JAR_NAMES, LOCAL_JAR_NAMES
from ddb_athena_build.pinned import NOT_FETCHED_FILE
from ddb_athena_tests.stack.helpers import iceberg_rows

pytestmark = pytest.mark.image
REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("DDB_ATHENA_TEST_BASE_IMAGE", "")
# The image's platform (scripts/test_image.sh: linux/amd64, or linux/arm64 through QEMU on an x86 machine), which the
# base image's architecture decides: Docker's classic builder, the only one here (no buildx), fails a multi-stage build
# given `--platform` (it labels each stage with the daemon's own platform), so none is given, and the image's
# machine, as its binaries report it, is checked instead.
PLATFORM = os.environ.get("DDB_ATHENA_TEST_IMAGE_PLATFORM", "linux/amd64")
MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[PLATFORM]
# Waits stretch where the image's binaries run through QEMU (several times slower than natively).
PATIENCE = 1 if os.uname().machine == MACHINE else 6
IMAGE_USER_ID = "10001"


def _docker(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout * PATIENCE)


@pytest.fixture(scope="module")
def image() -> tuple[str, str]:
    """(tag, build output) of an image built from the checkout."""
    if shutil.which("docker") is None or _docker("info", timeout=30).returncode != 0:
        pytest.skip("no Docker daemon answers (scripts/test_image.sh starts one where it runs as root)")
    if not BASE_IMAGE:
        pytest.skip("DDB_ATHENA_TEST_BASE_IMAGE names no local base image (scripts/test_image.sh makes one)")
    tag = f"ddb-athena-test:{uuid.uuid4().hex[:8]}"
    build = subprocess.run(
        [
            "docker",
            "build",
            "-f",
            "deploy/Dockerfile",
            "--build-arg",
            f"BASE_IMAGE={BASE_IMAGE}",
            "--build-arg",
            "DOWNLOADS_OPTIONAL=1",
            "-t",
            tag,
            ".",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800 * PATIENCE,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, output[-5000:]
    yield tag, output
    _docker("image", "rm", "-f", tag, timeout=120)


def _run(tag: str, *command: str, env: dict[str, str] | None = None, volumes: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    options = ["--rm", "--network", "host"]
    for name, value in (env or {}).items():
        options += ["-e", f"{name}={value}"]
    for host, container in (volumes or {}).items():
        options += ["-v", f"{host}:{container}"]
    return _docker("run", *options, tag, *command, timeout=900)


def test_the_image_runs_as_a_user_with_python_3_11_and_java_17_on_its_platform(image):
    tag, _ = image
    result = _run(tag, "sh", "-c", "uname -m; id -u; python --version; java -version 2>&1 | head -1")
    assert result.returncode == 0, result.stderr
    machine, user, python, java = result.stdout.splitlines()[:4]
    assert machine == MACHINE
    assert user == IMAGE_USER_ID
    assert python.startswith("Python 3.11.")
    assert '"17.' in java


def test_a_base_named_by_tag_alone_is_refused_but_offline_where_the_image_says_so_and_the_platform_will_not_serve_it(image):
    """Issue 69: a build names its base by digest; the suite's offline build (a local base, no registry) records it."""
    tag, _ = image
    refused = _docker("build", "-f", "deploy/Dockerfile", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "-t", f"{tag}-refused", str(REPO_ROOT))
    assert refused.returncode != 0 and f"BASE_IMAGE={BASE_IMAGE} names no digest" in refused.stdout + refused.stderr
    recorded = _run(tag, "cat", "/opt/ddb_athena/base-not-pinned.txt")
    assert recorded.stdout.strip() == BASE_IMAGE
    served = _run(tag, "bash", "/opt/ddb_athena/platform.sh")
    assert served.returncode == 1 and "built offline, without what it pins (" in served.stderr and f" {BASE_IMAGE})" in served.stderr


def test_the_aws_profiles_jars_are_baked_from_the_lock_or_the_offline_build_named_them_and_baked_the_local_set(image):
    tag, _ = image
    probe = (
        "import json; from ddb_athena.lib.resources import IcebergSparkResource; "
        "c = IcebergSparkResource(profile='aws', warehouse='s3://b/w', master='local[1]').spark_config(); "
        "print(json.dumps({k: c.get(k) for k in ('spark.jars', 'spark.jars.packages')}))"
    )
    result = _run(tag, "sh", "-c", f'ls "$DDB_ATHENA_JAR_DIR"; cat "$DDB_ATHENA_JAR_DIR/{NOT_FETCHED_FILE}" 2>/dev/null; python -c "{probe}"')
    assert result.returncode == 0, result.stderr
    *listing, config_line = result.stdout.splitlines()
    config = json.loads(config_line)
    if NOT_FETCHED_FILE not in listing:
        assert set(IMAGE_JAR_NAMES) <= set(listing) and not set(LOCAL_JAR_NAMES) - set(IMAGE_JAR_NAMES) & set(listing)
        assert config["spark.jars.packages"] is None
        assert config["spark.jars"].split(",") == [f"/opt/ddb_athena/jars/{name}" for name in IMAGE_JAR_NAMES]
    else:
        # Offline (this machine): the image says which JARs its build went without (not pinned yet, or Maven Central
        # unreachable), runs the local profile on the local set, and its aws profile names Maven's packages instead.
        for name in IMAGE_JAR_NAMES:
            assert any(line.startswith(name) for line in listing if line not in IMAGE_JAR_NAMES), (name, listing)
        assert set(LOCAL_JAR_NAMES) <= set(listing)
        assert "iceberg-aws-bundle:1.10.2" in config["spark.jars.packages"]


def test_inside_the_image_the_code_location_loads_and_a_books_cycle_lands_in_iceberg(image, settings, moto_endpoint, tmp_path):
    tag, _ = image
    dynamodb = settings.client("dynamodb")
    for number in range(5):
        dynamodb.put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": f"book-{number}"}, "name": {"S": f"Name {number}"}})
    dynamodb.delete_item(TableName=settings.dynamodb_tables["books"], Key={"id": {"S": "book-4"}})
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    warehouse.chmod(0o777)  # the image's user writes it
    environment = {
        "DDB_ATHENA_PROFILE": "local",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": settings.region,
        "DDB_ATHENA_BUCKET": settings.bucket,
        "DDB_ATHENA_NAMESPACE": settings.namespace,
        # At the same path inside as outside: the table's metadata names its files by absolute path.
        "DDB_ATHENA_WAREHOUSE": warehouse.as_uri(),
        "DDB_ATHENA_SPARK_MASTER": "local[1]",
        # The image's instance is PostgreSQL's: a one-off run here keeps its instance in a scratch directory.
        "DAGSTER_HOME": "/tmp/dagster_home",
    }
    result = _run(
        tag,
        "sh",
        "-c",
        'mkdir -p "$DAGSTER_HOME" && dagster definitions validate -m ddb_athena.definitions '
        "&& dagster asset materialize -m ddb_athena.definitions --select books_source,books_iceberg",
        env=environment,
        volumes={str(warehouse): str(warehouse)},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert "RUN_SUCCESS" in result.stdout + result.stderr
    rows = iceberg_rows(warehouse.as_uri(), settings.namespace, "books")
    assert sorted((row["id"], row["name"]) for row in rows) == [(f"book-{number}", f"Name {number}") for number in range(4)]


def test_the_platform_container_serves_the_ui_from_its_code_server_and_its_daemon_beats_in_postgresql(image, settings, moto_endpoint, monkeypatch):
    """deploy/platform.sh with the image's own instance (deploy/dagster.yaml), on a real PostgreSQL server."""
    from dagster import DagsterInstance
    from dagster_graphql import DagsterGraphQLClient

    from ddb_athena_bench.postgres_server import postgres_server
    from ddb_athena_tests.stack.helpers import free_port, wait_for

    tag, _ = image
    webserver_port, code_server_port = free_port(), free_port()
    # The on-call's queue on the alert topic: the platform's start sends a test alert before it serves.
    sns, sqs = settings.client("sns"), settings.client("sqs")
    topic = sns.create_topic(Name="ddb-athena-alerts")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="on-call")["QueueUrl"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])
    with postgres_server() as postgres:
        environment = {
            **postgres.environment(),
            "AWS_ENDPOINT_URL": moto_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": settings.region,
            "AWS_REGION": settings.region,  # Fargate sets both; the instance signs its database tokens for it
            "DDB_ATHENA_BUCKET": settings.bucket,
            "DDB_ATHENA_WAREHOUSE": f"s3://{settings.bucket}/warehouse",
            "DAGSTER_WEBSERVER_PORT": str(webserver_port),
            "DAGSTER_CODE_SERVER_PORT": str(code_server_port),
            "DAGSTER_CONTAINER_CONTEXT": json.dumps({"ecs": {"task_role_arn": "arn:aws:iam::123456789012:role/runs"}}),
            "DAGSTER_RUN_FAMILY_PREFIX": "ddb_athena",
            # The suite's image is built offline, without the pinned JARs: the platform refuses such an image otherwise.
            "DDB_ATHENA_ALLOW_UNPINNED_IMAGE": "1",
            "DDB_ATHENA_ALERT_TOPIC_ARN": topic,
        }
        options = [option for name, value in environment.items() for option in ("-e", f"{name}={value}")]
        # The front's CA in place of the image's RDS bundle (PGSSLROOTCERT), at the same path.
        ca_file = f"{postgres.ca_file}:{postgres.ca_file}:ro"
        started = _docker("run", "-d", "--rm", "--network", "host", "-v", ca_file, *options, tag, timeout=120)
        assert started.returncode == 0, started.stderr
        container = started.stdout.strip()
        try:

            def assets_served():
                try:
                    client = DagsterGraphQLClient("127.0.0.1", port_number=webserver_port, timeout=5)
                    result = client._execute("{ assetNodes { assetKey { path } } }")
                except Exception:  # noqa: BLE001 - not up yet
                    return None
                return {"/".join(node["assetKey"]["path"]) for node in result["assetNodes"]}

            served = wait_for("the webserver to serve the code location", assets_served, timeout=300 * PATIENCE, poll=3)
            assert {"books_source", "books_iceberg", "orders_export", "orders_athena"} <= served
            alerts = [json.loads(message["Body"]) for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])]
            assert [alert["Subject"] for alert in alerts] == ["ddb_athena: the platform started - a test alert"]
            for name, value in environment.items():
                monkeypatch.setenv(name, value)  # this process reads the same instance
            instance_home = Path(tempfile.mkdtemp())
            shutil.copy(REPO_ROOT / "deploy" / "dagster.yaml", instance_home / "dagster.yaml")
            with DagsterInstance.from_config(str(instance_home)) as instance:
                wait_for("the daemon's heartbeats in PostgreSQL", lambda: instance.get_daemon_heartbeats(), timeout=120 * PATIENCE, poll=3)
                assert "SCHEDULER" in instance.get_daemon_heartbeats()

            # ECS's health check, in the container, against its own webserver and daemon.
            def healthy():
                checked = _docker("exec", container, "python", "/opt/ddb_athena/healthcheck.py", timeout=60)
                return checked if checked.returncode == 0 else None

            health = wait_for("the health check to pass", healthy, timeout=180 * PATIENCE, poll=5)
            assert health.stdout.strip() == "healthy"
        finally:
            logs = _docker("logs", container, timeout=60)
            _docker("stop", "-t", "30", container, timeout=120)
        assert postgres.password not in logs.stdout + logs.stderr


# A run's command in its task: Spark answers after ECS's SIGTERM reached the run's Python (a sync rides a Spot
# interruption out on its JVM). A signal to the whole process group would have killed the JVM with it.
SPARK_AFTER_SIGTERM = """
import signal, threading
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").getOrCreate()
received = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: received.set())
print("ready", flush=True)
received.wait(300)
print("spark answers after SIGTERM:", spark.range(10).count(), flush=True)
"""


def test_in_a_run_task_ecss_sigterm_reaches_the_runs_python_and_not_its_jvm(image):
    tag, _ = image
    started = _docker("run", "-d", tag, "python", "-c", SPARK_AFTER_SIGTERM, timeout=120)
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        from ddb_athena_tests.stack.helpers import wait_for

        wait_for("Spark to start in the container", lambda: "ready" in _docker("logs", container, timeout=30).stdout, timeout=300 * PATIENCE, poll=2)
        assert _docker("kill", "--signal", "TERM", container, timeout=30).returncode == 0
        waited = _docker("wait", container, timeout=180)
        logs = _docker("logs", container, timeout=30)
    finally:
        _docker("rm", "-f", container, timeout=60)
    assert waited.stdout.strip() == "0", logs.stdout + logs.stderr
    assert "spark answers after SIGTERM: 10" in logs.stdout

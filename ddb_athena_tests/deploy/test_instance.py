"""A deployment's Dagster instance (deploy/dagster.yaml) on a real PostgreSQL server, and its EcsRunLauncher against the
emulator's ECS API: it launches a run's task from inside a (described) daemon task, checks its health, terminates it."""

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from botocore.awsrequest import AWSResponse
from dagster import DagsterInstance
from dagster._core.launcher import WorkerStatus
from dagster._core.storage.compute_log_manager import ComputeIOType
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from ddb_athena.lib.database_role import ensure_database_role
from ddb_athena.lib.run_capacity import ON_DEMAND, SPOT, capacity_strategy, capacity_tags
from ddb_athena_bench.postgres_server import postgres_server

# Each test starts PostgreSQL, a daemon or a code server (out of `make test-fast`).
pytestmark = pytest.mark.subprocess

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "ddb-athena"
RUN_FAMILY_PREFIX = "ddb_athena"
RUN_ROLE_ARN = "arn:aws:iam::123456789012:role/ddb-athena-DagsterRunRole"
# The runs' execution role (deploy/dagster_ecs.yaml): the image and the logs, no secret, unlike the platform task's.
RUN_EXECUTION_ROLE_ARN = "arn:aws:iam::123456789012:role/ddb-athena-dagster-RunExecutionRole"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ddb-athena:test"
# The platform task's one container, as deploy/dagster_ecs.yaml defines it (what the runs' tasks are made from).
PLATFORM_ENVIRONMENT = [{"name": "DDB_ATHENA_PROFILE", "value": "aws"}, {"name": "DDB_ATHENA_BUCKET", "value": "test-bucket"}]
LOG_GROUP = "/ddb_athena/ddb-athena/dagster"  # the platform stack's, its stack named as the IAM checks name it
SETUP_SECRETS = [{"name": "DAGSTER_POSTGRES_MASTER_PASSWORD", "valueFrom": "arn:aws:secretsmanager:us-east-1:123456789012:secret:rds!db-x:password::"}]


@pytest.fixture(scope="module")
def postgres():
    with postgres_server() as server:
        yield server


@pytest.fixture
def deployed_home(tmp_path, postgres, monkeypatch, aws_env):
    """$DAGSTER_HOME holding deploy/dagster.yaml, and the environment an ECS task of the stack has (Fargate sets the
    region's two variables itself)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    environment = {"DAGSTER_HOME": str(home), "DAGSTER_RUN_FAMILY_PREFIX": RUN_FAMILY_PREFIX, "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in {**postgres.environment(), **environment}.items():
        monkeypatch.setenv(name, value)
    # The platform task's database-setup container, at every start: it hands the instance's role what an older
    # configuration made as the master user (this module's tests share one server, in any order).
    with postgres.connect_as_master() as connection:
        ensure_database_role(connection, postgres.user)
    connection.close()
    return home


def test_the_instance_keeps_runs_in_postgresql_and_migrates(deployed_home, daemon_task, postgres):
    with DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        assert type(instance.run_launcher).__name__ == "SpotFallbackEcsRunLauncher"
        assert type(instance.compute_log_manager).__name__ == "S3ComputeLogManager"
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
    migrate = subprocess.run([sys.executable, "-m", "dagster", "instance", "migrate"], capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr
    info = subprocess.run([sys.executable, "-m", "dagster", "instance", "info"], capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "PostgresRunStorage" in info.stdout
    assert postgres.password not in info.stdout + info.stderr + migrate.stdout + migrate.stderr


def _master_sql(postgres, *statements: str) -> None:
    with postgres.connect_as_master() as connection, connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    connection.close()


# How psycopg2 reports a query whose session the server ended under it (pg_terminate_backend, a restart).
SESSION_DROPPED = re.compile(r"SSL SYSCALL error: EOF detected|server closed the connection unexpectedly|terminating connection due to administrator command")


def _errors_across_a_rotation(instance: DagsterInstance, postgres, rotated_password: str) -> tuple[int, int, list[str]]:
    """What a daemon's loop of reads meets while RDS rotates the master password and a restart drops every session:
    (reads before, reads after, errors)."""
    errors, reads, stop = [], {"before": 0, "after": 0}, threading.Event()
    phase = ["before"]

    def daemon_loop():
        while not stop.is_set():
            try:
                instance.get_runs_count()
                reads[phase[0]] += 1
            except Exception as error:  # noqa: BLE001 - what the daemon would log and retry
                errors.append(type(error).__name__ + ": " + str(error).splitlines()[0][:160])
            stop.wait(0.05)

    thread = threading.Thread(target=daemon_loop)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while reads["before"] < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        _master_sql(postgres, f"ALTER ROLE {postgres.master_user} PASSWORD '{rotated_password}'")
        with postgres.connect(postgres.master_user, rotated_password) as connection, connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND usename IN (%s, %s)",
                (postgres.user, postgres.master_user),
            )
        connection.close()
        phase[0] = "after"
        deadline = time.monotonic() + 30
        while reads["after"] < 20 and time.monotonic() < deadline and len(errors) < 20:
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join()
    return reads["before"], reads["after"], errors


@pytest.mark.parametrize("login", ["iam-token", "password-injected-at-start"])
def test_a_password_rotation_and_dropped_sessions_under_a_running_daemon_leave_the_deployed_instance_working(
    deployed_home, postgres, monkeypatch, caplog, login
):
    """RDS rotates the managed master password every 7 days, and a restart or failover drops every session. The
    deployed instance holds no password (each new connection presents a fresh IAM token as its own role), so a
    daemon's loop goes on through both. The way it was before, the master password injected once at the task's start,
    fails from the first new connection after the rotation until a restart."""
    if login == "password-injected-at-start":
        config = yaml.safe_load((deployed_home / "dagster.yaml").read_text())
        database = config["storage"]["postgres"]
        database.pop("auth_provider")
        database["postgres_db"].update(username=postgres.master_user, password={"env": "DAGSTER_POSTGRES_PASSWORD"})
        (deployed_home / "dagster.yaml").write_text(yaml.safe_dump(config))
        monkeypatch.setenv("DAGSTER_POSTGRES_PASSWORD", postgres.password)
        # The control: each refused connection is still retried as dagster-postgres does, without its back-off
        # (~12 s a connection), so twenty refusals take seconds.
        monkeypatch.setattr("dagster_postgres.utils.calculate_delay", lambda **_: 0.01)
    try:
        with DagsterInstance.get() as instance:
            before, after, errors = _errors_across_a_rotation(instance, postgres, "rotated-by-rds-7-days-later")
    finally:
        with postgres.connect(postgres.master_user, "rotated-by-rds-7-days-later") as connection, connection.cursor() as cursor:
            cursor.execute(f"ALTER ROLE {postgres.master_user} PASSWORD '{postgres.password}'")
        connection.close()
    assert before >= 20
    # A read in flight when its session is dropped fails once, as it would on RDS (the daemon logs it and reads again).
    dropped_in_flight = [error for error in errors if error.startswith("OperationalError") and SESSION_DROPPED.search(error)]
    assert len(dropped_in_flight) <= 1, dropped_in_flight
    after_the_drop = [error for error in errors if error not in dropped_in_flight]
    if login == "iam-token":
        # Every read after it, on new connections, succeeds.
        assert (after >= 20, after_the_drop, postgres.front.refused) == (True, [], [])
    else:
        # dagster-postgres retries each new connection, logging why, then gives up.
        assert after == 0 and after_the_drop and all("too many retries for DB connection" in error for error in after_the_drop), errors
        assert "password authentication failed" in caplog.text


class _TaskMetadata(BaseHTTPRequestHandler):
    """ECS's task metadata endpoint (v4) as the platform's container sees it: its name, its task and cluster."""

    task_arn = ""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = {"Name": "platform"} if self.path.rstrip("/") == "" else {"Cluster": CLUSTER, "TaskARN": self.task_arn}
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def daemon_task(settings, monkeypatch):
    """The stack's shape in the emulator: a VPC and subnet, the cluster, and a running platform task (whose container runs
    the daemon) with the metadata endpoint the launcher reads."""
    ec2, ecs = settings.client("ec2"), settings.client("ecs")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="ddb-athena-tasks", Description="tasks", VpcId=vpc)["GroupId"]
    ecs.create_cluster(clusterName=CLUSTER)
    platform = ecs.register_task_definition(
        family="ddb-athena-platform",
        networkMode="awsvpc",
        requiresCompatibilities=["FARGATE"],
        cpu="512",
        memory="2048",
        containerDefinitions=[
            # As deploy/dagster_ecs.yaml: the container that alone holds the master password runs first.
            # (The emulator's RunTask wants each container's memory; Fargate takes the task's.)
            {"name": "database-setup", "image": IMAGE, "memory": 512, "essential": False, "command": ["ddb-athena", "database-role"], "secrets": SETUP_SECRETS},
            {
                "name": "platform",
                "image": IMAGE,
                "memory": 2048,
                "essential": True,
                "environment": PLATFORM_ENVIRONMENT,
                "dependsOn": [{"containerName": "database-setup", "condition": "SUCCESS"}],
                "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": LOG_GROUP, "awslogs-stream-prefix": "dagster"}},
            },
        ],
    )["taskDefinition"]["taskDefinitionArn"]
    network = {"awsvpcConfiguration": {"subnets": [subnet], "securityGroups": [group], "assignPublicIp": "DISABLED"}}
    task_arn = ecs.run_task(cluster=CLUSTER, taskDefinition=platform, launchType="FARGATE", networkConfiguration=network)["tasks"][0]["taskArn"]
    handler = type("DaemonTaskMetadata", (_TaskMetadata,), {"task_arn": task_arn})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", f"http://127.0.0.1:{server.server_port}")
    yield {"task_arn": task_arn, "subnet": subnet, "security_group": group}
    server.shutdown()


@pytest.fixture(scope="module")
def code_location(tmp_path_factory):
    """The code location's server as the daemon starts it (workspace.yaml), one for the module's launches (one each took
    about 6 s): each test launches through a copy of this workspace for its own instance. The server is given the
    code location's image and container context (deploy/dagster_ecs.yaml sets them): the runs' role."""
    context = {"ecs": {"task_role_arn": RUN_ROLE_ARN, "execution_role_arn": RUN_EXECUTION_ROLE_ARN}}
    environment = {"DAGSTER_CURRENT_IMAGE": IMAGE, "DAGSTER_CONTAINER_CONTEXT": json.dumps(context)}
    with pytest.MonkeyPatch.context() as patch, DagsterInstance.local_temp(str(tmp_path_factory.mktemp("code_location"))) as instance:
        for name, value in environment.items():
            patch.setenv(name, value)
        with WorkspaceProcessContext(instance, WorkspaceFileTarget([str(REPO_ROOT / "workspace.yaml")])) as workspace:
            yield workspace


def launched(code_location: WorkspaceProcessContext, instance, job_name: str, tags: dict[str, str] | None = None) -> str:
    """A run of `job_name` created and launched as the daemon does; its id."""
    with code_location.copy_for_test_instance(instance) as process_context:
        context = process_context.create_request_context()
        (location_name,) = context.code_location_names
        repository = next(iter(context.get_code_location(location_name).get_repositories().values()))
        remote_job = repository.get_full_job(job_name)
        run = instance.create_run(
            job_name=remote_job.name,
            run_id=None,
            run_config={},
            resolved_op_selection=None,
            step_keys_to_execute=None,
            status=None,
            tags=tags or {},
            root_run_id=None,
            parent_run_id=None,
            job_snapshot=remote_job.job_snapshot,
            execution_plan_snapshot=None,
            parent_job_snapshot=None,
            remote_job_origin=remote_job.get_remote_origin(),
            job_code_origin=remote_job.get_python_origin(),
            asset_selection=None,
            asset_check_selection=None,
            op_selection=None,
            asset_graph=repository.asset_graph,
        )
        instance.launch_run(run.run_id, context)
        return run.run_id


def test_the_ecs_run_launcher_starts_a_runs_task_checks_its_health_and_terminates_it(deployed_home, daemon_task, settings, code_location):
    ecs = settings.client("ecs")
    with DagsterInstance.get() as instance:
        run_id = launched(code_location, instance, "books_maintenance")

    run = instance_run = DagsterInstance.get().get_run_by_id(run_id)
    task_arn = instance_run.tags["ecs/task_arn"]
    (task,) = ecs.describe_tasks(cluster=CLUSTER, tasks=[task_arn])["tasks"]
    # Its task definition, registered by the launcher from the platform's container alone: its image and environment
    # (no secret: the run logs in to the database with the runs' role's IAM tokens; the master password stays in the
    # database-setup container), the runs' role, under the deployment's prefix.
    definition = ecs.describe_task_definition(taskDefinition=task["taskDefinitionArn"])["taskDefinition"]
    assert definition["family"].startswith(f"{RUN_FAMILY_PREFIX}_") and definition["taskRoleArn"] == RUN_ROLE_ARN
    assert definition["executionRoleArn"] == RUN_EXECUTION_ROLE_ARN  # not the platform's, which may read the secret
    (container,) = definition["containerDefinitions"]
    assert container["name"] == "run" and container["image"] == IMAGE
    assert all(variable in container["environment"] for variable in PLATFORM_ENVIRONMENT) and not container.get("secrets")
    (override,) = task["overrides"]["containerOverrides"]
    assert override["name"] == "run"
    assert override["command"][:3] == ["dagster", "api", "execute_run"]
    # The run's task is where the daemon's is: same subnet and security group (the launcher read them from its task).
    details = {detail["name"]: detail["value"] for detail in task["attachments"][0]["details"]}
    assert details["subnetId"] == daemon_task["subnet"]

    with DagsterInstance.get() as instance:
        # The UI shows the run's logs from S3, where its task uploads them (here: as the run would).
        log_key = [run.run_id, "compute_logs", "books_maintenance"]
        logs = instance.compute_log_manager
        uploaded = f"dagster/compute-logs/storage/{run.run_id}/compute_logs/books_maintenance.err"
        settings.client("s3").put_object(Bucket=settings.bucket, Key=uploaded, Body=b"a line")
        assert logs.get_log_keys_for_log_key_prefix([run.run_id, "compute_logs"], ComputeIOType.STDERR) == [log_key]
        logs.download_from_cloud_storage(log_key, ComputeIOType.STDERR)
        assert logs.get_log_data(log_key).stderr == b"a line"
        assert instance.run_launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
        assert instance.run_launcher.terminate(run.run_id)
        (task,) = ecs.describe_tasks(cluster=CLUSTER, tasks=[task_arn])["tasks"]
        assert task["lastStatus"] == "STOPPED" or task.get("desiredStatus") == "STOPPED"
        assert instance.run_launcher.check_run_worker_health(run).status != WorkerStatus.RUNNING


def test_a_cleanup_runs_task_takes_the_cleanups_role_the_others_the_runs(deployed_home, daemon_task, settings, code_location, monkeypatch):
    """The launcher starts a cleanup job's task under the cleanups' role (lib/resources.py's cleanup_role_arn, from the
    data stack's settings), not under the runs' role, which may rewrite the warehouse; every other run's task takes its
    definition's role."""
    cleanup_role = "arn:aws:iam::123456789012:role/ddb-athena-DagsterCleanupRole"
    monkeypatch.setenv("DDB_ATHENA_CLEANUP_ROLE_ARN", cleanup_role)
    ecs = settings.client("ecs")
    with DagsterInstance.get() as instance:
        cleanup = instance.get_run_by_id(launched(code_location, instance, "books_source_cleanup"))
        maintenance = instance.get_run_by_id(launched(code_location, instance, "books_maintenance"))
    (cleanup_task,) = ecs.describe_tasks(cluster=CLUSTER, tasks=[cleanup.tags["ecs/task_arn"]])["tasks"]
    (maintenance_task,) = ecs.describe_tasks(cluster=CLUSTER, tasks=[maintenance.tags["ecs/task_arn"]])["tasks"]
    assert cleanup_task["overrides"]["taskRoleArn"] == cleanup_role
    assert "taskRoleArn" not in maintenance_task["overrides"]  # its task definition's: the runs' role


def test_a_runs_tags_set_in_the_ui_never_choose_its_tasks_role_command_or_definition(deployed_home, daemon_task, settings, code_location):
    """Issue 69: anyone who opens the UI can tag a run. dagster-aws would pass these tags to RunTask; the launcher
    ignores them, says so in the run's log, and keeps the one choice a tag may make (Spot or regular Fargate)."""
    admin = "arn:aws:iam::123456789012:role/Admin"
    hostile = {
        "ecs/task_overrides": json.dumps({"taskRoleArn": admin, "executionRoleArn": admin}),
        "ecs/container_overrides": json.dumps({"command": ["sh", "-c", "aws s3 rm --recursive s3://bucket/warehouse"]}),
        "ecs/run_task_kwargs": json.dumps(
            {"taskDefinition": "attacker:1", "overrides": {"taskRoleArn": admin}, "capacityProviderStrategy": capacity_strategy(SPOT)}
        ),
    }
    sent = []
    with DagsterInstance.get() as instance:
        instance.run_launcher.ecs.meta.events.register("before-call.ecs.RunTask", lambda params, **_: sent.append(json.loads(params["body"])))
        run = instance.get_run_by_id(launched(code_location, instance, "books_maintenance", hostile))
        logs = [event.message for event in instance.all_logs(run.run_id)]
    (request,) = sent  # RunTask as sent to ECS
    assert "taskRoleArn" not in request["overrides"] and "executionRoleArn" not in request["overrides"]
    (container,) = request["overrides"]["containerOverrides"]
    assert "aws s3 rm" not in json.dumps(container["command"]) and "dagster" in " ".join(container["command"])
    assert "attacker" not in request["taskDefinition"]
    assert request["capacityProviderStrategy"] == capacity_strategy(SPOT)  # the one choice a tag makes
    assert any("Ignored the run's tags ecs/task_overrides, ecs/container_overrides, ecs/run_task_kwargs" in line for line in logs), logs


def test_a_runs_task_that_dies_fails_its_run_with_the_containers_last_log_lines(deployed_home, daemon_task, settings, code_location):
    """Run monitoring asks ECS for a run's task; a task stopped under a running run fails it, and the failure carries
    what the container last logged (CloudWatch, logs:GetLogEvents on the platform's role)."""
    ecs, logs = settings.client("ecs"), settings.client("logs")
    with DagsterInstance.get() as instance:
        run = instance.get_run_by_id(launched(code_location, instance, "books_maintenance"))
        task_id = run.tags["ecs/task_arn"].rsplit("/", 1)[1]
        logs.create_log_group(logGroupName=LOG_GROUP)
        stream = f"dagster/run/{task_id}"  # the awslogs driver's name for the run container's stream
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        lines = ["Starting the books sync", "java.lang.OutOfMemoryError: Java heap space"]
        now = int(time.time() * 1000)
        logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=[{"timestamp": now + n, "message": line} for n, line in enumerate(lines)])
        ecs.stop_task(cluster=CLUSTER, task=run.tags["ecs/task_arn"], reason="OutOfMemoryError: Container killed due to memory usage")

        def killed_at_its_memory_limit(parsed, **_):
            # The emulator's stopped containers all exit 0: ECS reports a container killed at its limit with 137.
            for task in parsed.get("tasks", []):
                if task["taskArn"] == run.tags["ecs/task_arn"]:
                    task["containers"] = [{"name": "run", "lastStatus": "STOPPED", "exitCode": 137}]

        instance.run_launcher.ecs.meta.events.register("after-call.ecs.DescribeTasks", killed_at_its_memory_limit)
        health = instance.run_launcher.check_run_worker_health(run)
    assert health.status == WorkerStatus.FAILED
    assert "Run worker logs:" in health.msg and all(line in health.msg for line in lines)


def test_a_task_spot_cannot_place_is_launched_on_regular_fargate_saying_so_in_the_runs_log_and_an_alert(
    deployed_home, daemon_task, settings, monkeypatch, code_location
):
    """ECS answers RunTask with a failure, not an error, when Fargate Spot has no capacity, and never falls back by itself.
    The emulator's ECS has no capacity to run out of: botocore's before-call hook answers the Spot call as ECS does."""
    sns, sqs = settings.client("sns"), settings.client("sqs")
    topic = sns.create_topic(Name="ddb-athena-alerts")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="on-call")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    monkeypatch.setenv("DDB_ATHENA_ALERT_TOPIC_ARN", topic)
    strategies = []

    def no_spot_capacity(params, **_):
        strategies.append(json.loads(params["body"]).get("capacityProviderStrategy"))  # the request as sent
        if strategies[-1] == capacity_strategy(SPOT):
            failure = {"arn": "", "reason": "Capacity is unavailable at this time. Please try again later or in a different availability zone"}
            return AWSResponse(params["url"], 200, {}, None), {"tasks": [], "failures": [failure]}
        return None

    with DagsterInstance.get() as instance:
        instance.run_launcher.ecs.meta.events.register("before-call.ecs.RunTask", no_spot_capacity)
        run_id = launched(code_location, instance, "books_source_cleanup", capacity_tags(SPOT))
        run = instance.get_run_by_id(run_id)
        messages = [entry.message for entry in instance.all_logs(run_id)]
    assert strategies == [capacity_strategy(SPOT), capacity_strategy(ON_DEMAND)]  # at once, not after the launcher's retries
    assert "ecs/task_arn" in run.tags
    assert any("Fargate Spot had no capacity for this run" in message for message in messages)
    (alert,) = [json.loads(message["Body"]) for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]]
    assert alert["Subject"] == "ddb_athena: books_source_cleanup went on regular Fargate: no Spot capacity"
    assert f"/runs/{run_id}" in alert["Message"]


def test_a_schema_migration_is_refused_without_a_snapshot_of_the_database_and_made_behind_one(deployed_home, postgres, settings):
    """Issue 69: an upgrade's migration would land a rolled-back image on a schema it may not read. A platform start
    that finds one due refuses it unless the deployment names a recent, available snapshot of this database; then
    it migrates. A current schema goes on as `dagster instance migrate` would."""
    from alembic.script import ScriptDirectory
    from dagster_postgres.run_storage import run_storage
    from dagster_postgres.utils import pg_alembic_config

    from ddb_athena.lib.instance_schema import SchemaGateError, check_snapshot, migrate_behind_gate, schema_state

    rds = settings.client("rds")
    database = {"Engine": "postgres", "DBInstanceClass": "db.t4g.micro", "MasterUsername": "dagster", "MasterUserPassword": "pw123456"}
    for name in ("ddb-athena-db", "another-db"):
        rds.create_db_instance(DBInstanceIdentifier=name, **database)
    rds.create_db_snapshot(DBSnapshotIdentifier="before-upgrade", DBInstanceIdentifier="ddb-athena-db")
    rds.create_db_snapshot(DBSnapshotIdentifier="of-another", DBInstanceIdentifier="another-db")
    with DagsterInstance.get() as instance:
        assert migrate_behind_gate(instance, rds, "ddb-athena-db", None, log=lambda _: None).database == schema_state(instance).head  # current: on
        # The database as an older image left it: one revision behind what this Dagster needs.
        head = schema_state(instance).head
        previous = ScriptDirectory.from_config(pg_alembic_config(run_storage.__file__)).get_revision(head).down_revision
        _master_sql(postgres, f"UPDATE alembic_version SET version_num = '{previous}'")
        assert schema_state(instance).migration_due
        with pytest.raises(SchemaGateError, match=f"at {previous}, and this image's Dagster needs {head}.*Snapshot the database"):
            migrate_behind_gate(instance, rds, "ddb-athena-db", None)
        with pytest.raises(SchemaGateError, match="is a snapshot of another-db, not of ddb-athena-db"):
            migrate_behind_gate(instance, rds, "ddb-athena-db", "of-another")
        with pytest.raises(SchemaGateError, match="no such snapshot"):
            migrate_behind_gate(instance, rds, "ddb-athena-db", "never-taken")
        with pytest.raises(SchemaGateError, match="more than a day ago: take one for this upgrade"):
            check_snapshot(rds, "before-upgrade", "ddb-athena-db", now=datetime.now(UTC) + timedelta(days=2))
        assert schema_state(instance).database == previous  # refused: untouched
        logged = []
        assert migrate_behind_gate(instance, rds, "ddb-athena-db", "before-upgrade", log=logged.append).database == head
        assert any(f"from {previous} to {head}, behind snapshot before-upgrade of ddb-athena-db" in line for line in logged)

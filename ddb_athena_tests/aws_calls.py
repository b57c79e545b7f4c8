"""Every AWS call the code makes while the suite runs, recorded through botocore's own event hooks.

Each call is attributed to the principal that makes it in a deployment, from where in `ddb_athena` it
comes: the capture Lambda's handler, the operator's tools (`ddb-athena init/seed/simulate`, run with a
person's own credentials, never by a role of the stack), or else Dagster and its runs (also from the threads
in which dagster-aws's Pipes readers poll CloudWatch Logs). On ECS, Dagster's own processes have a role of their
own (deploy/dagster_ecs.yaml's PlatformRole): the EcsRunLauncher, the webserver reading run logs from S3, and the
sensors (alerts, cleanup), which on one host (DagsterPrincipal ec2-instance) are the runs' role's too. A call whose nearest
project frame is a test's (setting up or reading the emulator, also from inside a callback the code calls)
is the tests' own and is not kept, unless it is made by the launcher or the log reader (a test drives them).
"""

import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

import botocore.handlers
import dagster_aws

import ddb_athena

PACKAGE_DIR = Path(ddb_athena.__file__).resolve().parent
TESTS_DIR = Path(__file__).resolve().parent
# As its frames name it (a virtualenv reached through a symbolic link stays unresolved there).
DAGSTER_AWS_DIR = Path(dagster_aws.__file__).parent
CAPTURE_LAMBDA, DAGSTER_RUNS, SPARK_JOB, OPERATOR = "capture_lambda", "dagster_runs", "spark_job", "operator"
PLATFORM = "dagster_platform"
# The cleanup runs on ECS, under a role of their own (deploy/ddb_athena.yaml's DagsterCleanupRole); the runs' on one host.
DAGSTER_CLEANUP = "dagster_cleanup"
CLEANUP_JOBS = PACKAGE_DIR / "cleanup" / "jobs.py"
# The sensors' calls on one host (DagsterPrincipal ec2-instance), where the runs' role is Dagster's own.
DAGSTER_ON_ONE_HOST = "dagster_on_one_host"
ALERTS_DIR = PACKAGE_DIR / "alerts"
# Sensors, evaluated by the daemon: the platform's role on ECS.
SENSOR_CODE = (ALERTS_DIR, PACKAGE_DIR / "cleanup" / "sensors.py")
# The instance's run launcher (deploy/dagster.yaml), in the platform's processes only (the daemon, the webserver), and
# the schema's gate, which deploy/platform.sh runs at each platform start.
PLATFORM_CODE = (PACKAGE_DIR / "lib" / "ecs_launcher.py", PACKAGE_DIR / "lib" / "instance_schema.py")
# dagster-aws's code that runs in the platform's processes: the run launcher (daemon, webserver) and the run log reader.
PLATFORM_LIBRARY = (DAGSTER_AWS_DIR / "ecs", DAGSTER_AWS_DIR / "s3" / "compute_log_manager.py")
LAMBDA_MODULE = PACKAGE_DIR / "streamed" / "capture" / "lambda_handler.py"
# ... and `ddb-athena replay-failures` (streamed/capture/failed_batches.py; its queue-depth reading, made from a check, is the
# runs': a call is the operator's when the outermost package frame is one of these), and `ddb-athena restore-table`, a
# break-glass step no run takes (lib/table_recovery.py), and who launches a run from the CLI (dev/launch.py).
OPERATOR_MODULES = {
    PACKAGE_DIR / name
    for name in ("dev/local_stack.py", "dev/simulate.py", "dev/cli.py", "dev/launch.py", "streamed/capture/failed_batches.py", "lib/table_recovery.py")
}
RESOURCE_PARAMETERS = (
    "Bucket",
    "Key",
    "Prefix",
    "TableName",
    "TableArn",
    "StreamArn",
    "ExportArn",
    "S3Bucket",
    "S3Prefix",
    "applicationId",
    "jobRunId",
    "executionRoleArn",
    "logGroupName",
    "logStreamName",
    "TopicArn",
    "cluster",
    "taskDefinition",
    "tasks",
    "task",
    "family",
    "taskRoleArn",
    "executionRoleArn",
    "Name",
    "DBSnapshotIdentifier",
)


@dataclass(frozen=True)
class AwsCall:
    principal: str
    service: str  # the IAM prefix (botocore's signing name)
    operation: str
    region: str
    params: tuple  # the parameters that name resources, as (name, value) pairs
    origin: str  # the innermost ddb_athena frame, file:function

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)


recorded: list[AwsCall] = []
# The tests that check the calls of the whole suite (the IAM coverage tests).
SUITE_CALLS_MARKER = "suite_calls"


def _principals(package_frames: list[Path]) -> list[str]:
    if LAMBDA_MODULE in package_frames:
        return [CAPTURE_LAMBDA]
    if any(frame in PLATFORM_CODE for frame in package_frames):
        return [PLATFORM]
    if CLEANUP_JOBS in package_frames:
        return [DAGSTER_CLEANUP, DAGSTER_RUNS]
    if any(frame.is_relative_to(code) for frame in package_frames for code in SENSOR_CODE):
        return [PLATFORM, DAGSTER_ON_ONE_HOST]
    return [OPERATOR if package_frames[0] in OPERATOR_MODULES else DAGSTER_RUNS]


def _record(params, model, context=None, **_):
    frame, package_frames, innermost, library, platform = sys._getframe(1), [], None, None, None
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(TESTS_DIR) and innermost is None:
            if platform is None:
                return  # the test's own call
            break  # the platform's library, driven by a test
        if path.is_relative_to(PACKAGE_DIR):
            package_frames.append(path.resolve())
            innermost = innermost or f"{path.relative_to(PACKAGE_DIR)}:{frame.f_code.co_name}"
        elif path.is_relative_to(DAGSTER_AWS_DIR):
            library = library or f"dagster_aws/{path.relative_to(DAGSTER_AWS_DIR)}:{frame.f_code.co_name}"
            if any(path.is_relative_to(part) for part in PLATFORM_LIBRARY):
                platform = platform or library
        frame = frame.f_back
    if platform and not package_frames:
        principals, innermost = [PLATFORM], platform
    elif not package_frames and library:
        # dagster-aws's Pipes message readers poll in threads of their own, started by the run's Pipes client.
        principals, innermost = [DAGSTER_RUNS], library
    elif package_frames:
        package_frames.reverse()  # outermost first
        principals = _principals(package_frames)
    else:
        return
    # A list of names (ECS's tasks) as one value.
    named = [(name, ",".join(params[name]) if isinstance(params[name], list) else params[name]) for name in RESOURCE_PARAMETERS if name in params]
    if tags := params.get("tags"):
        # EMR's a mapping, ECS's a list of {key, value}.
        named.append(("tags", ",".join(sorted(tags) if isinstance(tags, dict) else sorted(tag["key"] for tag in tags))))
    if model.name == "DeleteObjects":
        named += [("Key", entry["Key"]) for entry in params["Delete"]["Objects"]]
    region = (context or {}).get("client_region") or "us-east-1"
    for principal in principals:
        recorded.append(AwsCall(principal, model.service_model.signing_name, model.name, region, tuple(named), innermost))


def install() -> None:
    """Every botocore session created from now on records its calls (botocore registers BUILTIN_HANDLERS on each)."""
    if ("before-parameter-build", _record) not in botocore.handlers.BUILTIN_HANDLERS:
        botocore.handlers.BUILTIN_HANDLERS.append(("before-parameter-build", _record))


def save(directory: Path, process: str) -> None:
    """The calls this test process recorded, for a check after a run on several workers (`load`)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{process}-{os.getpid()}.pickle").write_bytes(pickle.dumps(recorded))


def load(directory: Path) -> list[AwsCall]:
    return [call for path in sorted(directory.glob("*.pickle")) for call in pickle.loads(path.read_bytes())]

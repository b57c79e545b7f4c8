"""Least privilege, proven on the suite's own calls: every AWS call the code made in the tests before this one
(recorded by botocore's event hooks, ddb_athena_tests/aws_calls.py) is allowed, action and resource, by the
template's role of the principal that makes it; and each role grants nothing beyond those calls except the
listed actions that botocore cannot see, each with its reason."""

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from ddb_athena_tests import aws_calls
from ddb_athena_tests.aws_calls import CAPTURE_LAMBDA, DAGSTER_CLEANUP, DAGSTER_ON_ONE_HOST, DAGSTER_RUNS, PLATFORM, SPARK_JOB, AwsCall, recorded
from ddb_athena_tests.deploy.policies import ROLES, Deployment, allows, granted_actions, iam_requests, statements

LAMBDA_SERVICE = "made by AWS Lambda with the function's role, not by the handler"
GLUE_CATALOG = "Iceberg's GlueCatalog, in the run's JVM (aws profile): loads, creates and commits the tables"
S3_FILE_IO = "Iceberg's S3FileIO, in the JVM: writes and reads table files, aborts a failed multipart upload"
EXPORT_READ = "Spark reads the export's manifest and data files (listing the export's prefix)"
EMR_LOGS = "EMR Serverless writes the job's driver and executor logs to its log group with the job's role"
UNSEEN_BY_BOTOCORE = {
    CAPTURE_LAMBDA: {
        "dynamodb:DescribeStream": LAMBDA_SERVICE,
        "dynamodb:GetShardIterator": LAMBDA_SERVICE,
        "dynamodb:GetRecords": LAMBDA_SERVICE,
        "dynamodb:ListStreams": LAMBDA_SERVICE,
        "sqs:SendMessage": "the event source mapping sends a failed batch's stream range to the on-failure queue",
        "logs:CreateLogStream": "the Lambda runtime writes the function's log",
        "logs:PutLogEvents": "the Lambda runtime writes the function's log",
    },
    DAGSTER_RUNS: {
        "glue:GetDatabase": GLUE_CATALOG,
        "glue:GetTable": GLUE_CATALOG,
        "glue:GetTables": GLUE_CATALOG,
        "glue:CreateTable": GLUE_CATALOG,
        "glue:UpdateTable": GLUE_CATALOG,
        "s3:AbortMultipartUpload": S3_FILE_IO,
        "s3:PutObjectAcl": "DynamoDB's export writes the export's files with the caller's permissions, this one among them",
    },
    # The cleanup runs on ECS: the job's code deletes; the run process around it reads the settings and writes its logs.
    DAGSTER_CLEANUP: {
        "ssm:GetParameter": "the data stack's settings, read as the run's process starts (lib/settings.py, before the job's code)",
        "s3:PutObject": "the run's stdout and stderr, uploaded by dagster-aws's compute log manager",
        "s3:ListBucket": "the run's log uploads (dagster-aws's compute log manager)",
    },
    # Dagster's own processes on ECS (deploy/dagster_ecs.yaml): the launcher, the UI's run logs, the sensors (alerts, cleanup).
    PLATFORM: {
        "rds-db:connect": "the instance's database login: an IAM token botocore signs locally (generate_db_auth_token), RDS checks it",
        "ssm:GetParameter": "the data stack's settings, read by each process at its start (lib/settings.py): in the suite, the runs' calls",
        **dict.fromkeys(
            ("ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"),
            "the Session Manager agent ECS Exec runs in the task (the UI's port forwarding)",
        ),
        **dict.fromkeys(
            ("logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogGroups"),
            "the Session Manager agent writes each ECS Exec session's log (the cluster's ExecuteCommandConfiguration)",
        ),
    },
    # The orders load on EMR Serverless: all of it in the job's JVM (its Pipes messages go to stdout, no AWS call).
    SPARK_JOB: {
        "s3:GetObject": EXPORT_READ + "; " + S3_FILE_IO + "; the job reads its launching run's writer lease before its MERGE",
        "s3:ListBucket": EXPORT_READ,
        "s3:PutObject": S3_FILE_IO,
        "s3:DeleteObject": S3_FILE_IO,
        "s3:AbortMultipartUpload": S3_FILE_IO,
        "glue:GetDatabase": GLUE_CATALOG,
        "glue:GetTable": GLUE_CATALOG,
        "glue:CreateTable": GLUE_CATALOG,
        "glue:UpdateTable": GLUE_CATALOG,
        "logs:CreateLogStream": EMR_LOGS,
        "logs:PutLogEvents": EMR_LOGS,
        "logs:DescribeLogStreams": EMR_LOGS,
    },
}


def made_by_runs(calls: list[AwsCall]) -> bool:
    return any(call.principal == DAGSTER_RUNS for call in calls)


@pytest.fixture(scope="module")
def calls(request):
    if made_by_runs(recorded):
        return recorded  # the suite ran in this process, before this module
    directory = request.config.getoption("--aws-calls-dir")
    if not directory:
        pytest.skip("checks the AWS calls of the whole suite: run it with the other tests (make test)")
    saved = aws_calls.load(Path(directory))
    assert made_by_runs(saved), f"no call of a run was saved in {directory}: run the suite with --aws-calls-dir {directory} first"
    return saved


# Tables only the tests declare (composite keys of every type, an exported one, attribute names of any text): the template grants the declared tables, so a
# deployment has no role to judge these calls by.
TEST_ONLY_TABLES = ("blobs", "ledger", "shipments", "odd_names", "odd_exports", "numbers_stream", "numbers_export")


def of_a_test_only_table(call: AwsCall) -> bool:
    names = [str(value) for _, value in call.params]
    return any(
        f"table/{table}/" in name or name == table or name.startswith((f"{table}_source/", f"{table}_export/")) for table in TEST_ONLY_TABLES for name in names
    )


@pytest.mark.suite_calls
def test_every_call_is_allowed_to_the_role_that_makes_it(calls):
    denied = defaultdict(set)
    for call in calls:
        if of_a_test_only_table(call):
            continue
        principal, deployment = call.principal, Deployment.of(call)
        if principal == DAGSTER_ON_ONE_HOST:  # the sensors on one host: the runs' role there
            principal, deployment = DAGSTER_RUNS, replace(deployment, dagster_principal="ec2-instance")
        if principal in UNSEEN_BY_BOTOCORE and not allows(deployment, principal, call):
            denied[call.principal].add((str(iam_requests(call)), call.origin))
    assert not denied, "\n".join(f"{principal}: {entry}" for principal, entries in denied.items() for entry in sorted(entries))


def call(principal: str, service: str, operation: str, **params) -> AwsCall:
    return AwsCall(principal, service, operation, "us-east-1", tuple(params.items()), "test")


def test_the_evaluator_refuses_what_the_roles_do_not_grant():
    """The coverage test's control: calls the roles must not allow are refused, their neighbours allowed."""
    lambda_mode, run_mode = Deployment(), Deployment(books_capture="run")
    put = dict(Bucket="b", Key="books_source/changes/x.jsonl")
    assert allows(lambda_mode, CAPTURE_LAMBDA, call(CAPTURE_LAMBDA, "s3", "PutObject", **put))
    assert not allows(lambda_mode, CAPTURE_LAMBDA, call(CAPTURE_LAMBDA, "s3", "PutObject", Bucket="b", Key="warehouse/x.parquet"))
    assert not allows(lambda_mode, CAPTURE_LAMBDA, call(CAPTURE_LAMBDA, "s3", "GetObject", **put))
    assert allows(lambda_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "dynamodb", "Scan", TableName="books"))
    assert not allows(lambda_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "dynamodb", "Scan", TableName="orders"))
    assert not allows(lambda_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "dynamodb", "PutItem", TableName="books"))
    assert allows(lambda_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "s3", "ListObjectsV2", Bucket="b", Prefix="orders_export/"))
    assert not allows(lambda_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "s3", "ListObjectsV2", Bucket="b", Prefix=""))
    assert not allows(lambda_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "s3", "HeadBucket", Bucket="b"))
    stream = "arn:aws:dynamodb:us-east-1:123456789012:table/books/stream/2026-01-01T00:00:00.000"
    # Beside the capture Lambda too: a bootstrap reads where the stream ends, and through the scan's end.
    assert allows(lambda_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "dynamodb", "DescribeStream", StreamArn=stream))
    assert allows(run_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "dynamodb", "DescribeStream", StreamArn=stream))
    other_stream = stream.replace("table/books/", "table/someone_elses/")
    assert not allows(run_mode, DAGSTER_RUNS, call(DAGSTER_RUNS, "dynamodb", "DescribeStream", StreamArn=other_stream))
    # The platform's role: its own cluster's tasks, its own prefix's task definitions, the runs' role passed to ECS.
    task = "arn:aws:ecs:us-east-1:123456789012:task/ddb-athena/0abc"
    assert allows(lambda_mode, PLATFORM, call(PLATFORM, "ecs", "StopTask", cluster="ddb-athena", task=task))
    assert not allows(lambda_mode, PLATFORM, call(PLATFORM, "ecs", "StopTask", cluster="other", task=task.replace("ddb-athena", "other")))
    assert allows(lambda_mode, PLATFORM, call(PLATFORM, "ecs", "RunTask", cluster="ddb-athena", taskDefinition="ddb_athena_a_b_c:3"))
    assert not allows(lambda_mode, PLATFORM, call(PLATFORM, "ecs", "RunTask", cluster="ddb-athena", taskDefinition="someone_elses:3"))
    runs_role = "arn:aws:iam::123456789012:role/ddb-athena-DagsterRunRole"
    assert allows(lambda_mode, PLATFORM, call(PLATFORM, "ecs", "RegisterTaskDefinition", family="ddb_athena_a", taskRoleArn=runs_role))
    assert not allows(lambda_mode, PLATFORM, call(PLATFORM, "ecs", "RegisterTaskDefinition", family="someone_elses", taskRoleArn=runs_role))
    admin = runs_role.replace("DagsterRunRole", "Admin")
    assert not allows(lambda_mode, PLATFORM, call(PLATFORM, "ecs", "RegisterTaskDefinition", family="ddb_athena_a", taskRoleArn=admin))


@pytest.mark.suite_calls
@pytest.mark.parametrize("books_capture", ["lambda", "run"])
@pytest.mark.parametrize("principal", sorted(UNSEEN_BY_BOTOCORE))
def test_a_role_grants_only_what_its_code_calls_and_the_listed_unseen_actions(calls, principal, books_capture):
    called = {action for call in calls if call.principal == principal for action, _ in iam_requests(call)}
    granted = granted_actions(Deployment(books_capture=books_capture), principal)
    if principal == CAPTURE_LAMBDA and books_capture == "run":
        assert granted == set()  # no Lambda, no role
    else:
        assert granted - called == set(UNSEEN_BY_BOTOCORE[principal])


def parliament_findings(statements_: list[dict]) -> list[tuple]:
    from parliament import analyze_policy_string

    policy = analyze_policy_string(json.dumps({"Version": "2012-10-17", "Statement": statements_}))
    return [(finding.issue, finding.detail) for finding in policy.findings]


@pytest.mark.parametrize("books_capture", ["lambda", "run"])
@pytest.mark.parametrize("principal", sorted(ROLES))
def test_parliament_finds_nothing_in_the_resolved_policies(principal, books_capture):
    assert parliament_findings(list(statements(Deployment(books_capture=books_capture), principal, "ddb-athena-data"))) == []


def test_parliament_catches_what_it_is_there_for():
    wrong = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::ddb-athena-data"}  # a bucket, not objects
    assert parliament_findings([wrong])

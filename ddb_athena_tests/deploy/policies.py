"""The template's IAM policies, resolved for one deployment, and the question "does this role allow this call?".

A small evaluator for the forms the template uses (Allow statements; `Ref`, `Fn::Sub`, `Fn::GetAtt`,
`Fn::If`; resource patterns with `*`; `StringLike` on `s3:prefix`), strict about anything else, so a new
form in the template fails the test instead of passing unchecked.
"""

import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path

from cfnlint.decode import decode_str

from ddb_athena.lib.declarations import declared_tables
from ddb_athena_build.templates import camel, render
from ddb_athena_tests.aws_calls import DAGSTER_CLEANUP, PLATFORM, AwsCall


def rendered(name: str, tables=None) -> Path:
    """deploy/<name>.j2 rendered for these tables (default: the declared ones), as `make templates` renders it, into
    this process's own directory (the suite's workers render side by side)."""
    folder = hashlib.sha256("-".join(table.name for table in tables).encode()).hexdigest()[:16] if tables else "declared"
    path = Path(_RENDERED.name) / folder / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(render(name, tables))
    return path


_RENDERED = tempfile.TemporaryDirectory(prefix="ddb-athena-templates-")
TEMPLATE = rendered("ddb_athena.yaml")
PLATFORM_TEMPLATE = rendered("dagster_ecs.yaml")
ACCOUNT = "123456789012"  # moto's account: the calls' ARNs carry it
BOOKS_TABLE, ORDERS_TABLE = "books", "orders"
STACK = "ddb-athena"
# The stack's EMR Serverless application, the Spark job's role and its log group, as this deployment names them.
EMR_APPLICATION_ID = "00fabcdefghij000"
EMR_ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/{STACK}-SparkJobRole"
EMR_LOG_GROUP = f"/ddb_athena/{STACK}/spark"
# IAM actions whose names differ from the API operation (AWS Service Authorization Reference).
S3_ACTIONS = {
    "ListObjectsV2": ["s3:ListBucket"],
    "ListObjects": ["s3:ListBucket"],
    "HeadBucket": ["s3:ListBucket"],
    "HeadObject": ["s3:GetObject"],
    "DeleteObjects": ["s3:DeleteObject"],
    "CopyObject": ["s3:GetObject", "s3:PutObject"],
    "ListBuckets": ["s3:ListAllMyBuckets"],
}


def load_template(path=TEMPLATE) -> dict:
    parsed, problems = decode_str(path.read_text())
    assert not problems
    return json.loads(json.dumps(parsed))


def iam_actions(call: AwsCall) -> list[str]:
    if call.service == "s3" and call.operation in S3_ACTIONS:
        return S3_ACTIONS[call.operation]
    return [f"{call.service}:{call.operation}"]


# moto names an export `table/<table ARN>/import/<id>`; AWS names it `table/<table>/export/<id>`, which IAM checks.
MOTO_EXPORT_ARN = re.compile(r"^(?P<prefix>arn:aws:dynamodb:[^:]+:\d+:)table/arn:aws:dynamodb:[^:]+:\d+:table/(?P<table>[^/]+)/import/(?P<id>.+)$")


def call_resources(call: AwsCall) -> list[str]:
    """The ARNs IAM checks the call against."""
    region = call.region
    if call.param("ExportArn"):
        return [MOTO_EXPORT_ARN.sub(r"\g<prefix>table/\g<table>/export/\g<id>", call.param("ExportArn"))]
    if call.service == "s3":
        bucket = call.param("Bucket")
        keys = [value for name, value in call.params if name == "Key"]
        return [f"arn:aws:s3:::{bucket}/{key}" for key in keys] or [f"arn:aws:s3:::{bucket}"]
    if call.operation == "GetRecords":
        # Its stream is named only inside the shard iterator, which GetShardIterator (checked with its StreamArn)
        # gave out; the code reads one stream, the books table's.
        return [f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{BOOKS_TABLE}/stream/2026-01-01T00:00:00.000"]
    if call.service == "sns":
        # The tests' topics have names of their own; the code publishes to one topic, the stack's AlertTopic.
        return [f"arn:aws:sns:{region}:{ACCOUNT}:{STACK}-AlertTopic"]
    if call.service == "ssm":
        return [f"arn:aws:ssm:{region}:{ACCOUNT}:parameter{call.param('Name')}"]
    if call.service == "rds" and call.param("DBSnapshotIdentifier"):
        return [f"arn:aws:rds:{region}:{ACCOUNT}:snapshot:{call.param('DBSnapshotIdentifier')}"]
    if call.service == "sqs":
        # Named by its URL, which IAM does not check; the code uses the capture Lambda's failure queue of a table (books').
        return [f"arn:aws:sqs:{region}:{ACCOUNT}:{STACK}-CaptureBooksFailureQueue"]
    for name in ("StreamArn", "ExportArn", "TableArn"):
        if call.param(name):
            return [call.param(name)]
    table = call.param("TableName")
    if table:
        return [table if table.startswith("arn:") else f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{table}"]
    return ["*"]


def iam_requests(call: AwsCall) -> list[tuple[str, list[str]]]:
    """Each authorization the call needs: (IAM action, the ARNs IAM checks it against)."""
    region = call.region
    if call.service == "emr-serverless":
        application = f"arn:aws:emr-serverless:{region}:{ACCOUNT}:/applications/{call.param('applicationId')}"
        if call.operation == "GetApplication":
            return [("emr-serverless:GetApplication", [application])]
        if call.operation == "StartJobRun":
            requests = [("emr-serverless:StartJobRun", [application]), ("iam:PassRole", [call.param("executionRoleArn")])]
            # Tags given at creation are authorized as tagging the new job run.
            return requests + ([("emr-serverless:TagResource", [f"{application}/jobruns/*"])] if call.param("tags") else [])
        return [(f"emr-serverless:{call.operation}", [f"{application}/jobruns/{call.param('jobRunId')}"])]
    if call.service == "ecs":
        return _ecs_requests(call)
    if call.service == "logs":
        group = f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{call.param('logGroupName')}"
        stream = call.param("logStreamName")
        return [(f"logs:{call.operation}", [f"{group}:log-stream:{stream}" if stream else f"{group}:*"])]
    return [(action, call_resources(call)) for action in iam_actions(call)]


def _ecs_requests(call: AwsCall) -> list[tuple[str, list[str]]]:
    """ECS's resources by ARN (a task definition named by its family is its latest revision), and the roles a task
    definition passes to ECS."""
    prefix = f"arn:aws:ecs:{call.region}:{ACCOUNT}"

    def task_definition(name: str) -> str:
        return name if name.startswith("arn:") else f"{prefix}:task-definition/{name if ':' in name else name + ':1'}"

    if call.operation == "RegisterTaskDefinition":
        roles = [role for role in (call.param("taskRoleArn"), call.param("executionRoleArn")) if role]
        return [("ecs:RegisterTaskDefinition", [task_definition(call.param("family"))])] + [("iam:PassRole", [role]) for role in roles]
    if call.operation == "DescribeTaskDefinition":
        return [("ecs:DescribeTaskDefinition", ["*"])]
    if call.operation == "RunTask":
        tasks = f"{prefix}:task/{call.param('cluster')}/*"
        requests = [("ecs:RunTask", [task_definition(call.param("taskDefinition"))])]
        # Tags given at creation are authorized as tagging the new task.
        return requests + ([("ecs:TagResource", [tasks])] if call.param("tags") else [])
    named = call.param("tasks") or call.param("task") or ""
    return [(f"ecs:{call.operation}", [name for name in named.split(",") if name])]


def table_parameters(dynamodb_tables: Mapping[str, str], stream_arn: Callable[[str], str]) -> dict:
    """The stack's parameters for the declared tables: a DynamoDB table's name where a variable names it, a streamed
    table's stream (`stream_arn` of its DynamoDB table)."""
    tables = declared_tables().values()
    return {
        **{f"{camel(table.name)}TableName": dynamodb_tables[table.name] for table in tables if table.dynamodb_table_variable},
        **{f"{camel(table.name)}StreamArn": stream_arn(dynamodb_tables[table.name]) for table in tables if table.kind == "streamed"},
    }


@dataclass(frozen=True)
class Deployment:
    """Parameter values of one deployment; the bucket is the one each call names (tests use several)."""

    books_table: str = BOOKS_TABLE
    orders_table: str = ORDERS_TABLE
    region: str = "us-east-1"
    emr_serverless: bool = True
    dagster_principal: str = "ecs-task"
    books_capture: str = "lambda"

    @classmethod
    def of(cls, call: AwsCall) -> "Deployment":
        """The deployment the call belongs to: a test's table not declared is that deployment's books table, or orders'.
        The default capture (the Lambda): the runs read the stream in either, around a bootstrap beside the Lambda."""
        table = (call.param("TableName") or "").rsplit("/", 1)[-1]
        capture = "lambda"
        if not table or table in {declaration.dynamodb_table for declaration in declared_tables().values()}:
            return cls(region=call.region, books_capture=capture)
        # A test's own table: the export code's is that deployment's orders table, any other code's its books table.
        if call.origin.startswith("exported/export.py"):
            return cls(orders_table=table, region=call.region, books_capture=capture)
        return cls(books_table=table, region=call.region, books_capture=capture)

    def parameters(self, bucket: str) -> dict:
        names = {"books": self.books_table, "orders": self.orders_table}
        tables = {name: names.get(name, table.dynamodb_table) for name, table in declared_tables().items()}
        return {
            **table_parameters(tables, lambda table: f"arn:aws:dynamodb:{self.region}:{ACCOUNT}:table/{table}/stream/*"),
            "ExistingBucketName": bucket,
            "GlueDatabaseName": "library",
            "DagsterPrincipal": self.dagster_principal,
            "BooksCapture": self.books_capture,
            "CaptureCodeBucket": "code-bucket",
            "CaptureCodeKey": "ddb_athena/streamed/capture-lambda.zip",
            "AlertEmail": "oncall@example.com",
            "WarehouseRecoveryDays": 7,
            "BreakGlassRoleArn": "",
            "LogDataEvents": "true",
            "EnableEmrServerless": str(self.emr_serverless).lower(),
            "EmrReleaseLabel": "emr-7.12.0",
            "AWS::Partition": "aws",
            "AWS::Region": self.region,
            "AWS::AccountId": ACCOUNT,
            "AWS::StackName": STACK,
        }


class Resolver:
    def __init__(self, template: dict, parameters: dict):
        self.template, self.parameters = template, parameters
        self.conditions = {
            "CreateBucket": parameters["ExistingBucketName"] == "",
            "DagsterOnEc2": parameters["DagsterPrincipal"] == "ec2-instance",
            "WithEmrServerless": parameters["EnableEmrServerless"] == "true",
            "WithCaptureLambda": parameters["BooksCapture"] == "lambda",
            "WithBreakGlassRole": parameters["BreakGlassRoleArn"] != "",
            "WithDataEvents": parameters["LogDataEvents"] == "true",
        }
        assert set(self.conditions) == set(template["Conditions"]), "a new condition: teach the resolver"

    def physical(self, name: str) -> str:
        kind = self.template["Resources"][name]["Type"]
        region, stack = self.parameters["AWS::Region"], STACK
        return {
            "AWS::S3::Bucket": self.parameters["ExistingBucketName"] or "created-bucket",
            "AWS::SQS::Queue": f"arn:aws:sqs:{region}:{ACCOUNT}:{stack}-{name}",
            "AWS::SNS::Topic": f"arn:aws:sns:{region}:{ACCOUNT}:{stack}-{name}",
            "AWS::Logs::LogGroup": f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{self._log_group_name(name)}:*",
            "AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{stack}-{name}",
            "AWS::EMRServerless::Application": f"arn:aws:emr-serverless:{region}:{ACCOUNT}:/applications/{EMR_APPLICATION_ID}",
        }.get(kind, name)

    def _log_group_name(self, name: str) -> str:
        given = self.template["Resources"][name]["Properties"].get("LogGroupName")
        return self.resolve(given) if given else f"{STACK}-{name}"

    def resolve(self, value):
        if isinstance(value, list):
            return [item for item in (self.resolve(v) for v in value) if item is not None]
        if not isinstance(value, dict):
            return value
        if len(value) != 1 or not next(iter(value)).startswith(("Ref", "Fn::")):
            return {key: self.resolve(item) for key, item in value.items()}
        ((function, argument),) = value.items()
        if function == "Ref":
            if argument == "AWS::NoValue":
                return None
            return self.parameters[argument] if argument in self.parameters else self.physical(argument)
        if function == "Fn::GetAtt":
            return self.physical(argument[0])
        if function == "Fn::If":
            condition, when_true, when_false = argument
            return self.resolve(when_true if self.conditions[condition] else when_false)
        if function == "Fn::Sub":
            text, names = (argument, {}) if isinstance(argument, str) else (argument[0], self.resolve(argument[1]))

            def substitute(match):
                name = match.group(1)
                if name.startswith("!"):  # ${!Literal} is the literal ${Literal} (an IAM policy variable)
                    return "${" + name[1:] + "}"
                if name in names:
                    return names[name]
                if "." in name:
                    return self.physical(name.split(".")[0])
                return self.parameters[name] if name in self.parameters else self.physical(name)

            return re.sub(r"\$\{([^}]+)\}", substitute, text)
        raise AssertionError(f"the template uses {function}: teach the resolver")


class PlatformResolver(Resolver):
    """The platform stack's: its clusters and roles by name, the data stack's exports by value."""

    def __init__(self, template: dict, parameters: dict, imports: dict[str, str]):
        self.template, self.parameters, self.imports, self.conditions = template, parameters, imports, {}

    def physical(self, name: str) -> str:
        kind = self.template["Resources"][name]["Type"]
        if kind == "AWS::Logs::LogGroup":
            return self._log_group_name(name)  # the platform template only refers to its name
        return {"AWS::ECS::Cluster": STACK, "AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{STACK}-dagster-{name}"}.get(kind, name)

    def resolve(self, value):
        if isinstance(value, dict) and set(value) == {"Fn::ImportValue"}:
            return self.imports[self.resolve(value["Fn::ImportValue"])]
        if value == {"Fn::GetAtt": ["Cluster", "Arn"]}:
            return f"arn:aws:ecs:{self.parameters['AWS::Region']}:{ACCOUNT}:cluster/{STACK}"
        return super().resolve(value)


ROLES = {
    "capture_lambda": ["CaptureFunctionRole"],
    "dagster_runs": ["DagsterRunRole", "DagsterEmrServerlessPolicy", "DagsterStreamCapturePolicy", "DagsterCaptureFailuresPolicy"],
    "spark_job": ["SparkJobRole"],
    DAGSTER_CLEANUP: ["DagsterCleanupRole"],
    PLATFORM: ["PlatformRole"],
}
# The platform stack's parameters, and the data stack's exports it imports, in one deployment.
PLATFORM_PARAMETERS = {"DataStackName": STACK, "RunFamilyPrefix": "ddb_athena"}


def platform_imports(bucket: str, region: str) -> dict[str, str]:
    return {
        f"{STACK}-BucketName": bucket,
        f"{STACK}-DagsterRunRoleArn": f"arn:aws:iam::{ACCOUNT}:role/{STACK}-DagsterRunRole",
        f"{STACK}-DagsterRunRoleName": f"{STACK}-DagsterRunRole",
        f"{STACK}-CodeBucketName": "code-bucket",
        f"{STACK}-DagsterCleanupRoleArn": f"arn:aws:iam::{ACCOUNT}:role/{STACK}-DagsterCleanupRole",
        f"{STACK}-DagsterCleanupRoleName": f"{STACK}-DagsterCleanupRole",
        f"{STACK}-AlertTopicArn": f"arn:aws:sns:{region}:{ACCOUNT}:{STACK}-AlertTopic",
    }


@cache
def statements(deployment: Deployment, principal: str, bucket: str) -> tuple[dict, ...]:
    if principal == PLATFORM:
        template = load_template(PLATFORM_TEMPLATE)
        parameters = {**deployment.parameters(bucket), **PLATFORM_PARAMETERS}
        resolver = PlatformResolver(template, parameters, platform_imports(bucket, deployment.region))
    else:
        template = load_template()
        resolver = Resolver(template, deployment.parameters(bucket))
    found = []
    for name in ROLES[principal]:
        resource = template["Resources"][name]
        if "Condition" in resource and not resolver.conditions[resource["Condition"]]:
            continue
        properties = resolver.resolve(resource["Properties"])
        documents = [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
        if resource["Type"] == "AWS::IAM::ManagedPolicy":
            documents.append(properties["PolicyDocument"])
        for document in documents:
            found += document["Statement"]
    return tuple(found)


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def granted_actions(deployment: Deployment, principal: str) -> set[str]:
    return {action for statement in statements(deployment, principal, "bucket") for action in as_list(statement["Action"])}


def _conditions_hold(statement: dict, call: AwsCall) -> bool:
    for operator, tests in statement.get("Condition", {}).items():
        for key, patterns in tests.items():
            if (operator, key) == ("StringLike", "s3:prefix"):
                holds = any(fnmatchcase(call.param("Prefix", ""), pattern) for pattern in as_list(patterns))
            elif (operator, key) == ("StringEquals", "iam:PassedToService"):
                # The service the call passes the role to (a task definition's roles: ECS's tasks).
                holds = {"ecs": "ecs-tasks.amazonaws.com"}.get(call.service, f"{call.service}.amazonaws.com") in as_list(patterns)
            else:
                raise AssertionError(f"condition {operator} {key}: teach the evaluator")
            if not holds:
                return False
    return True


def allows(deployment: Deployment, principal: str, call: AwsCall) -> bool:
    """Whether the role allows every IAM action of the call on every resource it names."""
    bucket = call.param("Bucket") or call.param("S3Bucket") or "bucket"
    role_statements = statements(deployment, principal, bucket)
    for action, resources in iam_requests(call):
        for resource in resources:
            if not any(
                statement["Effect"] == "Allow"
                and action in as_list(statement["Action"])
                and any(fnmatchcase(resource, pattern) for pattern in as_list(statement["Resource"]))
                and _conditions_hold(statement, call)
                for statement in role_statements
            ):
                return False
    return True

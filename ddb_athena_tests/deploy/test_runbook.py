"""The runbook's commands, as an operator copies them from docs/operations.md and the README, agree with the
templates they deploy: every parameter they pass exists, a stack's first deploy passes every parameter that has no
default, and the code they upload lands where the template reads it."""

import re

import pytest

from ddb_athena.lib.settings import REPO_ROOT
from ddb_athena_tests.deploy.policies import load_template, rendered

DOCUMENTS = [REPO_ROOT / "docs" / "operations.md", REPO_ROOT / "README.md"]


def shell_commands(markdown: str) -> list[str]:
    """The commands of a document's bash blocks, comments dropped and continued lines joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        lines = [re.sub(r"\s#.*$|^\s*#.*$", "", line) for line in block.splitlines()]
        commands += [" ".join(command.split()) for command in "\n".join(lines).replace("\\\n", " ").splitlines() if command.strip()]
    return commands


def deploys(markdown: str) -> list[tuple[str, dict[str, str]]]:
    """Each `aws cloudformation deploy`: the template it names and the parameters it passes."""
    found = []
    for command in shell_commands(markdown):
        if command.startswith("aws cloudformation deploy"):
            template = re.search(r"--template-file build/deploy/(\S+)", command).group(1)
            overrides = command.partition("--parameter-overrides")[2]
            found.append((template, dict(re.findall(r"(?:^|\s)([A-Z]\w*)=(\S+)", overrides))))
    return found


def required(template: dict) -> set[str]:
    return {name for name, parameter in template["Parameters"].items() if "Default" not in parameter}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_each_deploy_passes_only_parameters_its_template_has_and_a_first_deploy_every_required_one(document):
    seen = set()
    commands = deploys(document.read_text())
    assert commands, f"{document.name} deploys nothing"
    for template_name, parameters in commands:
        template = load_template(rendered(template_name))
        assert set(parameters) <= set(template["Parameters"]), (template_name, set(parameters) - set(template["Parameters"]))
        if template_name not in seen:  # later deploys of an existing stack keep the values they do not pass
            assert required(template) <= set(parameters), (template_name, required(template) - set(parameters))
            seen.add(template_name)


def test_the_capture_lambda_is_uploaded_where_the_data_stack_reads_it():
    default_key = load_template(rendered("ddb_athena.yaml"))["Parameters"]["CaptureCodeKey"]["Default"]
    uploads = [command for command in shell_commands(DOCUMENTS[0].read_text()) if command.startswith("aws s3 cp") and "capture-lambda.zip" in command]
    assert uploads
    for command in uploads:
        assert re.search(r"s3://<code-bucket>/(\S+)", command).group(1) == default_key


def test_the_spark_jobs_code_is_uploaded_where_its_roles_read_it():
    template = load_template(rendered("ddb_athena.yaml"))
    code_reads = [
        statement["Resource"]["Fn::Sub"]
        for role in ("SparkJobRole",)
        for policy in template["Resources"][role]["Properties"]["Policies"]
        for statement in policy["PolicyDocument"]["Statement"]
        if statement["Sid"] == "ReadCode"
    ]
    (uploaded,) = [command for command in shell_commands(DOCUMENTS[0].read_text()) if command.startswith("aws s3 cp .ddb_athena/dist/emr/")]
    prefix = re.search(r"s3://<code-bucket>/(\S+)", uploaded).group(1)
    assert code_reads == ["arn:${AWS::Partition}:s3:::${CaptureCodeBucket}/" + prefix + "*"]


def test_the_parsing_sees_a_wrong_key_and_a_missing_parameter():
    wrong = "```bash\naws s3 cp x/capture-lambda.zip s3://<code-bucket>/ddb_athena/capture-lambda.zip\n```"
    assert shell_commands(wrong) == ["aws s3 cp x/capture-lambda.zip s3://<code-bucket>/ddb_athena/capture-lambda.zip"]
    deploy = "aws cloudformation deploy --stack-name s --template-file build/deploy/dagster_ecs.yaml"
    missing = f"```bash\n{deploy} \\\n    --parameter-overrides DataStackName=d  # ImageUri=x\n```"
    ((template, parameters),) = deploys(missing)
    assert parameters == {"DataStackName": "d"}
    assert "ImageUri" in required(load_template(rendered(template))) - set(parameters)

"""The scanners an auditor runs, run by the suite (issue 69): checkov on the stacks rendered for the demo's tables and
for more, and on the Dockerfile. A finding fails the suite unless the resource it names suppresses that check inline
with its reason (`# checkov:skip=CKV_...:<why>`, next to the resource); `make install` puts checkov in a virtualenv of
its own (.ddb_athena/tools/checkov)."""

import json
import platform
import re
import subprocess

import pytest

from ddb_athena.lib.declarations import declared_tables, parse_declarations
from ddb_athena.lib.settings import REPO_ROOT
from ddb_athena_tests.deploy.policies import load_template, rendered
from ddb_athena_tests.deploy.test_template import THIRD_TABLE

CHECKOV = REPO_ROOT / ".ddb_athena" / "tools" / "checkov" / "bin" / "checkov"
SKIP = re.compile(r"#\s*checkov:skip=(CKV\w+):(.*)")


def checkov(path, framework: str) -> list[dict]:
    """checkov's reports on `path` (a file), offline (no download of its guidelines)."""
    assert CHECKOV.exists(), f"{CHECKOV} is missing: `make install` puts it there"
    command = [str(CHECKOV), "-f", str(path), "--framework", framework, "--output", "json", "--skip-download"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: something failed
    reports = json.loads(done.stdout)
    return reports if isinstance(reports, list) else [reports]


def findings(reports: list[dict]) -> tuple[list[str], list[dict]]:
    failed = [f"{check['check_id']} {check['resource']}" for report in reports for check in report["results"]["failed_checks"]]
    skipped = [check for report in reports for check in report["results"]["skipped_checks"]]
    return failed, skipped


def assert_clean_with_reasons(path, framework: str) -> int:
    failed, skipped = findings(checkov(path, framework))
    assert failed == [], failed
    unexplained = [check["check_id"] for check in skipped if len(check["check_result"].get("suppress_comment", "").strip()) <= 20]
    assert unexplained == [], unexplained
    return len(skipped)


@pytest.mark.subprocess
@pytest.mark.parametrize("extra", ["", THIRD_TABLE], ids=["declared", "with-two-more"])
@pytest.mark.parametrize("name", ["ddb_athena.yaml", "dagster_ecs.yaml"])
def test_checkov_finds_nothing_in_the_stacks_but_what_is_suppressed_with_its_reason(name, extra):
    tables = [*declared_tables().values(), *(parse_declarations(extra).values() if extra else [])]
    assert_clean_with_reasons(rendered(name, tables), "cloudformation")


@pytest.mark.subprocess
def test_checkov_finds_nothing_in_the_dockerfile_but_what_is_suppressed_with_its_reason():
    assert assert_clean_with_reasons(REPO_ROOT / "deploy" / "Dockerfile", "dockerfile") >= 1


@pytest.mark.subprocess
def test_a_suppression_removed_is_a_finding(tmp_path):
    """The scan runs and finds: the data stack without its suppressions fails on each of them."""
    text = rendered("ddb_athena.yaml").read_text()
    suppressed = {match.group(1) for match in SKIP.finditer(text)}
    bare = tmp_path / "ddb_athena.yaml"
    bare.write_text(SKIP.sub("# (suppression removed)", text))
    failed, _ = findings(checkov(bare, "cloudformation"))
    assert suppressed and suppressed <= {finding.split()[0] for finding in failed}


GUARD_PACKAGE = REPO_ROOT / ".ddb_athena" / "tools" / "cfn-guard" / "node_modules" / "@cdklabs" / "cdk-validator-cfnguard"
GUARD_RULES = GUARD_PACKAGE / "rules" / "control-tower" / "cfn-guard"
# Control Tower's rules read no suppression: a resource names the ones it does not meet, each with its reason, in its
# Metadata (`cfn-guard: {suppressed: {<rule>: <why>}}`).
GUARD_METADATA = "cfn-guard"


def guard_failures(path) -> set[tuple[str, str]]:
    """(rule, resource) for each Control Tower rule a resource of the template at `path` does not meet."""
    binary = GUARD_PACKAGE / "bin" / "ubuntu" / platform.machine() / "cfn-guard"
    assert binary.exists(), f"{binary} is missing: `make install` puts it there"
    command = [str(binary), "validate", "--data", str(path), "--rules", str(GUARD_RULES), "--output-format", "json", "--show-summary", "none"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 19), done.stderr[-2000:]  # 19: something failed
    decoder, text, position, failures = json.JSONDecoder(), done.stdout, 0, set()
    while position < len(text.rstrip()):
        report, position = decoder.raw_decode(text, position)
        position += len(text[position:]) - len(text[position:].lstrip())
        for failed in report["not_compliant"]:
            rule = failed["Rule"]["name"]
            failures |= {(rule, resource) for resource in re.findall(r"/Resources/([A-Za-z0-9]+)", json.dumps(failed))}
    return failures


def suppressed(template: dict) -> dict[tuple[str, str], str]:
    return {
        (rule, name): reason
        for name, resource in template["Resources"].items()
        for rule, reason in resource.get("Metadata", {}).get(GUARD_METADATA, {}).get("suppressed", {}).items()
    }


@pytest.mark.subprocess
@pytest.mark.parametrize("extra", ["", THIRD_TABLE], ids=["declared", "with-two-more"])
@pytest.mark.parametrize("name", ["ddb_athena.yaml", "dagster_ecs.yaml"])
def test_control_towers_guard_rules_find_nothing_but_what_each_resource_suppresses_with_its_reason(name, extra):
    tables = [*declared_tables().values(), *(parse_declarations(extra).values() if extra else [])]
    path = rendered(name, tables)
    failures, suppressions = guard_failures(path), suppressed(load_template(path))
    assert failures - set(suppressions) == set(), sorted(failures - set(suppressions))
    assert set(suppressions) - failures == set(), f"suppressed, yet met: {sorted(set(suppressions) - failures)}"
    assert all(len(reason) > 20 for reason in suppressions.values())


@pytest.mark.subprocess
def test_the_guard_rules_run_and_find_what_is_suppressed(tmp_path):
    """The rules run and find: each suppression names a rule its resource fails, seen on the data stack without them."""
    path = rendered("ddb_athena.yaml")
    suppressions = suppressed(load_template(path))
    assert suppressions and set(suppressions) <= guard_failures(path)

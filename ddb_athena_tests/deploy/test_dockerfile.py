"""deploy/Dockerfile and its build context, checked without Docker (`make test-image` builds and runs the image)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"


@pytest.mark.subprocess
def test_the_dockerfile_is_hadolint_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_build_context_holds_every_path_the_dockerfile_copies_and_not_the_checkouts_state():
    copied = [path for line in DOCKERFILE.read_text().splitlines() if line.startswith("COPY ") and "--from=" not in line for path in line.split()[1:-1]]
    assert copied
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    assert "*" in ignore
    assert set(copied) <= allowed, set(copied) - allowed
    assert not allowed & {".venv", ".ddb_athena", ".git", "spark-warehouse"}


def test_the_base_image_is_an_argument_and_the_image_runs_as_a_numeric_user():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=\S+", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.MULTILINE)
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"


def test_every_python_distribution_the_image_installs_is_checked_against_its_locked_hash():
    """Issue 69: only the project itself (no dependency: --no-deps) is installed from outside the locks, and nothing is
    built in an isolated environment whose tools pip would fetch unchecked."""
    installs = re.findall(r"pip install ([^&\\]+)", DOCKERFILE.read_text())
    assert installs and all("--no-deps" in install for install in installs)
    assert [install for install in installs if "--require-hashes" not in install] == ["--quiet --no-deps --no-build-isolation -e . "]
    assert all("--no-build-isolation" in install for install in installs if "requirements.lock" in install and "build-requirements" not in install)


def test_the_deployment_keeps_the_same_pools_as_make_dev():
    deployed = yaml.safe_load((REPO_ROOT / "deploy" / "dagster.yaml").read_text())
    local = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    assert deployed["concurrency"] == local["concurrency"]
    assert deployed["run_monitoring"]["free_slots_after_run_end_seconds"] == local["run_monitoring"]["free_slots_after_run_end_seconds"]


def test_the_image_bakes_the_aws_profiles_jars_each_from_the_lock_at_the_versions_maven_would_resolve():
    from ddb_athena.lake.local_jars import IMAGE_JAR_NAMES
    from ddb_athena.lake.session_config import RUN_WORKER_AWS_PACKAGES
    from ddb_athena_build.pinned import MAVEN_CENTRAL, pinned_artifacts

    (command,) = [line for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines() if "ddb_athena_build.pinned --into /opt/ddb_athena/jars" in line]
    baked = [word for word in command.split("ddb_athena_build.pinned --into /opt/ddb_athena/jars")[1].split("&&")[0].split() if word.endswith(".jar")]
    assert baked == list(IMAGE_JAR_NAMES)
    lock = pinned_artifacts()
    for name in IMAGE_JAR_NAMES:
        group, artifact, version = lock[name].url.removeprefix(MAVEN_CENTRAL).rsplit("/", 3)[0], *lock[name].url.rsplit("/", 3)[1:3]
        assert name == f"{artifact}-{version}.jar"
        coordinate = f"{group.replace('/', '.')}:{artifact}:{version}"
        # What Maven resolves for a run worker without the image: the same artifacts (the SDK bundle is hadoop-aws's).
        assert coordinate in RUN_WORKER_AWS_PACKAGES or artifact == "aws-java-sdk-bundle", coordinate

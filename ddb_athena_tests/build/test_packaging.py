"""`make lambda`: the deployment zip, unpacked into a clean directory, handles a real stream event against the emulator.
`make emr-job`: the orders load job's entry point and archive, which carries everything it imports but PySpark."""

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena_build.packaging import CAPTURE_LAMBDA, JOB_ARCHIVE_NAME, SOURCE_ROOT, PackagingError, build_emr_job, build_zip, package_files
from ddb_athena_tests.streamed.capture.test_lambda_handler import EVENT, unreadable

# Each test starts a process of its own (out of `make test-fast`).
pytestmark = pytest.mark.subprocess

# Runs in the unpacked zip's directory, as the Lambda runtime would: the handler and nothing from this checkout.
RUN_HANDLER = """
import json, sys
import ddb_athena.streamed.capture.lambda_handler as module
assert module.__file__.startswith(sys.argv[1]), module.__file__
print(json.dumps(module.handler(json.load(sys.stdin), None)))
"""


def run_unpacked(directory, event: dict, settings, bucket: str) -> dict:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(directory),
        "DDB_ATHENA_BUCKET": bucket,
        "AWS_ENDPOINT_URL": settings.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": settings.region,
    }
    result = subprocess.run(
        [sys.executable, "-c", RUN_HANDLER, str(directory)], input=json.dumps(event), env=env, cwd=directory, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    archive = tmp_path_factory.mktemp("dist") / "capture-lambda.zip"
    entries = build_zip(archive)
    directory = tmp_path_factory.mktemp("lambda-task-root")
    with zipfile.ZipFile(archive) as opened:
        assert opened.namelist() == entries
        opened.extractall(directory)
    return directory


def test_the_zip_holds_the_handler_and_only_what_it_imports(unpacked):
    files = sorted(str(path.relative_to(unpacked)) for path in unpacked.rglob("*.py"))
    assert "ddb_athena/streamed/capture/lambda_handler.py" in files
    # Nothing of Spark, Dagster, the assets or the stream reader: the handler does not import them.
    assert not any(part in name for name in files for part in ("spark", "assets", "stream_reader", "definitions"))
    # The declarations it finds the stream's table in (ddb_athena/tables.toml) go with it.
    assert (unpacked / "ddb_athena" / "tables.toml").read_bytes() == (SOURCE_ROOT / "ddb_athena" / "tables.toml").read_bytes()


def test_the_unpacked_handler_writes_a_stream_batch_as_one_change_file(unpacked, settings):
    response = run_unpacked(unpacked, EVENT, settings, settings.bucket)
    assert response["batchItemFailures"] == []
    s3 = settings.client("s3")
    assert list_change_files(s3, SourceLayout(settings.bucket, "books_source")) == [response["changeFile"]]
    lines = s3.get_object(Bucket=settings.bucket, Key=response["changeFile"])["Body"].read().decode().splitlines()
    assert [json.loads(line)["sequence_number"] for line in lines] == ["111", "222", "333"]


def test_the_unpacked_handler_reports_failures_for_retry(unpacked, settings):
    first, _, last = EVENT["Records"]
    bad = run_unpacked(unpacked, {"Records": [first, unreadable("150"), last]}, settings, settings.bucket)
    assert bad["batchItemFailures"] == [{"itemIdentifier": "150"}] and bad["changeFile"]
    unwritable = run_unpacked(unpacked, EVENT, settings, "no-such-bucket")
    assert unwritable == {"batchItemFailures": [{"itemIdentifier": "111"}], "changeFile": None}


def test_a_handler_importing_what_lambda_lacks_is_refused():
    with pytest.raises(PackagingError, match="pyspark"):
        package_files(replace(CAPTURE_LAMBDA, module="ddb_athena.lake.change_merge"))


# Imports the entry point from the archive alone (put first on the path, as --py-files puts it on EMR).
IMPORT_FROM_ARCHIVE = """
import sys
sys.path.insert(0, sys.argv[1])
import dagster_pipes, ddb_athena.exported.orders_load_job as job
print(job.__file__, dagster_pipes.__file__, "dagster" in sys.modules, "boto3" in sys.modules)
"""


def test_the_emr_job_archive_holds_what_its_entry_point_imports_and_nothing_of_dagster(tmp_path):
    entry_point, archive = build_emr_job(tmp_path)
    assert (entry_point.name, archive.name) == ("orders_load_job.py", JOB_ARCHIVE_NAME)
    assert entry_point.read_text().startswith('"""The orders load as a Spark job')
    names = zipfile.ZipFile(archive).namelist()
    assert "dagster_pipes/__init__.py" in names and "ddb_athena/exported/partition_load.py" in names
    assert not [name for name in names if name.startswith("dagster/") or "assets" in name or "resources" in name]
    imported = subprocess.run([sys.executable, "-I", "-c", IMPORT_FROM_ARCHIVE, str(archive)], capture_output=True, text=True, check=True)
    job_file, pipes_file, dagster_loaded, boto3_loaded = imported.stdout.split()
    assert job_file.startswith(str(archive)) and pipes_file.startswith(str(archive))
    assert (dagster_loaded, boto3_loaded) == ("False", "False")

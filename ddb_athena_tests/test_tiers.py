"""The tier guard (conftest.py): a test that starts a process or a SparkSession without its marker fails, so that
`make test-fast` never runs one unawares; with the marker it passes. And the stack tests' group: on `make test`'s
workers, the tests of one `xdist_group` run on one worker (they share one stack); and a test using `spark`, marked `jvm`
by conftest.py, is left out by the marker expression of `make test-fast`."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import subprocess

import pytest
from pyspark.sql import SparkSession


def test_starts_a_process_unmarked():
    subprocess.run(["true"], check=True)


@pytest.mark.subprocess
def test_starts_a_process_marked():
    subprocess.run(["true"], check=True)


def test_catches_the_guard_and_goes_on():
    try:
        subprocess.run(["true"], check=True)
    except AssertionError:
        pass


def test_builds_a_session_unmarked():
    SparkSession.builder.master("local[1]").getOrCreate()


def test_needs_nothing():
    assert True
"""


def _run_with_the_suites_hooks(pytester, monkeypatch, tests: str, *args: str):
    """`tests` as test_cases.py, run by pytest in a process of its own with this suite's conftest.py."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))
    pytester.makeconftest("from ddb_athena_tests.conftest import *  # noqa: F403  the suite's own hooks\n")
    pytester.makepyfile(test_cases=tests)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


@pytest.mark.subprocess
def test_a_process_or_session_without_its_marker_fails_the_test_and_with_it_passes(pytester, monkeypatch):
    result = _run_with_the_suites_hooks(pytester, monkeypatch, TESTS, "-rA", "-W", "ignore::pytest.PytestUnknownMarkWarning")
    outcomes = {line.split()[1].split("::")[1]: line.split()[0] for line in result.outlines if line.startswith(("PASSED ", "FAILED "))}
    assert outcomes == {
        "test_starts_a_process_unmarked": "FAILED",
        "test_starts_a_process_marked": "PASSED",
        # The code under test caught the guard's error: the test fails all the same.
        "test_catches_the_guard_and_goes_on": "FAILED",
        "test_builds_a_session_unmarked": "FAILED",
        "test_needs_nothing": "PASSED",
    }, result.outlines
    result.stdout.fnmatch_lines(["*UnmarkedProcess*test_starts_a_process_unmarked starts a process (true): mark it `subprocess`*"])
    result.stdout.fnmatch_lines(["*UnmarkedProcess*test_builds_a_session_unmarked uses a SparkSession: mark it `jvm`*"])


GROUPED = """
import os

import pytest


@pytest.mark.xdist_group("stack")
@pytest.mark.parametrize("case", range(4))
def test_grouped(case):
    print("WORKER", os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("case", range(4))
def test_free(case):
    pass
"""


@pytest.mark.subprocess
def test_the_tests_of_one_group_run_on_one_worker(pytester, monkeypatch):
    result = _run_with_the_suites_hooks(pytester, monkeypatch, GROUPED, "-n", "2", "--dist", "loadgroup", "-rP")
    result.assert_outcomes(passed=8)
    workers = {line.split()[1] for line in result.outlines if line.startswith("WORKER ")}
    assert len(workers) == 1, result.outlines


USES_SPARK = """
import pytest


@pytest.fixture
def spark():
    return "a session"


def test_uses_spark(spark):
    pass


def test_needs_nothing():
    pass
"""


@pytest.mark.subprocess
def test_a_test_using_spark_is_left_out_of_the_fast_tier(pytester, monkeypatch):
    result = _run_with_the_suites_hooks(pytester, monkeypatch, USES_SPARK, "-m", "not jvm", "-rA")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["PASSED test_cases.py::test_needs_nothing"])

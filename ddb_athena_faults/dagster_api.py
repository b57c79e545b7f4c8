"""What the nemesis and the report ask Dagster: GraphQL as the UI sends it (launch, terminate, re-execute), and the
instance's run records (the sync run's worker process, runs' failures, check results)."""

import contextlib
import json
import signal
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from ddb_athena.streamed.handover import STOP_TIMEOUT_SECONDS, SYNC_JOB_NAME

LOCATION = "ddb_athena.definitions"
ASSET_JOB = "__ASSET_JOB"

_LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on InvalidSubsetError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
_TERMINATE = """mutation($runId: String!) { terminateRun(runId: $runId) {
  __typename ... on TerminateRunFailure { message } ... on PythonError { message } } }"""
_REEXECUTE = """mutation($runId: String!) { launchRunReexecution(reexecutionParams: {parentRunId: $runId, strategy: ALL_STEPS}) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


class GraphQLError(RuntimeError):
    """The webserver refused or failed a mutation."""


@dataclass(frozen=True)
class Webserver:
    url: str

    def _call(self, query: str, variables: dict) -> dict:
        request = urllib.request.Request(
            f"{self.url}/graphql", data=json.dumps({"query": query, "variables": variables}).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        if answer.get("errors"):
            raise GraphQLError(str(answer["errors"]))
        return answer["data"]

    def wait_until_serving(self, timeout_seconds: float) -> None:
        """Until the webserver answers: `dagster dev` has then created a fresh DAGSTER_HOME's storage, which another
        process opening the instance at the same moment would try to create too (`alembic_version already exists`)."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                self._call("{ version }", {})
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Dagster at {self.url} did not answer within {timeout_seconds:g} s") from None
                time.sleep(2)

    def launch(self, job: str, assets: list[str] | None = None) -> str:
        selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "jobName": job}
        if assets:
            selector["assetSelection"] = [{"path": [asset]} for asset in assets]
        result = self._call(_LAUNCH, {"params": {"selector": selector, "runConfigData": {}}})["launchRun"]
        if result["__typename"] != "LaunchRunSuccess":
            raise GraphQLError(f"launching {job}: {result}")
        return result["run"]["runId"]

    def terminate(self, run_id: str) -> None:
        result = self._call(_TERMINATE, {"runId": run_id})["terminateRun"]
        if result["__typename"] != "TerminateRunSuccess":
            raise GraphQLError(f"terminating {run_id}: {result}")

    def reexecute(self, run_id: str) -> str:
        result = self._call(_REEXECUTE, {"runId": run_id})["launchRunReexecution"]
        if result["__typename"] != "LaunchRunSuccess":
            raise GraphQLError(f"re-executing {run_id}: {result}")
        return result["run"]["runId"]


def worker_pid(instance: DagsterInstance, run_id: str) -> int | None:
    """The run worker's process: RUN_START is logged by the worker itself."""
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_START, limit=1).records
    event = records[0].event_log_entry.dagster_event if records else None
    return event.pid if event is not None else None


def running_sync(instance: DagsterInstance) -> tuple[DagsterRun, int] | None:
    """The newest started sync run whose worker is alive, with the worker's pid."""
    for run in instance.get_runs(filters=RunsFilter(job_name=SYNC_JOB_NAME, statuses=[DagsterRunStatus.STARTED]), limit=5):
        pid = worker_pid(instance, run.run_id)
        if pid is not None and process_alive(pid):
            return run, pid
    return None


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and everything below it (the step process, its JVM): a task, as ECS stops it."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@dataclass(frozen=True)
class EcsStop:
    """What ECS stopping a task did: whether the task's command (the run worker) ended within the grace, and the
    processes still running at its end, killed (the container's end takes every process in it: a JVM still shutting
    down after the worker ended, for one)."""

    worker_ended: bool
    killed: tuple[str, ...]


def stop_as_ecs_does(pid: int, grace_seconds: float = STOP_TIMEOUT_SECONDS) -> EcsStop:
    """ECS stopping a task (a Fargate Spot interruption): SIGTERM to the run worker, the task's command (tini passes it
    to that process alone), then SIGKILL to whatever of its tree is left after the grace."""
    tree = process_tree(pid)
    if not tree:
        return EcsStop(worker_ended=True, killed=())
    with contextlib.suppress(psutil.NoSuchProcess):
        tree[0].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(1)
    worker_ended = not process_alive(pid)
    killed = []
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process_alive(process.pid):
                killed.append(f"{process.pid} {process.name()}")
                process.kill()
    return EcsStop(worker_ended, tuple(killed))


def end_runs_whose_worker_died(instance: DagsterInstance) -> list[str]:
    """Marks the started runs whose worker process is gone as failed, as run monitoring does on ECS (its run launcher
    checks the task): the default run launcher cannot, so a killed sync run would hold the schedule for its max
    runtime. Returns their ids."""
    ended = []
    for run in instance.get_runs(filters=RunsFilter(statuses=[DagsterRunStatus.STARTED])):
        pid = worker_pid(instance, run.run_id)
        if pid is not None and not process_alive(pid):
            instance.report_run_failed(run, f"Run worker {pid} is gone (the fault harness's worker check, standing in for run monitoring on ECS)")
            ended.append(run.run_id)
    return ended


@dataclass(frozen=True)
class RunFailure:
    run_id: str
    job: str
    message: str


def run_failures(dagster_home: Path) -> list[RunFailure]:
    """Every failed run and the error its failure events name."""
    failures = []
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        for run in instance.get_runs(filters=RunsFilter(statuses=[DagsterRunStatus.FAILURE])):
            messages = []
            for record in instance.all_logs(run.run_id, of_type={DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE}):
                event = record.dagster_event
                error = getattr(event.event_specific_data, "error", None) if event else None
                messages.append(f"{error.cls_name}: {error.message.strip()}" if error else record.message)
            failures.append(RunFailure(run.run_id, run.job_name, " | ".join(messages)))
    return failures


def check_evaluations(dagster_home: Path, run_id: str) -> dict[str, bool]:
    """The asset checks a run evaluated: passed or not, by check name."""
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        records = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        return {record.dagster_event.event_specific_data.check_name: record.dagster_event.event_specific_data.passed for record in records}


def run_status(dagster_home: Path, run_id: str) -> DagsterRunStatus | None:
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        run = instance.get_run_by_id(run_id)
        return run.status if run else None

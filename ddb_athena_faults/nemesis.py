"""The nemesis: faults at random (seeded), each in a thread of its own, so that they overlap.

- sigkill: SIGKILL of the running sync run's worker and everything below it (its step process, its JVM): a task gone.
- sigstop: SIGSTOP of that process tree for longer than the writer lease, then SIGCONT: a paused VM, a long GC.
- sigterm: ECS stopping the sync's task (a Spot interruption): SIGTERM to the worker, SIGKILL of what is left 120 s later.
- terminate / reexecute: Terminate of the running sync run, Re-execute of a finished one, through GraphQL as the UI does.
- materialize / bootstrap: a one-cycle Materialize of a streamed table, or its bootstrap job, beside the sync.
- endpoint_restart: the AWS endpoint the stack uses refuses connections for a while (its open ones cut). moto keeps its
  state in memory only, so the restart is of the fault proxy in front of it, not of moto.
- proxy faults: a window in which a share of S3 or DynamoDB requests is throttled, fails with a 500, or loses its
  response after taking effect.
- clock_skew: a writer whose clock is minutes off: a Materialize from the CLI under libfaketime (`faketime`), its
  Python and its JVM alike.
"""

import contextlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import psutil
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from ddb_athena.lib.settings import REPO_ROOT
from ddb_athena.streamed.handover import SYNC_JOB_NAME
from ddb_athena_faults.dagster_api import ASSET_JOB, Webserver, process_tree, running_sync, stop_as_ecs_does
from ddb_athena_faults.proxy import Fault, FaultPlan, FaultProxy

# A launched run that has not ended by then is left to the report (its status says what became of it).
RUN_WAIT_SECONDS = 900
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


class Kind(StrEnum):
    SIGKILL = "sigkill"
    SIGSTOP = "sigstop"
    SIGTERM = "sigterm"
    TERMINATE = "terminate"
    REEXECUTE = "reexecute"
    MATERIALIZE = "materialize"
    BOOTSTRAP = "bootstrap"
    ENDPOINT_RESTART = "endpoint_restart"
    PROXY_FAULTS = "proxy"
    CLOCK_SKEW = "clock_skew"


# How often each kind is picked, relative to the others.
WEIGHTS = {
    Kind.SIGKILL: 1.0,
    Kind.SIGSTOP: 1.0,
    Kind.SIGTERM: 0.7,
    Kind.TERMINATE: 0.7,
    Kind.REEXECUTE: 0.7,
    Kind.MATERIALIZE: 1.0,
    Kind.BOOTSTRAP: 0.5,
    Kind.ENDPOINT_RESTART: 1.0,
    Kind.PROXY_FAULTS: 3.0,
    Kind.CLOCK_SKEW: 0.5,
}


class NoTarget(Exception):
    """Nothing to inflict the fault on now (no sync run started): the nemesis picks again later."""


@dataclass
class FaultRecord:
    kind: str
    started: float
    ended: float | None = None
    target: str = ""
    detail: str = ""


@dataclass
class Stage:
    """What the faults act on."""

    dagster_home: Path
    webserver: Webserver
    proxy: FaultProxy
    plan: FaultPlan
    env: dict
    lease_seconds: float
    logs: Path
    streamed_tables: list[str]


@dataclass
class Nemesis:
    stage: Stage
    rng: random.Random
    mean_gap_seconds: float
    clock: Callable[[], float] = time.monotonic
    faults: list[FaultRecord] = field(default_factory=list)
    # The runs a fault made stale (paused past their lease, or with a skewed clock): fencing them is the design.
    stale_runs: set[str] = field(default_factory=set)
    launched_runs: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    bootstraps_allowed: bool = True
    _in_flight: set[str] = field(default_factory=set)
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run_for(self, seconds: float) -> None:
        """Starts faults for `seconds` (this thread), then waits for those in flight to end."""
        deadline = self.clock() + seconds
        while not self._stop.wait(min(self.rng.expovariate(1 / self.mean_gap_seconds), max(0.0, deadline - self.clock()))):
            if self.clock() >= deadline:
                break
            kinds = [kind for kind in WEIGHTS if kind not in self._in_flight and self._available(kind)]
            kind = self.rng.choices(kinds, weights=[WEIGHTS[kind] for kind in kinds])[0]
            # Each fault draws its own parameters now, from the nemesis's generator: a seed replays the same choices.
            action = getattr(self, f"_{kind.value}")(random.Random(self.rng.random()))
            with self._lock:
                self._in_flight.add(kind)
            thread = threading.Thread(target=self._inflict, args=(kind, action), name=f"fault-{kind}", daemon=True)
            self._threads.append(thread)
            thread.start()
        for thread in self._threads:
            thread.join()

    def _available(self, kind: Kind) -> bool:
        if kind == Kind.BOOTSTRAP:
            return self.bootstraps_allowed
        # Without libfaketime no writer's clock can be skewed here: that kind is left out (the report says so).
        return kind != Kind.CLOCK_SKEW or shutil.which("faketime") is not None

    def in_flight(self) -> bool:
        with self._lock:
            return bool(self._in_flight)

    def _inflict(self, kind: Kind, action: Callable[[FaultRecord], None]) -> None:
        record = FaultRecord(kind.value, self.clock())
        try:
            action(record)
            record.ended = record.ended or self.clock()
            with self._lock:
                self.faults.append(record)
        except NoTarget:
            pass
        except Exception as error:  # noqa: BLE001 - a fault that could not be inflicted is reported, not fatal
            with self._lock:
                self.errors.append(f"{kind}: {type(error).__name__}: {error}")
        finally:
            with self._lock:
                self._in_flight.discard(kind)

    def _sync_target(self) -> tuple[str, int]:
        with DagsterInstance.from_config(str(self.stage.dagster_home)) as instance:
            found = running_sync(instance)
        if found is None:
            raise NoTarget
        run, pid = found
        return run.run_id, pid

    def _sigkill(self, rng: random.Random):
        def act(record: FaultRecord) -> None:
            record.target, pid = self._sync_target()
            for process in process_tree(pid):
                _signal(process, signal.SIGKILL)

        return act

    def _sigstop(self, rng: random.Random):
        pause = self.stage.lease_seconds + rng.uniform(10, 40)

        def act(record: FaultRecord) -> None:
            record.target, pid = self._sync_target()
            self.stale_runs.add(record.target)
            stopped = process_tree(pid)
            for process in stopped:
                _signal(process, signal.SIGSTOP)
            time.sleep(pause)
            for process in stopped:
                _signal(process, signal.SIGCONT)
            record.detail = f"paused {pause:.0f} s (lease {self.stage.lease_seconds:g} s)"

        return act

    def _sigterm(self, rng: random.Random):
        def act(record: FaultRecord) -> None:
            record.target, pid = self._sync_target()
            stopped = stop_as_ecs_does(pid)
            record.detail = ("ended within the grace" if stopped.worker_ended else "the worker killed after the grace") + (
                f"; killed at its end: {', '.join(stopped.killed)}" if stopped.killed else ""
            )

        return act

    def _terminate(self, rng: random.Random):
        def act(record: FaultRecord) -> None:
            record.target, _ = self._sync_target()
            self.stage.webserver.terminate(record.target)

        return act

    def _reexecute(self, rng: random.Random):
        def act(record: FaultRecord) -> None:
            with DagsterInstance.from_config(str(self.stage.dagster_home)) as instance:
                finished = instance.get_runs(filters=RunsFilter(job_name=SYNC_JOB_NAME, statuses=list(FINISHED)), limit=1)
            if not finished:
                raise NoTarget
            record.target = self.stage.webserver.reexecute(finished[0].run_id)
            self.launched_runs[record.target] = "reexecute"
            record.detail = f"of {finished[0].run_id}"

        return act

    def _materialize(self, rng: random.Random):
        table = rng.choice(self.stage.streamed_tables)

        def act(record: FaultRecord) -> None:
            record.target = self.stage.webserver.launch(ASSET_JOB, [f"{table}_source", f"{table}_iceberg"])
            self.launched_runs[record.target] = "materialize"
            record.detail = f"{table}: {self._wait_for_run(record.target)}"

        return act

    def _bootstrap(self, rng: random.Random):
        table = rng.choice(self.stage.streamed_tables)

        def act(record: FaultRecord) -> None:
            record.target = self.stage.webserver.launch(f"{table}_bootstrap")
            self.launched_runs[record.target] = "bootstrap"
            record.detail = f"{table}: {self._wait_for_run(record.target)}"

        return act

    def _wait_for_run(self, run_id: str) -> str:
        deadline = time.monotonic() + RUN_WAIT_SECONDS
        while time.monotonic() < deadline:
            with DagsterInstance.from_config(str(self.stage.dagster_home)) as instance:
                status = instance.get_run_by_id(run_id).status
            if status in FINISHED:
                return status.value
            time.sleep(3)
        return "still running"

    def _endpoint_restart(self, rng: random.Random):
        down = rng.uniform(5, 30)

        def act(record: FaultRecord) -> None:
            self.stage.proxy.refuse(down)
            record.detail = f"refused connections for {down:.0f} s"

        return act

    def _proxy(self, rng: random.Random):
        fault = rng.choice(list(Fault))
        # Lost responses are the harshest (each is a retried request that already happened): a smaller share of them.
        share = rng.uniform(0.03, 0.1) if fault is Fault.LOST_RESPONSE else rng.uniform(0.1, 0.3)
        seconds = rng.uniform(20, 60)

        def act(record: FaultRecord) -> None:
            record.kind = f"proxy: {fault.value}"
            self.stage.plan.open_window(fault, share, seconds)
            time.sleep(seconds)
            record.detail = f"{share:.0%} of requests for {seconds:.0f} s"

        return act

    def _clock_skew(self, rng: random.Random):
        table = rng.choice(self.stage.streamed_tables)
        skew = rng.choice((-1, 1)) * round(rng.uniform(120, 600))

        def act(record: FaultRecord) -> None:
            faketime = shutil.which("faketime")
            if faketime is None:
                raise RuntimeError("faketime is not installed (Debian: apt-get install faketime): no writer can be skewed")
            before = self._asset_job_runs()
            log = self.stage.logs / f"clock-skew-{int(time.time())}.log"
            command = [faketime, "-f", f"{skew:+d}s", str(Path(sys.executable).parent / "dagster"), "asset", "materialize"]
            command += ["-m", "ddb_athena.definitions", "--select", f"{table}_source,{table}_iceberg"]
            with log.open("w") as output:
                finished = subprocess.run(command, env=self.stage.env, cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT, timeout=RUN_WAIT_SECONDS)
            skewed = self._asset_job_runs() - before - set(self.launched_runs)
            self.stale_runs.update(skewed)
            record.target = ",".join(sorted(skewed))
            record.detail = f"{table}, clock {skew:+d} s, exit {finished.returncode} (log {log.name})"

        return act

    def _asset_job_runs(self) -> set[str]:
        with DagsterInstance.from_config(str(self.stage.dagster_home)) as instance:
            return {run.run_id for run in instance.get_runs(filters=RunsFilter(job_name=ASSET_JOB))}


def _signal(process: psutil.Process, number: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):  # ended meanwhile
        process.send_signal(number)

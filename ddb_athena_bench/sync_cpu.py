"""Where a warm books sync cycle spends its CPU: the cycle code without Dagster (StreamSync and the per-cycle
checks), against the emulator and the simulator at 1 write/s, one cycle every `--interval` seconds after a
few warm-up cycles.

Prints, per minute, the CPU-seconds of this Python process and of its children (the JVM and Spark's Python
workers, these also on their own; the emulator and simulator excluded) and the JVM's loaded classes and JIT compilations; then the
JVM's CPU by thread kind (the JIT compilers, the py4j threads that plan queries, the task threads) and the
Spark jobs per cycle. `make bench-sync-cpu` (MINUTES=5 INTERVAL=10).
"""

import argparse
import collections
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from ddb_athena.lib.declarations import declared
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena.streamed.assets import stream_syncer, writer_branch_of
from ddb_athena.streamed.check_results import cycle_check_results
from ddb_athena.streamed.cycle import StreamSync
from ddb_athena_bench.freshness import OUT, local_stack

WARM_UP_CYCLES = 4
TABLE_CHECKS_EVERY = 6


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _children_cpu(me: psutil.Process, excluded: set[int]) -> float:
    total = 0.0
    for child in me.children(recursive=True):
        if child.pid not in excluded:
            try:
                total += _cpu(child)
            except psutil.NoSuchProcess:
                continue
    return total


def _jvm_threads(pid: int) -> dict[str, float]:
    """CPU seconds by thread kind (names with their numbers dropped), matched through jstack's native ids."""
    dump = subprocess.run(["jstack", str(pid)], capture_output=True, text=True).stdout
    names = {int(nid, 16): re.sub(r"\d+", "N", name) for name, nid in re.findall(r'^"([^"]+)".*? nid=(0x[0-9a-f]+)', dump, re.M)}
    kinds: dict[str, float] = collections.Counter()
    for thread in psutil.Process(pid).threads():
        kinds[names.get(thread.id, "other")] += thread.user_time + thread.system_time
    return kinds


def _jstat(option: str, pid: int) -> int:
    """The first column of `jstat -class` (classes loaded) or `jstat -compiler` (compilations)."""
    return int(subprocess.run(["jstat", option, str(pid)], capture_output=True, text=True).stdout.split("\n")[1].split()[0])


@contextmanager
def warm_sync(
    scratch: Path, interval: float, warm_up_cycles: int, rate: float = 1.0, warehouse_on_s3: bool = False
) -> Iterator[tuple[dict, StreamSync, set[int]]]:
    """The local stack without Dagster (the simulator at `rate` writes a second), and a books sync warmed up by a few
    cycles `interval` apart: the resources, the sync, and the pids whose CPU is not the cycle's (the emulator, the
    simulator)."""
    with local_stack(scratch, rate=rate, with_dagster=False, warehouse_on_s3=warehouse_on_s3) as (env, processes):
        resources = resources_from_settings(Settings.from_env(env))
        writer = writer_branch_of(resources["spark"], resources["sync"], "bench", 1, declared("books"))  # fenced, as a deployment's sync is
        syncer = stream_syncer(
            resources["aws"], resources["spark"], resources["sync"], declared("books"), log=lambda _: None, warn=print, before_write=lambda: None, writer=writer
        )
        for number in range(warm_up_cycles):
            syncer.cycle(f"warm-up-{number}")
            time.sleep(interval)
        excluded = {process.pid for process in processes.values()}
        excluded |= {child.pid for pid in list(excluded) for child in psutil.Process(pid).children(recursive=True)}
        yield resources, syncer, excluded


def run(minutes: float, interval: float) -> None:
    with warm_sync(OUT / "sync-cpu-stack", interval, WARM_UP_CYCLES) as (resources, syncer, excluded):
        aws, spark, sync = resources["aws"], resources["spark"], resources["sync"]
        me = psutil.Process()
        jvm = next(child.pid for child in me.children(recursive=True) if child.name() == "java")
        tracker = spark.spark_session.sparkContext.statusTracker()
        jobs_before = max(tracker.getJobIdsForGroup(None) or [0])
        threads_before = _jvm_threads(jvm)
        started = time.monotonic()
        python_before, children_before = _cpu(me), _children_cpu(me, excluded)
        workers_before = _children_cpu(me, excluded | {jvm})
        minute_start, minute_at, number = (python_before, children_before), started, 0
        while time.monotonic() - started < minutes * 60:
            number += 1
            cycle_started = time.monotonic()
            syncer.cycle(f"cycle-{number}")
            cycle_check_results(aws, spark, sync, declared("books"), number % TABLE_CHECKS_EVERY == 0, list_s3=number % TABLE_CHECKS_EVERY == 0)
            if time.monotonic() - minute_at >= 60:
                python, children, now = _cpu(me), _children_cpu(me, excluded), time.monotonic()
                per_minute = 60 / (now - minute_at)
                print(
                    f"minute {(now - started) / 60:.1f}: Python {(python - minute_start[0]) * per_minute:.1f}, JVM and Spark workers "
                    f"{(children - minute_start[1]) * per_minute:.1f} CPU-s per minute; JVM classes loaded {_jstat('-class', jvm)}, "
                    f"JIT compilations {_jstat('-compiler', jvm)}",
                    flush=True,
                )
                minute_start, minute_at = (python, children), now
            time.sleep(max(0.0, cycle_started + interval - time.monotonic()))
        elapsed = (time.monotonic() - started) / 60
        python, children = _cpu(me) - python_before, _children_cpu(me, excluded) - children_before
        workers = _children_cpu(me, excluded | {jvm}) - workers_before
        jobs = max(tracker.getJobIdsForGroup(None) or [0]) - jobs_before
        print(
            f"{number} cycles of {interval:g} s in {elapsed:.1f} minutes: Python {python / elapsed:.1f}, JVM and Spark workers "
            f"{children / elapsed:.1f} (of which Spark's Python workers {workers / elapsed:.1f}), together "
            f"{(python + children) / elapsed:.1f} CPU-s per minute; {jobs / number:.1f} Spark jobs per cycle"
        )
        used = {kind: seconds - threads_before.get(kind, 0.0) for kind, seconds in _jvm_threads(jvm).items()}
        print("JVM CPU by thread kind, CPU-s per minute:")
        for kind, seconds in sorted(used.items(), key=lambda item: -item[1])[:6]:
            print(f"  {seconds / elapsed:5.1f}  {kind}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds from one cycle's start to the next")
    arguments = parser.parse_args(argv)
    run(arguments.minutes, arguments.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a warm books sync cycle's CPU goes, by step, and an A/B of Spark runtime settings in one warm session.

The cycle code without Dagster (as `bench-sync-cpu`) against the emulator and the simulator at 1 write/s. Each
cycle's CPU (this process, the JVM and Spark's Python workers; the emulator and the simulator excluded) is
split by the Spark action or step it was spent in. With `--settings`, cycles alternate (A B B A ...) between the
session's own settings and these, so both see the same JVM, the same table and the same host drift: figures taken
minutes apart on this host differ by more than a change like that makes. `make bench-sync-phases`
(CYCLES=40 INTERVAL=5, SETTINGS='{"spark.sql.adaptive.enabled": "false"}').
"""

import argparse
import collections
import json
import statistics
import sys
import time
from collections.abc import Callable

import psutil
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.readwriter import DataFrameWriterV2

import ddb_athena.streamed.cycle as books_cycle
from ddb_athena.lake.plan_settings import session_settings
from ddb_athena_bench.freshness import OUT
from ddb_athena_bench.sync_cpu import _children_cpu, _cpu, warm_sync

WARM_UP_CYCLES = 6
STEPS_SHOWN = 6
# The cycle's own steps that call AWS (S3); their CPU is this process's.
AWS_STEPS = ("quarantine_foreign_files", "committed_files", "list_keys", "write_commit_manifest")


class StepMeter:
    """CPU-seconds by step, for the variant being measured; a step inside another counts in the outer one."""

    def __init__(self, cpu: Callable[[], float]):
        self.cpu, self.variant, self._inside = cpu, None, False
        self.spent: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.calls: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def wrap(self, owner, name: str, step: Callable[[tuple], str]) -> None:
        original = getattr(owner, name)

        def metered(*args, **kwargs):
            if self.variant is None or self._inside:
                return original(*args, **kwargs)
            self._inside, started = True, self.cpu()
            try:
                return original(*args, **kwargs)
            finally:
                label = step(args)
                self.spent[self.variant][label] += self.cpu() - started
                self.calls[self.variant][label] += 1
                self._inside = False

        setattr(owner, name, metered)


def _caller() -> str:
    """The function that called the metered one (frames: this, the label's lambda, `metered`, the caller)."""
    return sys._getframe(3).f_code.co_name


def run(cycles: int, interval: float, settings: dict[str, str]) -> None:
    variants = {"session's own": {}, **({json.dumps(settings): settings} if settings else {})}
    with warm_sync(OUT / "sync-phases-stack", interval, WARM_UP_CYCLES) as (resources, syncer, excluded):
        me = psutil.Process()
        meter = StepMeter(lambda: _cpu(me) + _children_cpu(me, excluded))
        meter.wrap(DataFrame, "collect", lambda _: f"collect in {_caller()}")
        meter.wrap(DataFrame, "localCheckpoint", lambda _: f"localCheckpoint in {_caller()}")
        meter.wrap(SparkSession, "sql", lambda args: "sql " + " ".join(args[1].split()[:2]))
        meter.wrap(DataFrameWriterV2, "append", lambda _: f"append in {_caller()}")
        for step in AWS_STEPS:
            meter.wrap(books_cycle, step, lambda _, step=step: step)
        meter.wrap(syncer._capture, "capture", lambda _: "stream capture")

        session = resources["spark"].spark_session
        names = list(variants)
        per_cycle: dict[str, list[float]] = {name: [] for name in names}
        for number in range(cycles):
            # A B B A: neither variant always runs first after the other.
            name = names[(number + number // 2) % len(names)]
            with session_settings(session, variants[name]):
                meter.variant, started, cpu_before = name, time.monotonic(), meter.cpu()
                syncer.cycle(f"cycle-{number}")
                per_cycle[name].append(meter.cpu() - cpu_before)
                meter.variant = None
            time.sleep(max(0.0, started + interval - time.monotonic()))

    for name in names:
        used, count = per_cycle[name], len(per_cycle[name])
        spread = statistics.stdev(used) / count**0.5 if count > 1 else float("nan")
        print(f"{name}: {count} cycles of {interval:g} s, {statistics.mean(used):.3f} ± {spread:.3f} CPU-s per cycle (mean ± standard error)")
        print("  CPU-s per cycle  calls per cycle  step")
        for step, seconds in meter.spent[name].most_common(STEPS_SHOWN):
            print(f"  {seconds / count:15.3f}  {meter.calls[name][step] / count:15.1f}  {step}")
        print(f"  {(sum(used) - sum(meter.spent[name].values())) / count:15.3f}  {'':15}  the rest (building plans, Python, JIT and GC between steps)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds from one cycle's start to the next")
    parser.add_argument("--settings", type=json.loads, default={}, help="JSON object of Spark runtime settings to compare with the session's own")
    arguments = parser.parse_args(argv)
    run(arguments.cycles, arguments.interval, arguments.settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

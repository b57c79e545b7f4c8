"""The project's code location with every run worker's start delayed (`make bench-freshness RUN_START_DELAY=90`): on
ECS a run is a task of its own, which takes 30-90 s to start before its process runs, and the books sync's hourly
successor pays that inside the handover. A run worker (locally a process the code server spawns) sleeps that long
before it loads the definitions; the webserver, the daemon and the code server load them at once.

The variable holds the seconds, or the path of a file that holds them, read as each run worker starts (a test delays
the runs after the first)."""

import multiprocessing
import os
import time
from pathlib import Path

DELAY_VARIABLE = "DDB_ATHENA_BENCH_RUN_START_DELAY"


def run_start_delay() -> float:
    value = os.environ.get(DELAY_VARIABLE, "0")
    return float(Path(value).read_text()) if os.path.isfile(value) else float(value)


if multiprocessing.parent_process() is not None:
    time.sleep(run_start_delay())

from ddb_athena.definitions import defs  # noqa: E402, F401 - the code location, loaded after the start's delay

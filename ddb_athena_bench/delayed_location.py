"""The project's code location with every run worker's start delayed (`make bench-freshness RUN_START_DELAY=90`): on
ECS a run is a task of its own, which takes 30-90 s to start before its process runs, and the books sync's hourly
successor pays that inside the handover. A run worker (locally a process the code server spawns) sleeps that long
before it loads the definitions; the webserver, the daemon and the code server load them at once."""

import multiprocessing
import os
import time

DELAY_VARIABLE = "DDB_ATHENA_BENCH_RUN_START_DELAY"

if multiprocessing.parent_process() is not None:
    time.sleep(float(os.environ.get(DELAY_VARIABLE, "0")))

from ddb_athena.definitions import defs  # noqa: E402, F401 - the code location, loaded after the start's delay

"""A load generator for the volume benchmark: `--processes` simulators (inserts, updates, deletes, re-inserts of
~1 KB books) writing `--rate` operations a second between them, until stopped. One boto3 client tops out below the
requirement's rate against the emulator, so the load is spread over processes.

    .venv/bin/python -m ddb_athena_bench.load --rate 250 --processes 4
"""

import argparse
import multiprocessing
import random
import signal
import sys

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lib.settings import Settings

# With the simulator's other attributes, a book of about 1 KB.
SUMMARY_BYTES = 700


def _simulate(rate: float, seed: int) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    settings = Settings.from_env()
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"], rng=random.Random(seed), summary_bytes=SUMMARY_BYTES)
    simulator.run(rate, duration=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, required=True, help="operations a second, all processes together")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    processes = max(1, min(args.processes, int(args.rate) or 1))
    workers = [multiprocessing.Process(target=_simulate, args=(args.rate / processes, args.seed * 1000 + number), daemon=True) for number in range(processes)]
    for worker in workers:
        worker.start()

    def stop(*_):
        for worker in workers:
            worker.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for worker in workers:
        worker.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())

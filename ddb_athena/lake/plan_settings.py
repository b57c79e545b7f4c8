"""Runtime SQL settings for one step's queries, the session's own restored afterwards (Spark only, no Dagster).

A SparkSession's settings are shared by its threads: a sync run merges its tables side by side in one session, each
merge under the same settings. So the first thread in sets them and the last one out restores them."""

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import SparkSession

_LOCK = threading.Lock()
# (session, settings) -> [threads within, the values before the first of them].
_HELD: dict[tuple, list] = {}


@contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    key = (id(spark), tuple(sorted(settings.items())))
    with _LOCK:
        held = _HELD.get(key)
        if held is None:
            held = _HELD[key] = [0, {name: spark.conf.get(name, None) for name in settings}]
            for name, value in settings.items():
                spark.conf.set(name, value)
        held[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            held[0] -= 1
            if held[0] == 0:
                del _HELD[key]
                for name, value in held[1].items():
                    if value is None:
                        spark.conf.unset(name)
                    else:
                        spark.conf.set(name, value)

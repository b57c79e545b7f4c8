"""Spark's Python daemon (`pyspark.daemon`), with its workers importing pyspark from the installed package.

Spark puts its Python archives on the workers' PYTHONPATH: pyspark.zip, py4j's zip and the spark-core JAR.
Every task then calls `importlib.invalidate_caches()`, which in Python 3.11 reads the directory of every zip
again, once for each package imported from it: ~60 ms a task, three quarters of the Python workers' CPU in a
sync cycle (`bench-sync-cpu`). The interpreter that runs this module (`spark.pyspark.python`, the one this
package is installed in) has pyspark and py4j installed; the workers are forked from this process and inherit
its import path. An interpreter without them keeps the archives.
"""

import os
import sys
from importlib.util import find_spec


def _inside_archive(entry: str) -> bool:
    # Finders are cached for package directories inside an archive too (`pyspark.zip/pyspark/sql`).
    path = entry
    while path and path != os.path.dirname(path):
        if os.path.isfile(path):
            return True
        path = os.path.dirname(path)
    return False


def import_from_installed_packages() -> None:
    archived = list(sys.path)
    sys.path[:] = [entry for entry in archived if not _inside_archive(entry)]
    if find_spec("pyspark") is None or find_spec("py4j") is None:
        sys.path[:] = archived
        return
    for entry in [entry for entry in sys.path_importer_cache if _inside_archive(entry)]:
        del sys.path_importer_cache[entry]


if __name__ == "__main__":
    import_from_installed_packages()
    from pyspark import daemon

    daemon.manager()

"""Deployment archives of exactly the modules an entry point imports: the capture Lambda's zip (`make lambda`)
and the orders load job's code for EMR Serverless (`make emr-job`).

Each platform provides the standard library and some packages (the Lambda Python runtime: boto3 and botocore;
EMR Serverless: PySpark and what it imports). An entry point importing anything else, and not shipped in the
archive, would fail there on its first run, so the build refuses it.
"""

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ddb_athena.exported.orders_load_job import JOB_ARCHIVE_NAME

SOURCE_ROOT = Path(__file__).resolve().parent.parent
DIST = SOURCE_ROOT / ".ddb_athena" / "dist"
# Importing in a fresh interpreter shows what the module really pulls in, nothing this process had loaded.
_PROBE = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps({{name: getattr(sys.modules[name], "__file__", None) for name in set(sys.modules) - before}}))
"""


# Files a module reads at run time, shipped with it (archive name -> path in the source tree).
DATA_FILES = {"ddb_athena.lib.declarations": {"ddb_athena/tables.toml": SOURCE_ROOT / "ddb_athena" / "tables.toml"}}


class PackagingError(RuntimeError):
    """The entry point imports something its platform does not have."""


@dataclass(frozen=True)
class Bundle:
    module: str
    platform: str
    # Top-level packages the platform has besides the standard library ...
    provided: frozenset[str]
    # ... and the archive carries.
    shipped: frozenset[str]
    # A module whose imports the platform has too (PySpark pulls in its own optional packages).
    provided_with: str | None = None


CAPTURE_LAMBDA = Bundle(
    module="ddb_athena.streamed.capture.lambda_handler",
    platform="the Lambda Python runtime",
    provided=frozenset({"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six"}),
    shipped=frozenset({"ddb_athena"}),
)
ORDERS_LOAD_JOB = Bundle(
    module="ddb_athena.exported.orders_load_job",
    platform="EMR Serverless",
    provided=frozenset({"pyspark", "py4j"}),
    shipped=frozenset({"ddb_athena", "dagster_pipes"}),
    provided_with="pyspark.sql",
)


def imported_modules(module: str) -> dict[str, str | None]:
    """Every module importing `module` loads, with its file."""
    probe = subprocess.run([sys.executable, "-c", _PROBE.format(module=module)], cwd=SOURCE_ROOT, check=True, capture_output=True, text=True)
    return json.loads(probe.stdout)


def package_files(bundle: Bundle) -> dict[str, Path]:
    """Archive name -> file of every shipped module the entry point needs; refuses imports the platform lacks."""
    modules = imported_modules(bundle.module)
    provided = set(bundle.provided) | set(sys.stdlib_module_names)
    if bundle.provided_with:
        provided |= {name.split(".")[0] for name in imported_modules(bundle.provided_with)}
    missing = sorted({name.split(".")[0] for name in modules} - provided - bundle.shipped)
    if missing:
        raise PackagingError(f"{bundle.module} imports {', '.join(missing)}, which {bundle.platform} does not provide")
    files = {}
    for name, path in modules.items():
        if name.split(".")[0] in bundle.shipped and path:
            module_path = name.replace(".", "/")
            files[f"{module_path}/__init__.py" if path.endswith("__init__.py") else f"{module_path}.py"] = Path(path)
            files.update(DATA_FILES.get(name, {}))
    return dict(sorted(files.items()))


def build_zip(destination: Path, bundle: Bundle = CAPTURE_LAMBDA) -> list[str]:
    """Writes the zip (the same bytes for the same code) and returns its entries."""
    files = package_files(bundle)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(destination, "w") as archive:
        for name, path in files.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    return list(files)


def entry_point_file(bundle: Bundle) -> Path:
    """The entry point's source file (found without importing it)."""
    return Path(importlib.util.find_spec(bundle.module).origin)


def build_emr_job(directory: Path) -> tuple[Path, Path]:
    """The job's entry point and its `--py-files` archive, side by side, as they go to the code location."""
    entry_point = entry_point_file(ORDERS_LOAD_JOB)
    directory.mkdir(parents=True, exist_ok=True)
    build_zip(directory / JOB_ARCHIVE_NAME, ORDERS_LOAD_JOB)
    shutil.copyfile(entry_point, directory / entry_point.name)
    return directory / entry_point.name, directory / JOB_ARCHIVE_NAME


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a deployment archive.")
    parser.add_argument("what", choices=["lambda", "emr-job"])
    parser.add_argument("destination", nargs="?", type=Path)
    args = parser.parse_args(argv)
    if args.what == "lambda":
        destination = args.destination or DIST / "capture-lambda.zip"
        entries = build_zip(destination)
        print(f"{destination}: {len(entries)} files ({', '.join(entries)}), handler {CAPTURE_LAMBDA.module}.handler")
    else:
        entry_point, archive = build_emr_job(args.destination or DIST / "emr")
        print(f"{entry_point}: the job's entry point\n{archive}: {len(zipfile.ZipFile(archive).namelist())} modules for --py-files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

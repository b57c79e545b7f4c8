"""The capture Lambda's deployment zip (`make lambda`): the handler and exactly the package modules it imports.

The Lambda Python runtime provides the standard library, boto3 and botocore (with what they import); a
handler importing anything else would fail there on its first event, so the build refuses it.
"""

import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path

HANDLER_MODULE = "ddb_athena.capture.lambda_handler"
PACKAGE = "ddb_athena"
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six"}
SOURCE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ZIP = SOURCE_ROOT / ".ddb_athena" / "dist" / "capture-lambda.zip"
# Importing in a fresh interpreter shows what the module really pulls in, nothing this process had loaded.
_PROBE = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps({{name: getattr(sys.modules[name], "__file__", None) for name in set(sys.modules) - before}}))
"""


class PackagingError(RuntimeError):
    """The handler imports something the Lambda runtime does not have."""


def imported_modules(module: str) -> dict[str, str | None]:
    """Every module importing `module` loads, with its file."""
    probe = subprocess.run([sys.executable, "-c", _PROBE.format(module=module)], cwd=SOURCE_ROOT, check=True, capture_output=True, text=True)
    return json.loads(probe.stdout)


def package_files(module: str = HANDLER_MODULE) -> list[str]:
    """The package's files `module` needs, relative to the source root; refuses imports the runtime lacks."""
    modules = imported_modules(module)
    top_level = {name.split(".")[0] for name in modules}
    missing = sorted(top_level - set(sys.stdlib_module_names) - RUNTIME_PROVIDED - {PACKAGE})
    if missing:
        raise PackagingError(f"{module} imports {', '.join(missing)}, which the Lambda Python runtime does not provide")
    files = [Path(path) for name, path in modules.items() if name.split(".")[0] == PACKAGE]
    return sorted(path.resolve().relative_to(SOURCE_ROOT).as_posix() for path in files)


def build_zip(destination: Path, module: str = HANDLER_MODULE) -> list[str]:
    """Writes the zip (the same bytes for the same code) and returns its entries."""
    entries = package_files(module)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(destination, "w") as archive:
        for name in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, (SOURCE_ROOT / name).read_bytes())
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the capture Lambda's deployment zip.")
    parser.add_argument("destination", nargs="?", type=Path, default=DEFAULT_ZIP)
    args = parser.parse_args(argv)
    entries = build_zip(args.destination)
    print(f"{args.destination}: {len(entries)} files ({', '.join(entries)}), handler {HANDLER_MODULE}.handler")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Downloads the image needs beyond Python packages, each checked against its SHA-256 pinned in deploy/artifacts.lock
before it lands (written beside its target and moved into place only once it matches).

    python -m ddb_athena_build.pinned rds-ca-bundle.pem --into /opt/ddb_athena/certs [--optional 1]
"""

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from ddb_athena_build.jars import FetchError, download_checked

LOCK = Path(__file__).resolve().parents[1] / "deploy" / "artifacts.lock"


@dataclass(frozen=True)
class Pinned:
    name: str
    sha256: str
    url: str


def pinned_artifacts(lock: Path | None = None) -> dict[str, Pinned]:
    entries = {}
    for line in (lock or LOCK).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sha256, url = line.split()
            entries[name] = Pinned(name, sha256.lower(), url)
    return entries


def fetch_pinned(artifact: Pinned, directory: Path, timeout: float = 60.0) -> Path:
    """`artifact` into `directory`, unless there already with its pinned digest; FetchError if it cannot be fetched or
    its digest is not the pinned one (nothing is left behind then)."""
    target = directory / artifact.name
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == artifact.sha256:
        return target
    return download_checked(artifact.url, target, "sha256", artifact.sha256, "deploy/artifacts.lock pins", timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="artifacts of deploy/artifacts.lock")
    parser.add_argument("--into", type=Path, required=True)
    parser.add_argument("--optional", choices=("0", "1"), default="0", help="1: one that cannot be fetched is reported, not fatal (an offline build)")
    args = parser.parse_args(argv)
    artifacts = pinned_artifacts()
    unknown = sorted(set(args.names) - set(artifacts))
    if unknown:
        parser.error(f"not in deploy/artifacts.lock: {', '.join(unknown)}")
    for name in args.names:
        try:
            print(fetch_pinned(artifacts[name], args.into))
        except FetchError as error:
            # A digest that differs is never optional: that is what the pin is for.
            if args.optional != "1" or "SHA-256" in str(error):
                print(f"error: {error}", file=sys.stderr)
                return 1
            print(f"warning: {error}; left out of this build", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

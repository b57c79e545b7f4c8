"""Downloads the image needs beyond Python packages, each checked against its SHA-256 pinned in deploy/artifacts.lock
before it lands (written beside its target and moved into place only once it matches).

    python -m ddb_athena_build.pinned NAME... --into DIRECTORY [--maven-repository URL] [--optional 1]
    python -m ddb_athena_build.pinned --pin NAME...

`--pin` records a Maven artifact's digest: it downloads it, refuses it if the `.sha1` its repository publishes beside
it disagrees or if its `.asc` signature is not good by one of the keys `--keys` names (the publisher's KEYS file:
Apache's for Iceberg and Hadoop, AWS's for its SDK; docs/operations.md), and writes its SHA-256 into the lock. Run it
where the source is reachable and commit the line: the pin is what every later build trusts.

    python -m ddb_athena_build.pinned --pin NAME... --keys KEYS
"""

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from ddb_athena_build.jars import DigestMismatchError, FetchError, download_checked

LOCK = Path(__file__).resolve().parents[1] / "deploy" / "artifacts.lock"
# The lock's digest column before anyone has pinned the artifact: a build refuses it.
UNPINNED = "unpinned"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
# Beside what an offline build fetched, what it could not, and why.
NOT_FETCHED_FILE = "not-fetched.txt"


@dataclass(frozen=True)
class Pinned:
    name: str
    sha256: str
    url: str

    def from_repository(self, maven_repository: str | None) -> "Pinned":
        """The same artifact from a mirror of Maven Central (the pin, not the server, is what is trusted)."""
        if not maven_repository or not self.url.startswith(MAVEN_CENTRAL):
            return self
        return replace(self, url=maven_repository.rstrip("/") + "/" + self.url.removeprefix(MAVEN_CENTRAL))


def pinned_artifacts(lock: Path | None = None) -> dict[str, Pinned]:
    entries = {}
    for line in (lock or LOCK).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sha256, url = line.split()
            entries[name] = Pinned(name, sha256.lower(), url)
    return entries


def file_sha256(path: Path) -> str:
    """A file's SHA-256, read in chunks: the AWS SDK bundle is about 280 MB."""
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def fetch_pinned(artifact: Pinned, directory: Path, timeout: float = 60.0) -> Path:
    """`artifact` into `directory`, unless there already with its pinned digest; FetchError if it is not pinned yet,
    cannot be fetched, or its digest is not the pinned one (nothing is left behind then)."""
    if artifact.sha256 == UNPINNED:
        raise FetchError(
            f"{artifact.name}: deploy/artifacts.lock pins no SHA-256 for it yet; where {artifact.url} is reachable, run "
            f"`python -m ddb_athena_build.pinned --pin {artifact.name}`, check the release's signature and commit the line"
        )
    target = directory / artifact.name
    if target.is_file() and file_sha256(target) == artifact.sha256:
        return target
    return download_checked(artifact.url, target, "sha256", artifact.sha256, "deploy/artifacts.lock pins", timeout)


class SignatureError(FetchError):
    """An artifact whose signature is missing, bad, or by a key the publisher's KEYS does not hold."""


def verify_signature(artifact: Path, signature: Path, keys: Path) -> str:
    """The fingerprint of the key from `keys` whose good signature `signature` is of `artifact`; SignatureError else.
    GnuPG in a keyring of its own, holding only `keys`: nothing the machine trusts otherwise counts."""
    with tempfile.TemporaryDirectory() as home:
        gpg = ["gpg", "--homedir", home, "--batch", "--no-autostart"]
        imported = subprocess.run([*gpg, "--import", str(keys)], capture_output=True, text=True)
        if imported.returncode != 0:
            raise SignatureError(f"{keys}: no public key GnuPG can import: {imported.stderr.strip()[-300:]}")
        checked = subprocess.run([*gpg, "--status-fd", "1", "--verify", str(signature), str(artifact)], capture_output=True, text=True)
    valid = re.search(r"^\[GNUPG:\] VALIDSIG ([0-9A-F]{40})", checked.stdout, flags=re.M)
    if checked.returncode != 0 or valid is None:
        reason = "signed by a key the KEYS file does not hold" if "NO_PUBKEY" in checked.stdout else "the signature is not good"
        raise SignatureError(f"{artifact.name}: {reason}")
    return valid.group(1)


def pin(artifact: Pinned, keys: Path, lock: Path | None = None, timeout: float = 60.0) -> str:
    """Download `artifact` from its Maven repository and write its SHA-256 into the lock; FetchError, leaving the lock
    as it was, if it cannot be fetched, disagrees with the SHA-1 the repository publishes beside it, or its `.asc`
    signature is not good by a key of `keys` (SignatureError)."""
    lock = lock or LOCK
    try:
        with urllib.request.urlopen(f"{artifact.url}.sha1", timeout=timeout) as response:
            published_sha1 = response.read().decode().split()[0].lower()
    except (urllib.error.URLError, OSError) as error:
        raise FetchError(f"{artifact.name}: no SHA-1 beside it at {artifact.url}.sha1 (a Maven repository publishes one): {error}") from None
    with tempfile.TemporaryDirectory() as scratch:
        downloaded = download_checked(artifact.url, Path(scratch) / artifact.name, "sha1", published_sha1, f"{artifact.url}.sha1 says", timeout)
        signature = Path(scratch) / f"{artifact.name}.asc"
        try:
            with urllib.request.urlopen(f"{artifact.url}.asc", timeout=timeout) as response:
                signature.write_bytes(response.read())
        except (urllib.error.URLError, OSError) as error:
            raise SignatureError(f"{artifact.name}: no signature beside it at {artifact.url}.asc (Maven Central requires one): {error}") from None
        signer = verify_signature(downloaded, signature, keys)
        sha256 = file_sha256(downloaded)
    lines = lock.read_text().splitlines(keepends=True)
    for index, line in enumerate(lines):
        fields = line.split()
        if fields and not line.lstrip().startswith("#") and fields[0] == artifact.name:
            lines[index] = line.replace(fields[1], sha256, 1)
    lock.write_text("".join(lines))
    return f"{sha256} (signed by {signer})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="artifacts of deploy/artifacts.lock")
    parser.add_argument("--into", type=Path, help="where the artifacts land")
    parser.add_argument("--pin", action="store_true", help="record the artifacts' digests in the lock instead")
    parser.add_argument("--keys", type=Path, help="with --pin: the publisher's KEYS file, whose keys alone may have signed the artifacts")
    parser.add_argument("--maven-repository", help="a mirror of Maven Central to fetch the Maven artifacts from")
    parser.add_argument("--optional", choices=("0", "1"), default="0", help="1: one that cannot be fetched is reported, not fatal (an offline build)")
    args = parser.parse_args(argv)
    if bool(args.pin) == bool(args.into):
        parser.error("either --into DIRECTORY or --pin")
    if args.pin and not args.keys:
        parser.error("--pin needs --keys: the publisher's KEYS file (docs/operations.md, 'Pin the image's JARs')")
    artifacts = pinned_artifacts()
    unknown = sorted(set(args.names) - set(artifacts))
    if unknown:
        parser.error(f"not in deploy/artifacts.lock: {', '.join(unknown)}")
    if args.pin:
        for name in args.names:
            try:
                print(f"{name} {pin(artifacts[name].from_repository(args.maven_repository), args.keys)}")
            except FetchError as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
        return 0
    args.into.mkdir(parents=True, exist_ok=True)
    not_fetched = []
    for name in args.names:
        try:
            print(fetch_pinned(artifacts[name].from_repository(args.maven_repository), args.into))
        except FetchError as error:
            # A digest that differs is never optional: that is what the pin is for.
            if args.optional != "1" or isinstance(error, DigestMismatchError):
                print(f"error: {error}", file=sys.stderr)
                return 1
            print(f"warning: {error}; left out of this build", file=sys.stderr)
            not_fetched.append(f"{error}\n")
    # Said where the artifacts are too: an image built from cache shows no build output.
    if not_fetched:
        (args.into / NOT_FETCHED_FILE).write_text("".join(not_fetched))
    else:
        (args.into / NOT_FETCHED_FILE).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

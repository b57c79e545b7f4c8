"""Provision the JARs a local Spark needs for Apache Iceberg 1.10 and S3A.

Maven Central is not assumed to be reachable, so every JAR comes from PyPI:

- the Iceberg Spark runtime ships in the ``snowpark-connect-deps-iceberg`` wheel,
  but stripped of its shaded Jackson; we rebuild that part by relocating
  pyspark's own Jackson 2.15.2 classes into ``org.apache.iceberg.shaded``;
- ``hadoop-aws`` and the matching AWS SDK bundle ship inside the
  ``sagemaker-pyspark`` sdist, which is only downloaded and unpacked, never
  installed (it pins an old pyspark);
- the local warehouse's file system (``LocalWarehouseFileSystem.java``) is
  compiled here against pyspark's own Hadoop client, where a JDK is at hand.

The deployment's image bakes the official Maven artifacts instead, pinned by
SHA-256 (``ddb_athena_build.pinned``, ``deploy/artifacts.lock``); an offline
build of it falls back to this set.

Everything lands in one cached directory; provisioning is idempotent and each
file is written atomically so an interrupted run never leaves a broken JAR.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ddb_athena.lake.local_jars import (
    AWS_SDK_BUNDLE_JAR,
    DEFAULT_JAR_DIR,
    HADOOP_AWS_JAR,
    ICEBERG_RUNTIME_JAR,
    LOCAL_FILE_SYSTEM_SOURCE,
    RELOCATED_JACKSON_JAR,
    local_file_system_jar,
    local_file_system_jar_name,
    local_jar_paths,
)

logger = logging.getLogger(__name__)


ICEBERG_DEPS_DISTRIBUTION = "snowpark-connect-deps-iceberg"
ICEBERG_DEPS_VERSION = "1.0.3"
ICEBERG_DEPS_MODULE = "snowpark_connect_deps_iceberg"

PYSPARK_JACKSON_JARS = (
    "jackson-annotations-2.15.2.jar",
    "jackson-core-2.15.2.jar",
    "jackson-databind-2.15.2.jar",
)

S3A_DEPS_DISTRIBUTION = "sagemaker-pyspark"
S3A_DEPS_VERSION = "1.4.5"

# The package prefix Iceberg's runtime expects its Jackson under, in both the
# internal (slash) form used by class names/descriptors and the dotted form
# used by string literals and service files.
JACKSON_RELOCATIONS = (
    (b"com/fasterxml/jackson/", b"org/apache/iceberg/shaded/com/fasterxml/jackson/"),
    (b"com.fasterxml.jackson.", b"org.apache.iceberg.shaded.com.fasterxml.jackson."),
)
JACKSON_CLASS_PREFIX = "com/fasterxml/jackson/"
JACKSON_SERVICE_PREFIX = "META-INF/services/com.fasterxml.jackson."

CLASS_FILE_MAGIC = 0xCAFEBABE
CONSTANT_UTF8 = 1
CONSTANT_LONG = 5
CONSTANT_DOUBLE = 6
# Payload size of every fixed-size constant-pool entry, by tag (JVMS 4.4).
FIXED_CONSTANT_SIZES = {
    3: 4,  # Integer
    4: 4,  # Float
    CONSTANT_LONG: 8,
    CONSTANT_DOUBLE: 8,
    7: 2,  # Class
    8: 2,  # String
    9: 4,  # Fieldref
    10: 4,  # Methodref
    11: 4,  # InterfaceMethodref
    12: 4,  # NameAndType
    15: 3,  # MethodHandle
    16: 2,  # MethodType
    17: 4,  # Dynamic
    18: 4,  # InvokeDynamic
    19: 2,  # Module
    20: 2,  # Package
}


JAVA_RELEASE = "8"


def ensure_local_jars(jar_dir: Path | None = None) -> list[Path]:
    """Provision whatever JAR is missing in jar_dir and return all of them."""
    jar_dir = jar_dir or DEFAULT_JAR_DIR
    jar_dir.mkdir(parents=True, exist_ok=True)

    iceberg_runtime = jar_dir / ICEBERG_RUNTIME_JAR
    if not iceberg_runtime.is_file():
        _provision_iceberg_runtime(iceberg_runtime)

    relocated_jackson = jar_dir / RELOCATED_JACKSON_JAR
    if not relocated_jackson.is_file():
        pyspark_jars = _package_dir("pyspark") / "jars"
        with atomic_output(relocated_jackson) as partial:
            relocate_jackson([pyspark_jars / name for name in PYSPARK_JACKSON_JARS], partial)

    s3a_jars = [jar_dir / HADOOP_AWS_JAR, jar_dir / AWS_SDK_BUNDLE_JAR]
    if not all(path.is_file() for path in s3a_jars):
        _provision_s3a_jars(s3a_jars)

    file_system_jar = jar_dir / local_file_system_jar_name()
    if not file_system_jar.is_file():
        _compile_local_file_system(file_system_jar)

    return local_jar_paths(jar_dir)


class FetchError(RuntimeError):
    """An artifact could not be fetched, or did not match the digest it was checked against."""


class DigestMismatchError(FetchError):
    """What arrived is not what the digest it was checked against describes: never to be used."""


def download_checked(url: str, target: Path, algorithm: str, expected: str, expected_from: str, timeout: float = 60.0) -> Path:
    """`url` into `target`, moved into place only if its `algorithm` digest is `expected` (which `expected_from` gave);
    FetchError otherwise, leaving nothing behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, atomic_output(target) as partial:
            digest = hashlib.new(algorithm, usedforsecurity=False)
            with partial.open("wb") as destination:
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    destination.write(chunk)
            if digest.hexdigest() != expected:
                name = algorithm.upper().replace("SHA", "SHA-")
                raise DigestMismatchError(f"{target.name} from {url}: {name} {digest.hexdigest()}, {expected_from} {expected}")
    except (urllib.error.URLError, OSError) as error:
        raise FetchError(f"{target.name} could not be fetched from {url}: {error}") from None
    return target


def _compile_local_file_system(target: Path) -> None:
    javac = _javac()
    if javac is None:
        logger.warning(
            "No JDK found (javac on JAVA_HOME or the PATH): the local warehouse keeps Hadoop's own file system, "
            "which runs a chmod process for every file it writes (~0.7 CPU-s a minute of a sync run). "
            "Install a JDK and run `make install` again to compile %s.",
            LOCAL_FILE_SYSTEM_SOURCE.name,
        )
        return
    (hadoop_client,) = (_package_dir("pyspark") / "jars").glob("hadoop-client-api-*.jar")
    with tempfile.TemporaryDirectory() as classes, atomic_output(target) as partial:
        subprocess.run(
            [javac, "--release", JAVA_RELEASE, "-cp", str(hadoop_client), "-d", classes, str(LOCAL_FILE_SYSTEM_SOURCE)],
            check=True,
        )
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            for class_file in sorted(Path(classes).rglob("*.class")):
                jar.write(class_file, class_file.relative_to(classes).as_posix())


def _javac() -> str | None:
    """The compiler of the JDK that PySpark runs (JAVA_HOME's, else the PATH's)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").is_file():
        return str(Path(java_home) / "bin" / "javac")
    return shutil.which("javac")


def relocate_jackson(source_jars: list[Path], output: Path) -> int:
    """Write the Jackson classes and service files of source_jars, relocated
    under org.apache.iceberg.shaded, into a new JAR; return the class count."""
    written: set[str] = set()
    class_count = 0
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as target:
        for source_jar in source_jars:
            with zipfile.ZipFile(source_jar) as source:
                for entry in source.infolist():
                    is_class = entry.filename.startswith(JACKSON_CLASS_PREFIX) and entry.filename.endswith(".class")
                    is_service = entry.filename.startswith(JACKSON_SERVICE_PREFIX)
                    if not (is_class or is_service):
                        continue
                    new_name = relocate_names(entry.filename.encode()).decode()
                    # The same package may be split over several JARs; first one wins.
                    if new_name in written:
                        continue
                    data = source.read(entry)
                    data = relocate_class_bytes(data) if is_class else relocate_names(data)
                    target.writestr(zipfile.ZipInfo(new_name, entry.date_time), data, zipfile.ZIP_DEFLATED)
                    written.add(new_name)
                    if is_class:
                        class_count += 1
    return class_count


def relocate_names(data: bytes) -> bytes:
    """Move every Jackson package reference in data under org.apache.iceberg.shaded."""
    for original, relocated in JACKSON_RELOCATIONS:
        data = data.replace(original, relocated)
    return data


def relocate_class_bytes(data: bytes) -> bytes:
    """Relocate Jackson references in a .class file by rewriting the
    CONSTANT_Utf8 entries of its constant pool; everything else refers to the
    pool by index, so it is copied unchanged."""
    magic, constant_pool_count = struct.unpack_from(">I4xH", data)
    if magic != CLASS_FILE_MAGIC:
        raise ValueError("not a Java class file")
    output = bytearray(data[:10])
    offset = 10
    index = 1
    while index < constant_pool_count:
        tag = data[offset]
        if tag == CONSTANT_UTF8:
            (length,) = struct.unpack_from(">H", data, offset + 1)
            text = relocate_names(data[offset + 3 : offset + 3 + length])
            if len(text) > 0xFFFF:
                raise ValueError("relocated constant exceeds the class file's 64 KiB limit")
            output += struct.pack(">BH", CONSTANT_UTF8, len(text)) + text
            offset += 3 + length
        elif tag in FIXED_CONSTANT_SIZES:
            entry_end = offset + 1 + FIXED_CONSTANT_SIZES[tag]
            output += data[offset:entry_end]
            offset = entry_end
        else:
            raise ValueError(f"unknown constant pool tag {tag} at byte {offset}")
        # Long and Double constants occupy two pool slots.
        index += 2 if tag in (CONSTANT_LONG, CONSTANT_DOUBLE) else 1
    output += data[offset:]
    return bytes(output)


def _provision_iceberg_runtime(target: Path) -> None:
    """Copy the Iceberg runtime from the installed deps package, or from its
    wheel downloaded from PyPI when the package is not installed here."""
    spec = importlib.util.find_spec(ICEBERG_DEPS_MODULE)
    if spec and spec.submodule_search_locations:
        installed_jar = Path(spec.submodule_search_locations[0]) / "jars" / ICEBERG_RUNTIME_JAR
        if installed_jar.is_file():
            with atomic_output(target) as partial:
                shutil.copyfile(installed_jar, partial)
            return

    with tempfile.TemporaryDirectory() as download_dir:
        wheel = _pip_download(f"{ICEBERG_DEPS_DISTRIBUTION}=={ICEBERG_DEPS_VERSION}", Path(download_dir), "*.whl")
        with (
            zipfile.ZipFile(wheel) as archive,
            atomic_output(target) as partial,
            archive.open(f"{ICEBERG_DEPS_MODULE}/jars/{ICEBERG_RUNTIME_JAR}") as source,
            partial.open("wb") as destination,
        ):
            shutil.copyfileobj(source, destination)


def _provision_s3a_jars(targets: list[Path]) -> None:
    """Extract hadoop-aws and the AWS SDK bundle from the sagemaker-pyspark sdist."""
    targets_by_name = {target.name: target for target in targets}
    with tempfile.TemporaryDirectory() as download_dir:
        sdist = _pip_download(
            f"{S3A_DEPS_DISTRIBUTION}=={S3A_DEPS_VERSION}",
            Path(download_dir),
            "*.tar.gz",
            "--no-binary",
            ":all:",
        )
        # Stream the archive once; the JARs sit under <sdist>/deps/jars/.
        with tarfile.open(sdist, "r|gz") as archive:
            for member in archive:
                target = targets_by_name.get(Path(member.name).name)
                if target is None or not member.isfile() or Path(member.name).parent.name != "jars":
                    continue
                with archive.extractfile(member) as source, atomic_output(target) as partial, partial.open("wb") as destination:
                    shutil.copyfileobj(source, destination)
    missing = [target.name for target in targets if not target.is_file()]
    if missing:
        raise RuntimeError(f"{S3A_DEPS_DISTRIBUTION}=={S3A_DEPS_VERSION} did not contain {missing}")


def _pip_download(requirement: str, download_dir: Path, pattern: str, *pip_args: str) -> Path:
    """Download one distribution file with pip (which caches it for later runs)."""
    logger.info("Downloading %s from PyPI", requirement)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            *pip_args,
            requirement,
            "-d",
            str(download_dir),
        ],
        check=True,
    )
    (downloaded,) = download_dir.glob(pattern)
    return downloaded


def _package_dir(module_name: str) -> Path:
    """Locate an installed package without importing it."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{module_name} is not installed in {sys.executable}")
    return Path(spec.submodule_search_locations[0])


@contextmanager
def atomic_output(target: Path) -> Iterator[Path]:
    """Yield a scratch path next to target, moved into place only once the
    block succeeds, so readers never see a half-written JAR."""
    # A unique name (not mkstemp, whose 0600 mode would stick) keeps
    # concurrent provisioners from clobbering each other's scratch file.
    scratch = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    try:
        yield scratch
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description="Provision the JARs of the project's local Spark.").parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for jar_path in ensure_local_jars():
        print(jar_path)
    if file_system_jar := local_file_system_jar():
        print(file_system_jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tests for ddb_athena_build.jars: Jackson relocation and the local JAR cache (no network, no Spark)."""

from __future__ import annotations

import logging
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

from ddb_athena.lake.local_jars import LOCAL_JAR_NAMES, MissingJarsError, local_file_system_jar, local_file_system_jar_name, local_jar_paths
from ddb_athena.lake.session_config import LOCAL_FILE_SYSTEM_CLASS
from ddb_athena_build.jars import ensure_local_jars, relocate_class_bytes, relocate_jackson

CLASS_TAIL = b"\x00\x21\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"  # flags, this, super, no members
LONG_VALUE = 0x0123456789ABCDEF


def utf8_constant(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack(">BH", 1, len(encoded)) + encoded


def synthetic_class(*utf8_texts_after_long: str) -> bytes:
    """A minimal class file: Utf8 JsonFactory, a Long (two slots), a Class
    pointing at #1, then the given Utf8 constants, then a fixed tail."""
    pool = [
        utf8_constant("com/fasterxml/jackson/core/JsonFactory"),
        struct.pack(">Bq", 5, LONG_VALUE),
        struct.pack(">BH", 7, 1),
        *(utf8_constant(text) for text in utf8_texts_after_long),
    ]
    constant_pool_count = 1 + 1 + 2 + 1 + len(utf8_texts_after_long)
    header = struct.pack(">IHHH", 0xCAFEBABE, 0, 52, constant_pool_count)
    return header + b"".join(pool) + CLASS_TAIL


def parse_constant_pool(data: bytes) -> tuple[dict[int, object], bytes]:
    """Independent reader for the constants synthetic_class uses; returns the pool and what follows it."""
    assert data[:4] == b"\xca\xfe\xba\xbe"
    (count,) = struct.unpack_from(">H", data, 8)
    offset, index, pool = 10, 1, {}
    while index < count:
        tag = data[offset]
        if tag == 1:
            (length,) = struct.unpack_from(">H", data, offset + 1)
            pool[index] = data[offset + 3 : offset + 3 + length].decode()
            offset, index = offset + 3 + length, index + 1
        elif tag == 5:
            pool[index] = struct.unpack_from(">q", data, offset + 1)[0]
            offset, index = offset + 9, index + 2
        elif tag == 7:
            pool[index] = ("class", struct.unpack_from(">H", data, offset + 1)[0])
            offset, index = offset + 3, index + 1
        else:
            raise AssertionError(f"unexpected tag {tag}")
    return pool, data[offset:]


def test_relocate_class_bytes_rewrites_utf8_constants_around_a_long():
    original = synthetic_class(
        "(Lcom/fasterxml/jackson/core/JsonParser;)V",
        "com.fasterxml.jackson.databind.ext.Java7Support",
        "java/lang/Object",
    )

    pool, tail = parse_constant_pool(relocate_class_bytes(original))

    assert pool == {
        1: "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactory",
        2: LONG_VALUE,
        4: ("class", 1),
        5: "(Lorg/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonParser;)V",
        6: "org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ext.Java7Support",
        7: "java/lang/Object",
    }
    assert tail == CLASS_TAIL


def test_relocate_class_bytes_rejects_unknown_constant_tags():
    broken = struct.pack(">IHHH", 0xCAFEBABE, 0, 52, 2) + b"\x02\x00\x00"
    with pytest.raises(ValueError, match="unknown constant pool tag 2"):
        relocate_class_bytes(broken)


def test_relocate_jackson_keeps_only_relocated_jackson_classes_and_services(tmp_path: Path):
    core_jar = tmp_path / "jackson-core.jar"
    with zipfile.ZipFile(core_jar, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        jar.writestr("META-INF/LICENSE", "license")
        jar.writestr("META-INF/JACKSON.SF", "signature")
        jar.writestr("META-INF/versions/9/module-info.class", b"\xca\xfe\xba\xbe")
        jar.writestr("module-info.class", b"\xca\xfe\xba\xbe")
        jar.writestr("com/fasterxml/jackson/core/JsonFactory.class", synthetic_class())
        jar.writestr("META-INF/services/com.fasterxml.jackson.core.JsonFactory", "com.fasterxml.jackson.core.JsonFactory\n")
    databind_jar = tmp_path / "jackson-databind.jar"
    with zipfile.ZipFile(databind_jar, "w") as jar:
        jar.writestr("com/fasterxml/jackson/databind/ObjectMapper.class", synthetic_class())
        jar.writestr("org/other/Thing.class", synthetic_class())
    output = tmp_path / "relocated.jar"

    class_count = relocate_jackson([core_jar, databind_jar], output)

    assert class_count == 2
    with zipfile.ZipFile(output) as jar:
        assert sorted(jar.namelist()) == [
            "META-INF/services/org.apache.iceberg.shaded.com.fasterxml.jackson.core.JsonFactory",
            "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactory.class",
            "org/apache/iceberg/shaded/com/fasterxml/jackson/databind/ObjectMapper.class",
        ]
        service = jar.read("META-INF/services/org.apache.iceberg.shaded.com.fasterxml.jackson.core.JsonFactory")
        assert service == b"org.apache.iceberg.shaded.com.fasterxml.jackson.core.JsonFactory\n"
        pool, _ = parse_constant_pool(jar.read("org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactory.class"))
        assert pool[1] == "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactory"


def test_local_jar_paths_on_empty_dir_names_the_fix(tmp_path: Path):
    with pytest.raises(MissingJarsError, match=r"make install.*python -m ddb_athena_build\.jars") as raised:
        local_jar_paths(tmp_path)
    assert isinstance(raised.value, RuntimeError)
    assert all(name in str(raised.value) for name in LOCAL_JAR_NAMES)


def test_ensure_local_jars_does_nothing_when_all_jars_are_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in (*LOCAL_JAR_NAMES, local_file_system_jar_name()):
        (tmp_path / name).write_bytes(b"jar")

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("provisioning must not run when every JAR is present")

    monkeypatch.setattr(subprocess, "run", no_pip)

    assert ensure_local_jars(tmp_path) == [tmp_path / name for name in LOCAL_JAR_NAMES]


@pytest.mark.subprocess
def test_the_local_file_system_is_compiled_once_with_the_other_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in LOCAL_JAR_NAMES:
        (tmp_path / name).write_bytes(b"jar")
    assert local_file_system_jar(tmp_path) is None

    ensure_local_jars(tmp_path)

    compiled = local_file_system_jar(tmp_path)
    assert compiled == tmp_path / local_file_system_jar_name()
    with zipfile.ZipFile(compiled) as jar:
        assert LOCAL_FILE_SYSTEM_CLASS.replace(".", "/") + ".class" in jar.namelist()
    assert not list(tmp_path.glob(".*.part"))

    def no_javac(*args: object, **kwargs: object) -> None:
        raise AssertionError("a compiled file system must not be compiled again")

    monkeypatch.setattr(subprocess, "run", no_javac)
    ensure_local_jars(tmp_path)


def test_without_a_jdk_the_local_jars_are_provisioned_and_the_file_system_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    for name in LOCAL_JAR_NAMES:
        (tmp_path / name).write_bytes(b"jar")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-jdk"))

    with caplog.at_level(logging.WARNING, logger="ddb_athena_build.jars"):
        assert ensure_local_jars(tmp_path) == [tmp_path / name for name in LOCAL_JAR_NAMES]

    assert local_file_system_jar(tmp_path) is None
    assert "No JDK found" in caplog.text and "make install" in caplog.text

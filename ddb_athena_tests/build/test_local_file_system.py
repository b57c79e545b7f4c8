"""The local warehouse's file system: Hadoop's own, without a chmod process for every file it writes."""

from contextlib import contextmanager
from pathlib import Path

from ddb_athena.lake.session_config import LOCAL_FILE_SYSTEM_CLASS
from ddb_athena_tests.lake.helpers import ChangeFiles, change


@contextmanager
def processes_started(spark, tmp_path: Path):
    """The commands the session's JVM starts inside the block, from Java Flight Recorder's jdk.ProcessStart events."""
    jvm = spark._jvm
    recording = jvm.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart")
    recording.start()
    commands: list[str] = []
    try:
        yield commands
    finally:
        recording.stop()
        dump = jvm.java.io.File(str(tmp_path / "processes.jfr")).toPath()
        recording.dump(dump)
        recording.close()
        commands.extend(str(event.getString("command")) for event in jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(dump))


def file_systems(spark):
    """The session's file system for file:// paths, and Hadoop's own built from the same configuration."""
    jvm = spark._jvm
    hadoop_conf = spark._jsc.hadoopConfiguration()
    hadoops_conf = jvm.org.apache.hadoop.conf.Configuration(hadoop_conf)
    hadoops_conf.set("fs.file.impl", "org.apache.hadoop.fs.LocalFileSystem")
    local = jvm.java.net.URI("file:///")
    file_system = jvm.org.apache.hadoop.fs.FileSystem
    return file_system.get(local, hadoop_conf), file_system.newInstance(local, hadoops_conf)


def write(spark, file_system, path: Path) -> None:
    stream = file_system.create(spark._jvm.org.apache.hadoop.fs.Path(path.as_uri()), True)
    stream.write(bytearray(b"a line\n"))
    stream.close()


def test_the_session_writes_files_as_hadoop_does_without_starting_a_process_or_a_checksum_file(spark, tmp_path):
    ours, hadoops = file_systems(spark)
    assert ours.getClass().getName() == LOCAL_FILE_SYSTEM_CLASS

    with processes_started(spark, tmp_path) as by_hadoops:
        write(spark, hadoops, tmp_path / "hadoops.txt")
    with processes_started(spark, tmp_path) as by_ours:
        write(spark, ours, tmp_path / "ours.txt")

    # The recorder sees Hadoop's own chmod, so an empty list means there was none.
    assert any(command.startswith("chmod") and "hadoops.txt" in command for command in by_hadoops)
    assert by_ours == []
    assert (tmp_path / "ours.txt").stat().st_mode == (tmp_path / "hadoops.txt").stat().st_mode
    assert (tmp_path / "ours.txt").read_text() == "a line\n"
    assert (tmp_path / ".hadoops.txt.crc").is_file() and not (tmp_path / ".ours.txt.crc").exists()


def test_a_file_written_before_with_a_checksum_stays_readable_by_hadoops_file_system(spark, tmp_path):
    ours, hadoops = file_systems(spark)
    path = tmp_path / "version-hint.text"
    write(spark, hadoops, path)
    assert (tmp_path / ".version-hint.text.crc").is_file()

    stream = ours.create(spark._jvm.org.apache.hadoop.fs.Path(path.as_uri()), True)
    stream.write(bytearray(b"the next version\n"))
    stream.close()

    # The old checksum went with the file it was for: Hadoop's own reads the new content without a checksum error.
    assert not (tmp_path / ".version-hint.text.crc").exists()
    stream = hadoops.open(spark._jvm.org.apache.hadoop.fs.Path(path.as_uri()))
    assert bytes(spark._jvm.org.apache.hadoop.io.IOUtils.readFullyToByteArray(stream)) == b"the next version\n"
    stream.close()


def test_a_sticky_bit_is_still_set_by_hadoops_chmod(spark, tmp_path):
    ours, _ = file_systems(spark)
    write(spark, ours, tmp_path / "sticky.txt")
    path = spark._jvm.org.apache.hadoop.fs.Path((tmp_path / "sticky.txt").as_uri())

    with processes_started(spark, tmp_path) as commands:
        ours.setPermission(path, spark._jvm.org.apache.hadoop.fs.permission.FsPermission("1640"))

    assert (tmp_path / "sticky.txt").stat().st_mode & 0o7777 == 0o1640
    assert [command.split()[:2] for command in commands] == [["chmod", "1640"]]


def test_a_merge_into_the_local_warehouse_runs_no_chmod(spark, settings, tmp_path):
    files = ChangeFiles(spark, settings)
    files.merge([files.write(change(1, "b1", "INSERT", name="one"), change(2, "b2", "INSERT", name="two"))])
    files.write(change(3, "b1", name="uno"), change(4, "b2", "REMOVE"))

    with processes_started(spark, tmp_path) as commands:
        files.merge()

    assert files.names() == {"b1": "uno"}
    # Data, delete, manifest and metadata files, each with its .crc: 28 chmods with Hadoop's own file system.
    assert [command for command in commands if command.split()[0] == "chmod"] == []

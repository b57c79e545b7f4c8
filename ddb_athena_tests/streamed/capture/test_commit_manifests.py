import json

import pytest

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena.streamed.capture.commit_manifests import (
    ManifestError,
    committed_files,
    delete_committed_files,
    read_commit_manifest,
    write_commit_manifest,
)


@pytest.fixture
def layout(settings):
    return SourceLayout(settings.bucket, "books_source")


def put(s3, bucket, key):
    s3.put_object(Bucket=bucket, Key=key, Body=b"{}\n")
    return key


def test_cleanup_deletes_exactly_the_committed_files(settings, layout):
    s3 = settings.client("s3")
    names = [f"20261122T0300{second:02d}.000000Z-stream-abc{second}.jsonl" for second in range(4)]
    keys = [put(s3, settings.bucket, layout.changes_prefix + name) for name in names]
    manifest = write_commit_manifest(s3, layout, "run-1", keys[:2], "library.books", 7)
    assert committed_files(s3, layout) == set(keys[:2])
    assert read_commit_manifest(s3, settings.bucket, manifest)["snapshot_id"] == 7

    assert delete_committed_files(s3, settings.bucket, manifest) == 2
    assert list_change_files(s3, layout) == keys[2:]  # the files that landed during the merge stay
    assert committed_files(s3, layout) == set()
    assert delete_committed_files(s3, settings.bucket, manifest) == 0  # a repeated cleanup is harmless


def test_a_manifest_never_leads_outside_the_source_prefix(settings, layout):
    s3 = settings.client("s3")
    with pytest.raises(ManifestError):
        write_commit_manifest(s3, layout, "run-1", ["warehouse/library/books/data/x.parquet"], "library.books", 1)
    forged = {"bucket": settings.bucket, "files_prefix": layout.changes_prefix, "files": ["warehouse/data/x.parquet"]}
    s3.put_object(Bucket=settings.bucket, Key=layout.manifests_prefix + "forged.json", Body=json.dumps(forged).encode())
    victim = put(s3, settings.bucket, "warehouse/data/x.parquet")
    with pytest.raises(ManifestError):
        delete_committed_files(s3, settings.bucket, layout.manifests_prefix + "forged.json")
    forged["files_prefix"] = "warehouse/"  # a manifest cannot widen its own reach either
    s3.put_object(Bucket=settings.bucket, Key=layout.manifests_prefix + "forged.json", Body=json.dumps(forged).encode())
    with pytest.raises(ManifestError):
        delete_committed_files(s3, settings.bucket, layout.manifests_prefix + "forged.json")
    # Listed by the test itself, as no run lists the whole warehouse.
    assert [obj["Key"] for obj in s3.list_objects_v2(Bucket=settings.bucket, Prefix="warehouse/")["Contents"]] == [victim]


class CleanedUpMeanwhile:
    """An S3 client under which a cleanup runs between the listing of the manifests and their reading."""

    def __init__(self, s3, cleanup):
        self._s3, self._cleanup = s3, cleanup

    def __getattr__(self, name):
        return getattr(self._s3, name)

    def get_object(self, **arguments):
        self._cleanup()
        return self._s3.get_object(**arguments)


def test_a_manifest_cleaned_up_while_it_is_read_is_skipped_with_its_files(settings, layout):
    s3 = settings.client("s3")
    kept = put(s3, settings.bucket, layout.changes_prefix + "20261122T030000.000000Z-stream-abc0.jsonl")
    gone = put(s3, settings.bucket, layout.changes_prefix + "20261122T030001.000000Z-stream-abc1.jsonl")
    manifest = write_commit_manifest(s3, layout, "run-1", [gone], "library.books", 7)
    racing = CleanedUpMeanwhile(s3, lambda: delete_committed_files(s3, settings.bucket, manifest))
    assert committed_files(racing, layout) == set()  # found, then deleted by the cleanup before it was read
    assert list_change_files(s3, layout) == [kept]  # and its files went before it


class CountedReads:
    """An S3 client that counts the objects read."""

    def __init__(self, s3):
        self._s3, self.reads = s3, []

    def __getattr__(self, name):
        return getattr(self._s3, name)

    def get_object(self, **arguments):
        self.reads.append(arguments["Key"])
        return self._s3.get_object(**arguments)


def test_each_manifest_is_read_once_until_it_changes_or_goes(settings, layout):
    s3 = CountedReads(settings.client("s3"))
    first, second = (put(s3, settings.bucket, layout.changes_prefix + f"20261122T03000{n}.000000Z-stream-abc{n}.jsonl") for n in (0, 1))
    manifest = write_commit_manifest(s3, layout, "cycle-1", [first], "library.books", 7)
    assert committed_files(s3, layout) == committed_files(s3, layout) == {first}
    assert s3.reads == [manifest]  # the second cycle read no manifest
    write_commit_manifest(s3, layout, "cycle-1", [second], "library.books", 8)  # same key, new content
    assert committed_files(s3, layout) == {second}
    delete_committed_files(s3, settings.bucket, manifest)
    assert committed_files(s3, layout) == set()
    write_commit_manifest(s3, layout, "cycle-1", [first], "library.books", 7)  # the key again, after its cleanup
    assert committed_files(s3, layout) == {first}

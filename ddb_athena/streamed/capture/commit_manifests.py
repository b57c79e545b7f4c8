"""Commit manifests: which source files a successful merge committed, so that exactly those are cleaned up.

A merge writes its manifest after its Iceberg commit, so a manifest only ever lists committed
files. The cleanup deletes exactly the listed files; one that fails part-way leaves files
whose replay the merge ignores (it is idempotent). Files in no manifest are never deleted.
"""

import json
from datetime import UTC, datetime

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import batched, list_keys

DELETE_BATCH = 1000  # S3's DeleteObjects limit
# Files listed by each manifest read so far, by (bucket, key, ETag): a manifest is never rewritten, so a sync
# cycle reads only the manifests that are new since the last, however long their cleanup waits.
_manifest_files: dict[tuple[str, str, str], list[str]] = {}


class ManifestError(ValueError):
    pass


def write_commit_manifest(s3, layout: SourceLayout, run_id: str, keys: list[str], table: str, snapshot_id: int | None, files_prefix: str | None = None) -> str:
    """Records the files a commit consumed; every one must lie under `files_prefix` (default: the change files)."""
    files_prefix = files_prefix or layout.changes_prefix
    for key in keys:
        if not key.startswith(files_prefix):
            raise ManifestError(f"{key!r} is not under {files_prefix!r}")
    manifest_key = f"{layout.manifests_prefix}{run_id}.json"
    manifest = {
        "bucket": layout.bucket,
        "files_prefix": files_prefix,
        "table": table,
        "snapshot_id": snapshot_id,
        "run_id": run_id,
        "committed_at": datetime.now(UTC).isoformat(),
        "files": sorted(keys),
    }
    s3.put_object(Bucket=layout.bucket, Key=manifest_key, Body=json.dumps(manifest).encode("utf-8"), ContentType="application/json")
    return manifest_key


def read_commit_manifest(s3, bucket: str, manifest_key: str) -> dict:
    body = s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read()
    manifest = json.loads(body)
    prefix = manifest.get("files_prefix", "")
    # Manifests live at <source>/_manifests/: the files they name must lie inside that same source.
    source_prefix = manifest_key.split("/_manifests/", 1)[0] + "/"
    inside = prefix.startswith(source_prefix) and "/_manifests/" not in prefix
    if manifest.get("bucket") != bucket or not inside or any(not key.startswith(prefix) for key in manifest["files"]):
        raise ManifestError(f"manifest s3://{bucket}/{manifest_key} lists files outside its source prefix; refusing to delete")
    return manifest


def committed_files(s3, layout: SourceLayout) -> set[str]:
    """Files committed by merges whose cleanup has not happened yet. A manifest that a cleanup deletes between
    the listing and the read is skipped: the cleanup deleted its files first, so they are gone too."""
    listed = {(layout.bucket, obj["Key"], obj["ETag"]) for obj in list_keys(s3, layout.bucket, layout.manifests_prefix)}
    # Manifests cleaned up since are forgotten, so the cache holds no more than the prefix does.
    for bucket, key, etag in list(_manifest_files):
        if bucket == layout.bucket and key.startswith(layout.manifests_prefix) and (bucket, key, etag) not in listed:
            del _manifest_files[bucket, key, etag]
    committed: set[str] = set()
    for entry in sorted(listed):
        if entry not in _manifest_files:
            try:
                _manifest_files[entry] = read_commit_manifest(s3, layout.bucket, entry[1])["files"]
            except s3.exceptions.NoSuchKey:
                continue
        committed.update(_manifest_files[entry])
    return committed


def delete_committed_files(s3, bucket: str, manifest_key: str) -> int:
    """Deletes the files a manifest lists, then the manifest. Idempotent."""
    try:
        manifest = read_commit_manifest(s3, bucket, manifest_key)
    except s3.exceptions.NoSuchKey:
        return 0  # already cleaned up by an earlier attempt
    deleted = 0
    for chunk in batched(manifest["files"], DELETE_BATCH):
        response = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in chunk], "Quiet": True})
        if response.get("Errors"):
            first = response["Errors"][0]
            raise RuntimeError(f"could not delete {len(response['Errors'])} files, e.g. {first['Key']}: {first.get('Message')}")
        deleted += len(chunk)
    s3.delete_object(Bucket=bucket, Key=manifest_key)
    return deleted

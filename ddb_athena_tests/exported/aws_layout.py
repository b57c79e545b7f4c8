"""Export files in AWS's documented layout, written by the tests (moto writes neither manifests
nor incremental lines).

<prefix>/AWSDynamoDB/<export-id>/manifest-summary.json   itemCount, manifestFilesS3Key, exportType, ...
<prefix>/AWSDynamoDB/<export-id>/manifest-files.json     one JSON line per data file: dataFileS3Key, itemCount, md5Checksum, etag
<prefix>/AWSDynamoDB/<export-id>/data/<name>.json.gz     gzipped lines: {"Item": ...} (full) or
                                                         {"Metadata": ..., "Keys": ..., "NewImage": ..., "OldImage": ...} (incremental)
"""

import gzip
import hashlib
import json
import uuid
from datetime import UTC, datetime


def full_line(item: dict) -> str:
    return json.dumps({"Item": item})


def incremental_line(item: dict | None, keys: dict, written_at: datetime, old_image: dict | None = None) -> str:
    """A put (item given) or a delete (item None) in the incremental layout."""
    line = {"Metadata": {"WriteTimestampMicros": {"N": str(int(written_at.timestamp() * 1_000_000))}}, "Keys": keys}
    if item is not None:
        line["NewImage"] = item
    if old_image is not None:
        line["OldImage"] = old_image
    return json.dumps(line)


def gzip_lines(lines: list[str]) -> bytes:
    return gzip.compress("".join(line + "\n" for line in lines).encode(), compresslevel=1)


def write_export(
    s3, bucket: str, prefix: str, files: list[list[str]], export_type: str = "FULL_EXPORT", manifest: bool = True, raw: dict | None = None
) -> dict:
    """Writes data files (each a list of lines, or raw bytes under `raw`) and, optionally, the manifests.
    Returns {"export_dir", "data_files", "data_file_items", "item_count"}."""
    export_id = f"{int(datetime.now(UTC).timestamp() * 1000):014d}-{uuid.uuid4().hex[:8]}"
    export_dir = f"{prefix.rstrip('/')}/AWSDynamoDB/{export_id}"
    entries, data_files = [], []
    bodies = [(gzip_lines(lines), len(lines)) for lines in files] + [(body, count) for body, count in (raw or {}).values()]
    for body, count in bodies:
        key = f"{export_dir}/data/{uuid.uuid4().hex[:26]}.json.gz"
        etag = s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"].strip('"')
        data_files.append(key)
        entries.append({"itemCount": count, "md5Checksum": hashlib.md5(body).hexdigest(), "etag": etag, "dataFileS3Key": key})
    item_count = sum(entry["itemCount"] for entry in entries)
    if manifest:
        files_key = f"{export_dir}/manifest-files.json"
        s3.put_object(Bucket=bucket, Key=files_key, Body="".join(json.dumps(entry) + "\n" for entry in entries).encode())
        summary = {
            "version": "2023-08-01",
            "exportArn": f"arn:aws:dynamodb:us-east-1:123456789012:table/orders/export/{export_id}",
            "startTime": "2026-11-21T00:05:00.000Z",
            "endTime": "2026-11-21T00:12:00.000Z",
            "tableArn": "arn:aws:dynamodb:us-east-1:123456789012:table/orders",
            "tableId": "b1a2c3d4-0000-4000-8000-000000000000",
            "exportTime": "2026-11-21T00:00:00.000Z",
            "s3Bucket": bucket,
            "s3Prefix": prefix,
            "s3SseAlgorithm": "AES256",
            "s3SseKmsKeyId": None,
            "manifestFilesS3Key": files_key,
            "billedSizeBytes": sum(len(body) for body, _ in bodies),
            "itemCount": item_count,
            "outputFormat": "DYNAMODB_JSON",
            "exportType": export_type,
        }
        s3.put_object(Bucket=bucket, Key=f"{export_dir}/manifest-summary.json", Body=json.dumps(summary).encode())
        s3.put_object(Bucket=bucket, Key=f"{export_dir}/_started", Body=b"")
    return {
        "export_dir": export_dir + "/",
        "data_files": data_files,
        "data_file_items": [entry["itemCount"] for entry in entries],
        "item_count": item_count,
    }

"""A table put back as it was at a point in time, from the versioned bucket (deploy/ddb_athena.yaml: versioning, and
WarehouseRecoveryDays of versions no longer current). Every object under the table's location becomes what it was
then (a version copied back over a later one, a delete marker over an object written since: nothing is deleted for
good, so a restore can itself be undone by another), and the catalog points at the metadata that was current then.

boto3 only: no Spark, no Dagster. `ddb-athena restore-table` runs it holding the table's writer lease."""

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

# Iceberg names a table's metadata files <sequence>-<uuid>.metadata.json (a catalog's commits) or v<sequence>.metadata.json
# (a Hadoop catalog's); the sequence orders them.
_METADATA_FILE = re.compile(r"(?:v?(\d+))(?:-[0-9a-f-]+)?\.metadata\.json")


class RecoveryError(RuntimeError):
    """A restore that cannot be done as asked; the message says why and what to do."""


@dataclass
class RestorePlan:
    """What a restore changes under a table's location: each key's version to copy back, each key to hide."""

    bucket: str
    prefix: str
    at: datetime
    copy_back: dict[str, str] = field(default_factory=dict)  # key -> the version current at `at`
    hide: list[str] = field(default_factory=list)  # keys written since `at`, live now
    metadata_file: str | None = None  # the table's metadata current at `at`, as a key

    @property
    def changes(self) -> int:
        return len(self.copy_back) + len(self.hide)


def _versions(s3, bucket: str, prefix: str) -> Iterator[dict]:
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for version in page.get("Versions", []):
            yield {**version, "deleted": False}
        for marker in page.get("DeleteMarkers", []):
            yield {**marker, "deleted": True}


def plan_restore(s3, bucket: str, prefix: str, at: datetime) -> RestorePlan:
    """What makes every object under `prefix` what it was at `at` (an aware datetime)."""
    if s3.get_bucket_versioning(Bucket=bucket).get("Status") != "Enabled":
        raise RecoveryError(f"s3://{bucket} is not versioned: there is no earlier version to restore (deploy/ddb_athena.yaml versions the bucket it creates)")
    by_key: dict[str, list[dict]] = {}
    for version in _versions(s3, bucket, prefix):
        by_key.setdefault(version["Key"], []).append(version)
    plan = RestorePlan(bucket, prefix, at)
    metadata_at: list[tuple[int, datetime, str]] = []
    for key, versions in by_key.items():
        versions.sort(key=lambda version: version["LastModified"])
        then = [version for version in versions if version["LastModified"] <= at]
        current_then = then[-1] if then and not then[-1]["deleted"] else None
        latest = versions[-1]
        if current_then is None and not latest["deleted"]:
            plan.hide.append(key)
        elif current_then is not None and current_then["VersionId"] != latest["VersionId"]:
            plan.copy_back[key] = current_then["VersionId"]
        name = _METADATA_FILE.fullmatch(key.rsplit("/", 1)[-1])
        if current_then is not None and "/metadata/" in key and name:
            metadata_at.append((int(name.group(1)), current_then["LastModified"], key))
    if not by_key:
        raise RecoveryError(f"nothing under s3://{bucket}/{prefix}: not a table's location")
    if metadata_at:
        plan.metadata_file = max(metadata_at)[2]
    return plan


def copy_back(s3, plan: RestorePlan) -> None:
    """Each version current at the plan's time copied back over a later one (a table's deleted files, mostly)."""
    for key, version_id in sorted(plan.copy_back.items()):
        s3.copy_object(Bucket=plan.bucket, Key=key, CopySource={"Bucket": plan.bucket, "Key": key, "VersionId": version_id})


def hide_later_objects(s3, plan: RestorePlan) -> None:
    """What was written since the plan's time, hidden behind a delete marker (its versions stay, for an undo)."""
    for key in sorted(plan.hide):
        s3.delete_object(Bucket=plan.bucket, Key=key)


def table_location(glue, database: str, table: str) -> str:
    """The table's location (s3://bucket/prefix), from the metadata its Glue entry points at."""
    try:
        parameters = glue.get_table(DatabaseName=database, Name=table)["Table"].get("Parameters", {})
    except glue.exceptions.EntityNotFoundException:
        raise RecoveryError(f"no table {database}.{table} in the Glue catalog") from None
    location = parameters.get("metadata_location", "")
    if "/metadata/" not in location:
        raise RecoveryError(f"{database}.{table} is not an Iceberg table of the Glue catalog (no metadata_location)")
    return location.rsplit("/metadata/", 1)[0]


def point_catalog_at(glue, database: str, table: str, metadata_uri: str) -> str:
    """Points the table's Glue entry at `metadata_uri`, as an Iceberg commit does (the previous one kept beside it;
    refused if the entry changed meanwhile). Returns the location it pointed at before."""
    entry = glue.get_table(DatabaseName=database, Name=table)["Table"]
    parameters = dict(entry.get("Parameters", {}))
    previous = parameters.get("metadata_location", "")
    parameters.update(metadata_location=metadata_uri, previous_metadata_location=previous)
    table_input = {name: entry[name] for name in ("Name", "Description", "Owner", "Retention", "StorageDescriptor", "TableType") if name in entry}
    glue.update_table(DatabaseName=database, TableInput={**table_input, "Parameters": parameters}, VersionId=entry["VersionId"])
    return previous


def read_metadata(s3, bucket: str, key: str) -> dict:
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def restore_glue_table(s3, glue, database: str, table: str, at: datetime, apply: bool = True) -> tuple[RestorePlan, str | None]:
    """`database.table` (Glue) as it was at `at`: its files, then its catalog entry. Returns the plan and, when
    applied, the metadata the entry pointed at before (what another restore or a rollback would go back to)."""
    location = table_location(glue, database, table)
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    plan = plan_restore(s3, bucket, prefix.rstrip("/") + "/", at)
    if plan.metadata_file is None:
        raise RecoveryError(f"{database}.{table} had no metadata at {at.isoformat()}: it did not exist yet, or its versions have expired")
    if not apply:
        return plan, None
    # The files of then first, then the catalog, then what came since: a query never plans on a file not there.
    copy_back(s3, plan)
    previous = point_catalog_at(glue, database, table, f"s3://{bucket}/{plan.metadata_file}")
    hide_later_objects(s3, plan)
    return plan, previous

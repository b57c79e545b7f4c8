"""The writer lease's record (ddb_athena/lib/writer_lease.py): what a lease object holds and how old it is. Standard
library only: a Spark job reads it too, through its own file system, where boto3 may not be."""

import json
import os
import socket
from datetime import datetime

LEASE_PREFIX = "_writer_leases/"


def lease_key(table: str) -> str:
    return f"{LEASE_PREFIX}{table}.json"


def lease_body(holder: str, table: str, ttl_seconds: float, now: datetime, token: str | None = None) -> bytes:
    """`token` names one holding of the lease (a holder renewing writes the same one)."""
    return json.dumps(
        {
            "holder": holder,
            "token": token,
            "table": table,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "renewed_at": now.isoformat(timespec="milliseconds"),  # every write differs, and so does its ETag
            "ttl_seconds": ttl_seconds,
        }
    ).encode("utf-8")


def describe_holder(body: dict) -> str:
    return f"{body.get('holder', 'an unknown writer')} on {body.get('host', '?')} (pid {body.get('pid', '?')}), renewed {body.get('renewed_at', '?')}"


def seconds_since_renewal(body: dict, now: datetime) -> float | None:
    """By the reader's wall clock; None when the record does not say."""
    try:
        return (now - datetime.fromisoformat(body["renewed_at"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def not_held_by(body: dict | None, holder: str, ttl_seconds: float, now: datetime) -> str | None:
    """Why the lease is not (or no longer) `holder`'s, or None when it is: held by it and renewed within twice its time
    to live (the margin absorbs clock skew between hosts)."""
    if body is None:
        return "nobody holds it"
    if body.get("holder") != holder:
        return f"it is held by {describe_holder(body)}"
    age = seconds_since_renewal(body, now)
    if age is None or age > 2 * ttl_seconds:
        return f"{holder} has not renewed it since {body.get('renewed_at')}"
    return None

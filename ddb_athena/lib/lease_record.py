"""The writer lease's record (ddb_athena/lib/writer_lease.py): what a lease object holds and how old it is. Standard
library only: a Spark job reads it too, through its own file system, where boto3 may not be."""

import json
import os
import socket
from datetime import datetime

LEASE_PREFIX = "_writer_leases/"


def lease_key(table: str) -> str:
    return f"{LEASE_PREFIX}{table}.json"


def lease_body(holder: str, table: str, ttl_seconds: float, now: datetime, token: str | None = None, epoch: int = 0, released: bool = False) -> bytes:
    """`token` names one holding of the lease (a holder renewing writes the same one); `epoch` orders the holdings (each
    takes the one before it plus one, so a writer's fence can tell a successor's from a predecessor's). A released
    lease stays, marked `released`, so that the next holding's epoch follows it."""
    return json.dumps(
        {
            "holder": holder,
            "token": token,
            "epoch": epoch,
            "released": released,
            "table": table,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "renewed_at": now.isoformat(timespec="milliseconds"),  # every write differs, and so does its ETag
            "ttl_seconds": ttl_seconds,
        }
    ).encode("utf-8")


def epoch_of(body: dict | None) -> int:
    """A holding's epoch; 0 for a lease written before leases had one."""
    return int((body or {}).get("epoch") or 0)


def describe_holder(body: dict) -> str:
    if body.get("released"):
        return f"nobody (released by {body.get('holder', 'an unknown writer')})"
    return f"{body.get('holder', 'an unknown writer')} on {body.get('host', '?')} (pid {body.get('pid', '?')}), renewed {body.get('renewed_at', '?')}"


def not_held_by(body: dict | None, holder: str, token: str | None) -> str | None:
    """Why the lease is not (or no longer) this holding's (`holder`, and `token` when known), or None when it is. No
    clock is read: another holding's takeover shows in the record, and one whose lease merely lapsed with nobody
    taking it over loses nothing by committing (the fence, lake/writer_branch.py, refuses a writer taken over)."""
    if body is None or body.get("released"):
        return "nobody holds it"
    if body.get("holder") != holder or (token is not None and body.get("token") != token):
        return f"it is held by {describe_holder(body)}"
    return None

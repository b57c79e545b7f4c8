"""A bootstrap beside live writes publishes a table that is never older than its scan: compared key by key with
DynamoDB's history right after the bootstrap's commit (it used to apply the stream's retained day on top of the scan,
one interval at a time, moving keys back and bringing deleted ones back until it caught up)."""

import itertools
import random
import threading

from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed import cycle as books_cycle
from ddb_athena.streamed.capture import bootstrap
from ddb_athena.streamed.cycle import StreamSync

KEYS = [f"book-{number:03d}" for number in range(150)]
# Beside the bootstrap, a pace that changes many keys while the scan reads them; as fast as the emulator takes writes,
# the stream it must read through grows as fast as it reads, and one bootstrap takes minutes.
WRITES_PER_SECOND = 50


class RandomWrites(threading.Thread):
    """Puts and deletes on KEYS, WRITES_PER_SECOND while it runs, each logged (key, name or None) once it returned."""

    def __init__(self, dynamodb, table: str):
        super().__init__(daemon=True)
        self._dynamodb, self._table = dynamodb, table
        self.log: list[tuple[str, str | None]] = []
        self.stop = threading.Event()
        self._random = random.Random(42)
        self._numbers = itertools.count()

    def run(self) -> None:
        while not self.stop.wait(1 / WRITES_PER_SECOND):
            self.write()

    def write(self) -> None:
        key, name = self._next_write(self._random.choice(KEYS))
        if name is None:
            self._dynamodb.delete_item(TableName=self._table, Key={"id": {"S": key}})
        else:
            self._dynamodb.put_item(TableName=self._table, Item={"id": {"S": key}, "name": {"S": name}})
        self.log.append((key, name))

    def write_batch(self) -> None:
        """25 writes of distinct keys in one request (one write per key: their order in it does not matter)."""
        writes = [self._next_write(key) for key in self._random.sample(KEYS, 25)]
        requests = [
            {"DeleteRequest": {"Key": {"id": {"S": key}}}} if name is None else {"PutRequest": {"Item": {"id": {"S": key}, "name": {"S": name}}}}
            for key, name in writes
        ]
        assert not self._dynamodb.batch_write_item(RequestItems={self._table: requests})["UnprocessedItems"]
        self.log.extend(writes)

    def _next_write(self, key: str) -> tuple[str, str | None]:
        return key, None if self._random.random() < 0.2 else f"write-{next(self._numbers)}"


def never_older_than(log: list[tuple[str, str | None]], scan_started_at: int, scanned: dict[str, tuple[str, int]]) -> dict[str, set]:
    """Per key, the states it may show. A key the scan read: the state it read, or any written from where the log was
    when the scan requested its page (a write that returned before had to be read). A key the scan did not find (absent
    then): the state it had when the scan started (None: absent), or any written after."""
    allowed: dict[str, set] = {key: {None} for key in KEYS}
    for key, name in log[:scan_started_at]:
        allowed[key] = {name}
    for key, name in log[scan_started_at:]:
        allowed[key].add(name)
    for key, (name, fetched_at) in scanned.items():
        allowed[key] = {name} | {later for written, later in log[fetched_at:] if written == key}
    return allowed


def test_a_bootstrap_beside_writes_never_publishes_a_key_older_than_its_scan(spark, settings, monkeypatch):
    dynamodb = settings.client("dynamodb")
    writes = RandomWrites(dynamodb, settings.dynamodb_tables["books"])
    for _ in range(120):  # a retained stream many captures long: 3,000 writes, 20 per key on average
        writes.write_batch()
    scan_started_at: list[int] = []
    scan = books_cycle.bootstrap_snapshot

    def recording_scan(*args, **kwargs):
        scan_started_at.append(len(writes.log))
        return scan(*args, **kwargs)

    scanned: dict[str, tuple[str, int]] = {}
    page_requested_at: list[int] = []
    read_table = bootstrap.scan_table

    def note_page_request(**_) -> None:
        # Where the log was as the Scan request left: every write logged by then had returned, so the page shows it.
        # (Taken when an item is yielded instead, it counts writes made while earlier items of the page were handled.)
        page_requested_at.append(len(writes.log))

    def recording_table_scan(dynamodb_client, table_name):
        for item in read_table(dynamodb_client, table_name):
            scanned[item["id"]["S"]] = (item["name"]["S"], page_requested_at[-1])
            yield item

    dynamodb.meta.events.register("before-call.dynamodb.Scan", note_page_request)
    monkeypatch.setattr(books_cycle, "bootstrap_snapshot", recording_scan)
    monkeypatch.setattr(bootstrap, "scan_table", recording_table_scan)
    table = f"{settings.namespace}.books"
    sync = StreamSync(
        dynamodb,
        settings.client("dynamodbstreams"),
        settings.client("s3"),
        lambda: spark,
        "s3a",
        settings.dynamodb_tables["books"],
        table,
        SourceLayout(settings.bucket, "books_source"),
        log=print,
        warn=print,
        capture_seconds=0.2,  # a capture far shorter than the retained stream takes to read, as on a busy table
        spec=declared("books").spec,
    )
    writes.start()
    try:
        outcome = sync.cycle("bootstrap-beside-writes", bootstrap=True)
    finally:
        writes.stop.set()
        writes.join()
    assert outcome.merged["bootstrap_file"] and scan_started_at
    rows = {row["id"]: row["name"] for row in spark.table(table).collect()}
    assert scanned  # compared with what the scan read of each key, not only with its start
    allowed = never_older_than(writes.log, scan_started_at[0], scanned)
    behind = {key: rows.get(key) for key in KEYS if rows.get(key) not in allowed[key]}
    assert not behind, f"{len(behind)} keys older than the scan, e.g. {sorted(behind.items())[:5]}"
    assert len(writes.log) > 3000  # writes went on during the bootstrap

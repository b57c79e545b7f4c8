"""Emulator state the export tests need, and a DynamoDB client that stands in where moto cannot."""

from datetime import datetime


def pitr_holds_since(settings, moment: datetime) -> None:
    """Point-in-time recovery of the orders table reaches back to `moment`, as on a table that has had it on
    for weeks (moto sets the earliest restorable time to the moment PITR was turned on). The emulator runs in
    this process, so its state is set directly."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.dynamodb.models import dynamodb_backends

    table = dynamodb_backends[DEFAULT_ACCOUNT_ID][settings.region].get_table(settings.dynamodb_tables["orders"])
    table.continuous_backups["PointInTimeRecoveryDescription"]["EarliestRestorableDateTime"] = moment.timestamp()


class ScriptedExports:
    """Wraps a real client; DescribeExport answers from a script of statuses (moto finishes at once and never fails)."""

    def __init__(self, client, statuses: list[str], failure: tuple[str, str] | None = None):
        self._client, self._statuses, self._failure = client, list(statuses), failure
        self.requests: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def export_table_to_point_in_time(self, **arguments):
        self.requests.append(arguments)
        # moto ignores the incremental specification (and writes a full export); AWS answers IN_PROGRESS.
        response = self._client.export_table_to_point_in_time(**{k: v for k, v in arguments.items() if k != "IncrementalExportSpecification"})
        response["ExportDescription"]["ExportStatus"] = "IN_PROGRESS"
        return response

    def describe_export(self, ExportArn):
        description = self._client.describe_export(ExportArn=ExportArn)
        status = self._statuses.pop(0) if len(self._statuses) > 1 else self._statuses[0]
        description["ExportDescription"]["ExportStatus"] = status
        if status == "FAILED" and self._failure:
            description["ExportDescription"].update(FailureCode=self._failure[0], FailureMessage=self._failure[1])
        return description

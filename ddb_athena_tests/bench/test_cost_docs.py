"""docs/cost.md as `make bench-cost WRITE_DOCS=1` writes it, from a measured cell: every section there, the deployment's
whole bill, the runs it prices, the network's alternative, the free tiers in a column of their own; and the commit
each cell was measured on."""

import subprocess

import pytest

from ddb_athena_bench import bill as billing
from ddb_athena_bench import cost
from ddb_athena_tests.bench.test_bill import _measurement


def _cell(**changes) -> dict:
    return {
        **_measurement(),
        "rate": 230.0,
        "interval_seconds": 30.0,
        "vcpu": 0.5,
        "memory_gb": 3.0,
        "minutes": 60.0,
        "cycles": 120,
        "cycles_behind": 0,
        "freshness_seconds": {"p95": 40.0, "max": 70.0},
        "sync_cpu_seconds_per_minute": {"python": 2.0, "jvm_and_workers": 10.0},
        "cpu_throttled_seconds": 300.0,
        "peak_pss_mib": {"jvm_and_workers": 2100.0},
        "measured_at": "2026-11-29T05:00:00+00:00",
        "code": "abc1234",
        "maintenance_interval_minutes": 15.0,
        **changes,
    }


def test_the_generated_page_bills_everything_the_deployment_runs():
    page = cost.docs([_cell(), _cell(interval_seconds=20.0, freshness_seconds={"p95": 28.0, "max": 50.0})])
    for heading in ("## The dial", "## The floor", "## Line by line", "## The platform", "## Everything the deployment runs", "## The network", "## Prices"):
        assert heading in page, heading
    # Spot at the quoted share and at the worse one, in the dial and in the whole bill.
    assert "Spot at a 0.5 share" in page and "| Spot, Graviton |" in page
    # Every run a schedule or sensor starts is in the page with where it is priced.
    for ending in billing.PRICED_RUNS:
        assert f"`*{ending}`" in page
    lines = (
        "key parity runs' tasks",
        "compute logs in S3",
        "freshness checks",
        "its master password: an RDS-managed secret",
        "alarms on the platform task, the database and the alerts' delivery",
        "the image in ECR",
    )
    for line in lines:
        assert f"| {line} |" in page, line
    assert "NAT gateway, one Availability Zone" in page
    # The stream's reads at this volume are within the always-free 2.5 million GetRecords: the column says so.
    (streams,) = [row for row in page.splitlines() if row.startswith("| Streams GetRecords |")]
    usd, free = (float(cell) for cell in streams.split("|")[2:4])
    assert free == usd > 0
    # The targets are judged where the p95 is within them.
    assert "30 USD on Spot at p95 <= 30 s" in page


@pytest.mark.subprocess
def test_a_cell_is_marked_measured_on_changed_code_by_a_tracked_file_not_by_what_the_bench_itself_writes(tmp_path, monkeypatch):
    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args]
        return subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    (tmp_path / "docs").mkdir()
    for name in ("docs/cost.md", "docs/cost-cells.json", "setup.py"):
        (tmp_path / name).write_text("first\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    monkeypatch.setattr(cost, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(cost, "RESULTS", tmp_path / "docs" / "cost-cells.json")
    monkeypatch.setattr(cost, "DOCS", tmp_path / "docs" / "cost.md")
    head = git("rev-parse", "--short", "HEAD")
    # The bench writes the cells and the page as it measures: still the commit measured.
    for name in ("docs/cost.md", "docs/cost-cells.json"):
        (tmp_path / name).write_text("measured\n")
    assert cost._code_version() == head
    (tmp_path / "setup.py").write_text("changed\n")
    assert cost._code_version() == f"{head} with changes"

"""The one price table the bill (`bill.py`, `make bench-cost`) is computed from: AWS list prices in us-east-1, each with
its unit, where it was read and when. A price changes here and nowhere else; `docs/cost.md` is generated from it.

Free tiers are per account, shared with everything else the account runs: the bill shows what the always-free ones
would cover (`FREE_TIERS`) in a column of its own and never takes them off a total.
"""

from dataclasses import dataclass

HOURS_A_MONTH = 730.0
SECONDS_A_MONTH = HOURS_A_MONTH * 3600


@dataclass(frozen=True)
class Price:
    usd: float
    unit: str
    source: str
    # When the price was read at its source (or, for a quote, the quote's date).
    as_of: str


FARGATE = "https://aws.amazon.com/fargate/pricing/"
S3 = "https://aws.amazon.com/s3/pricing/"
DYNAMODB = "https://aws.amazon.com/dynamodb/pricing/on-demand/"

PRICES: dict[str, Price] = {
    "fargate_x86_vcpu_hour": Price(0.04048, "vCPU-hour", f"{FARGATE} (0.000011244 USD per vCPU-second, as transcribed 2026-09-20)", "2026-09-20"),
    "fargate_x86_gb_hour": Price(0.004445, "GB-hour", FARGATE, "2026-03-01"),
    "fargate_arm_vcpu_hour": Price(0.03238, "vCPU-hour", f"{FARGATE} (Linux/ARM, 20% under x86)", "2026-03-01"),
    "fargate_arm_gb_hour": Price(0.00356, "GB-hour", f"{FARGATE} (Linux/ARM)", "2026-03-01"),
    # Spot's price moves with supply and demand; AWS states "up to 70%" off. The last published rates quoted with a date:
    # 0.01334053 USD a vCPU-hour and 0.00146489 a GB-hour against 0.04048 and 0.004445 on demand (eu-west-1), a share
    # of 0.33; a June 2026 review of the page puts the discount between 50% and 70%, 70% the ceiling. The bill also
    # prices Spot at SPOT_SHARE_WORSE.
    "fargate_spot_share": Price(
        0.33,
        "share of the on-demand price",
        f"{FARGATE} (its live Spot table); dated: https://tomgregory.com/aws-fargate-spot-vs-fargate-price-comparison/ (the rates "
        "above, 2020), https://fortem.dev/fargate-spot/ (50-70% off, June 2026)",
        "2026-06-01",
    ),
    "public_ipv4_hour": Price(0.005, "public IPv4 address-hour", "https://aws.amazon.com/vpc/pricing/ (since 2024-02-01)", "2026-03-01"),
    "s3_put_class": Price(0.005 / 1000, "PUT, COPY, POST or LIST request", S3, "2026-03-01"),
    "s3_get_class": Price(0.0004 / 1000, "GET, SELECT or HEAD request (DELETE is free)", S3, "2026-03-01"),
    "s3_storage_gb_month": Price(0.023, "GB-month, S3 Standard, first 50 TB", S3, "2026-03-01"),
    "streams_get_records": Price(0.02 / 100_000, "GetRecords call (one streams read request unit)", DYNAMODB, "2025-11-01"),
    "dynamodb_read_unit": Price(0.125 / 1_000_000, "on-demand read request unit (4 KB strongly, 8 KB eventually consistent)", DYNAMODB, "2024-11-01"),
    "glue_request": Price(1.0 / 1_000_000, "Data Catalog request", "https://aws.amazon.com/glue/pricing/", "2026-03-01"),
    "lambda_request": Price(0.20 / 1_000_000, "invocation", "https://aws.amazon.com/lambda/pricing/", "2026-03-01"),
    "lambda_arm_gb_second": Price(0.0000133334, "GB-second, arm64", "https://aws.amazon.com/lambda/pricing/", "2026-03-01"),
    "cloudwatch_logs_ingest_gb": Price(0.50, "GB of logs ingested", "https://aws.amazon.com/cloudwatch/pricing/", "2026-03-01"),
    "cloudwatch_logs_storage_gb_month": Price(0.03, "GB-month of logs stored (compressed)", "https://aws.amazon.com/cloudwatch/pricing/", "2026-03-01"),
    "cloudwatch_alarm_month": Price(0.10, "standard-resolution alarm-month (one metric)", "https://aws.amazon.com/cloudwatch/pricing/", "2026-03-01"),
    "rds_postgres_t4g_micro_hour": Price(
        0.016, "db.t4g.micro instance-hour, PostgreSQL, single-AZ", "https://aws.amazon.com/rds/postgresql/pricing/", "2026-03-01"
    ),
    "rds_gp3_gb_month": Price(0.115, "GB-month of gp3 storage", "https://aws.amazon.com/rds/postgresql/pricing/", "2026-03-01"),
    "secrets_manager_secret_month": Price(0.40, "secret-month", "https://aws.amazon.com/secrets-manager/pricing/", "2026-03-01"),
    "secrets_manager_call": Price(0.05 / 10_000, "API call", "https://aws.amazon.com/secrets-manager/pricing/", "2026-03-01"),
    "ecr_storage_gb_month": Price(0.10, "GB-month of images stored (compressed)", "https://aws.amazon.com/ecr/pricing/", "2026-03-01"),
    "nat_gateway_hour": Price(0.045, "NAT gateway-hour", "https://aws.amazon.com/vpc/pricing/", "2026-03-01"),
    "nat_gateway_gb": Price(0.045, "GB processed by a NAT gateway", "https://aws.amazon.com/vpc/pricing/", "2026-03-01"),
    "firehose_iceberg_gb": Price(0.075, "GB ingested into Apache Iceberg tables", "https://aws.amazon.com/firehose/pricing/ (as quoted, 2025)", "2025-06-01"),
}

# A worse Spot share than the quoted one, for the row that asks what the default costs if Spot's discount shrinks.
SPOT_SHARE_WORSE = 0.5

# The always-free allowances a month (not the first year's), by the price they apply to: per account, shared with
# whatever else the account runs.
FREE_TIERS: dict[str, tuple[float, str]] = {
    "streams_get_records": (2_500_000, "DynamoDB Streams: 2.5 million GetRecords a month"),
    "glue_request": (1_000_000, "Glue Data Catalog: the first million requests a month"),
    "lambda_request": (1_000_000, "Lambda: a million invocations a month"),
    "lambda_arm_gb_second": (400_000, "Lambda: 400,000 GB-seconds a month"),
    "cloudwatch_logs_ingest_gb": (5, "CloudWatch Logs: 5 GB of ingestion a month (and 5 GB stored)"),
    "cloudwatch_alarm_month": (10, "CloudWatch: 10 standard-resolution alarms"),
}

# The yardstick: the original author's Firehose quote for 20 GB a day, without transformation.
FIREHOSE_QUOTE_USD_A_MONTH = 33.46


def price(name: str) -> float:
    return PRICES[name].usd

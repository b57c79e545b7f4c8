#!/usr/bin/env bash
# The local stack: AWS emulator, demo tables with data, a gentle simulator, and `dagster dev`
# with the schedules and sensors running. Ctrl-C stops everything started here.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PORT="${DDB_ATHENA_LOCAL_PORT:-5055}"
export DDB_ATHENA_PROFILE="${DDB_ATHENA_PROFILE:-local}"
export AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL:-http://127.0.0.1:$PORT}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-testing}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-testing}"
export AWS_REGION="${AWS_REGION:-us-east-1}"
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/.dagster_home}"
DAGSTER_PORT="${DAGSTER_PORT:-3000}"
# Dates in Python, not `date -d` (GNU only): the first orders partition is yesterday (UTC), and so is the
# partitions' start, unless set: the demo shows the partition it materializes, not weeks of empty ones.
YESTERDAY="$($BIN/python -c 'from ddb_athena.dev.launch import yesterday_utc; print(yesterday_utc())')"
export DDB_ATHENA_ORDERS_START_DATE="${DDB_ATHENA_ORDERS_START_DATE:-$YESTERDAY}"
mkdir -p "$DAGSTER_HOME" .ddb_athena/logs
cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"
# A run an earlier stack left STARTED (its process gone) would hold the books schedule for its max runtime.
$BIN/ddb-athena end-runs-left-in-progress
# One writer run per table from the daemon's first pass (dagster.yaml's default limit applies only from its second).
$BIN/ddb-athena writer-pools

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo "Stopping the local stack..."
  # Ctrl-C reached the sync run too: it ends after its cycle. The emulator it writes to stays up until then.
  $BIN/ddb-athena wait-for-runs --timeout 60 || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

$BIN/ddb-athena local-stack --port "$PORT" > .ddb_athena/logs/local-stack.log 2>&1 &
pids+=($!)
$BIN/python -c "from ddb_athena.dev.local_stack import wait_for_endpoint; wait_for_endpoint('$AWS_ENDPOINT_URL')"
# The emulator starts empty, so its Iceberg tables' history would point at vanished S3 files.
rm -rf .ddb_athena/warehouse
$BIN/ddb-athena init
$BIN/ddb-athena seed --books 50 --orders 100
$BIN/ddb-athena simulate --rate "${DDB_ATHENA_SIMULATE_RATE:-1}" > .ddb_athena/logs/simulate.log 2>&1 &
pids+=($!)
echo "Simulator writing to DynamoDB (log: .ddb_athena/logs/simulate.log)"
# The first orders partition: a full export of the seeded orders, loaded into library.orders. Launched through
# the webserver once it serves the code location, so the run is the UI's instance's own (queued by its daemon)
# and no second process initializes a fresh DAGSTER_HOME's storage at the same moment as `dagster dev`.
$BIN/ddb-athena launch orders_daily --partition "$YESTERDAY" --url "http://127.0.0.1:$DAGSTER_PORT" --ready-timeout 600 --follow \
  > .ddb_athena/logs/orders-first-partition.log 2>&1 &
pids+=($!)
echo "The first orders partition ($YESTERDAY) is launched once Dagster is up (log: .ddb_athena/logs/orders-first-partition.log)"
echo "Dagster UI: http://127.0.0.1:$DAGSTER_PORT  (lineage: books_source → books_iceberg, orders_export → orders_athena)"
# In the foreground: a background job of a script starts with SIGINT ignored, and dagster dev would
# never see Ctrl-C. When it has shut down, the trap stops the rest.
$BIN/dagster dev -w workspace.yaml -h 127.0.0.1 -p "$DAGSTER_PORT"

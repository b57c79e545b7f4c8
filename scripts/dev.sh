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
mkdir -p "$DAGSTER_HOME" .ddb_athena/logs
cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo "Stopping the local stack..."
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

$BIN/ddb-athena local-stack --port "$PORT" > .ddb_athena/logs/local-stack.log 2>&1 &
pids+=($!)
$BIN/python -c "from ddb_athena.local_stack import wait_for_endpoint; wait_for_endpoint('$AWS_ENDPOINT_URL')"
# The emulator starts empty, so its Iceberg tables' history would point at vanished S3 files.
rm -rf .ddb_athena/warehouse
$BIN/ddb-athena init
$BIN/ddb-athena seed --books 50 --orders 100
$BIN/ddb-athena simulate --rate "${DDB_ATHENA_SIMULATE_RATE:-1}" > .ddb_athena/logs/simulate.log 2>&1 &
pids+=($!)
echo "Simulator writing to DynamoDB (log: .ddb_athena/logs/simulate.log)"
# The first orders partition (yesterday, UTC): a full export of orders, loaded into library.orders.
# Recorded in the same Dagster instance, so it shows in the UI beside the books runs.
$BIN/dagster asset materialize -m ddb_athena.definitions --select orders_export,orders_athena \
  --partition "$(date -u -d yesterday +%F)" > .ddb_athena/logs/orders-first-partition.log 2>&1 &
pids+=($!)
echo "Materializing the first orders partition (log: .ddb_athena/logs/orders-first-partition.log)"
echo "Dagster UI: http://127.0.0.1:3000  (lineage: books_source → books_iceberg, orders_export → orders_athena)"
# In the foreground: a background job of a script starts with SIGINT ignored, and dagster dev would
# never see Ctrl-C. When it has shut down, the trap stops the rest.
$BIN/dagster dev -w workspace.yaml -h 127.0.0.1 -p "${DAGSTER_PORT:-3000}"

#!/usr/bin/env bash
# Dagster's platform in one container of one ECS task (deploy/dagster_ecs.yaml): the code server on loopback, then the
# webserver and the daemon, which load the code location from it. Whichever process ends first ends the task (ECS's
# service starts a new one); ECS's SIGTERM (through tini, the image's entry point) is passed on to all three.
set -euo pipefail
children=()
stop() {
  kill -TERM "${children[@]}" 2>/dev/null || true
  wait || true
  exit 0
}
trap stop TERM INT

# An image built offline (DOWNLOADS_OPTIONAL=1) went without its pinned JARs, and its runs would download unpinned
# ones at every start, or on a base named by tag alone: it serves nothing unless told it is a test's
# (DDB_ATHENA_ALLOW_UNPINNED_IMAGE=1).
unpinned=$( (cat "${DDB_ATHENA_JAR_DIR:-/opt/ddb_athena/jars}/not-fetched.txt" /opt/ddb_athena/base-not-pinned.txt 2>/dev/null || true) | tr '\n' ' ')
if [ -n "$unpinned" ] && [ "${DDB_ATHENA_ALLOW_UNPINNED_IMAGE:-0}" != 1 ]; then
  echo "platform: this image was built offline, without what it pins (${unpinned% }): build it where the registries are reachable (docs/operations.md, step 1)" >&2
  exit 1
fi
code_port="${DAGSTER_CODE_SERVER_PORT:-4000}"
webserver_port="${DAGSTER_WEBSERVER_PORT:-3000}"
location=(--grpc-host 127.0.0.1 --grpc-port "$code_port")

# The instance's schema at this image's Dagster version before anything reads it: a no-op when current; a migration
# due only behind the snapshot the deployment names (SchemaMigrationSnapshot), else this start fails and the service
# rolls back to the previous image on the schema it reads (the service stops the old task first: nothing else
# migrates meanwhile).
ddb-athena instance-migrate
# One run at a time in each table writers' pool (idempotent).
ddb-athena writer-pools
# Each start (a deploy, a replacement) shows the alert path works; a failure says so in the log and does not stop the
# platform, whose alarms are CloudWatch's.
ddb-athena test-alert || echo "platform: the test alert could not be sent: alerts may reach nobody" >&2
dagster code-server start -h 127.0.0.1 -p "$code_port" -m ddb_athena.definitions --location-name ddb_athena &
code_server=$!
children+=("$code_server")
for _ in $(seq 150); do
  dagster api grpc-health-check -p "$code_port" >/dev/null 2>&1 && break
  kill -0 "$code_server" 2>/dev/null || { echo "platform: the code server ended before it served" >&2; exit 1; }
  sleep 2
done
dagster api grpc-health-check -p "$code_port" >/dev/null 2>&1 || { echo "platform: the code server did not serve within 300 s" >&2; exit 1; }

dagster-webserver -h 0.0.0.0 -p "$webserver_port" "${location[@]}" &
children+=("$!")
dagster-daemon run "${location[@]}" &
children+=("$!")
wait -n
echo "platform: a process ended; the task ends with it" >&2
exit 1

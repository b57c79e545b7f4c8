"""The platform container's health check (deploy/dagster_ecs.yaml): healthy when its webserver answers and reports
every required daemon healthy (each one's heartbeat in the instance's database), so that ECS replaces a task whose
webserver or daemon hangs, and rolls back a deployment whose tasks never become healthy. The standard library only:
it runs every minute beside the platform in a quarter of a vCPU, and the webserver does the database's part.

    python /opt/ddb_athena/healthcheck.py        # exit 0 healthy, 1 not (saying why)
"""

import json
import os
import sys
import urllib.request

QUERY = "{ instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } } }"


def problems(port: int, timeout: float = 20) -> list[str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": QUERY}).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            statuses = json.load(response)["data"]["instance"]["daemonHealth"]["allDaemonStatuses"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return [f"the webserver did not report the daemons' health: {error}"]
    return [f"daemon {status['daemonType']} is not healthy" for status in statuses if status["required"] and not status["healthy"]]


if __name__ == "__main__":
    found = problems(int(os.environ.get("DAGSTER_WEBSERVER_PORT", "3000")))
    print("; ".join(found) or "healthy")
    sys.exit(1 if found else 0)

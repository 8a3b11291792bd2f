"""A gang of tasks submitted and followed: three workers that start together or not at all
(a task group of three members), each running a shell command on a pool the daemon runs.

    allot serve --pool worker=cpu=8 --run-pool worker &
    python3 gang.py
"""

from __future__ import annotations

from typing import Any, Dict

import allot

APP: Dict[str, Any] = {
    "id": "gang-example",
    "queue": "root.examples",
    "task_groups": [{"name": "workers", "min_members": 3, "min_resources": "cpu=1"}],
    "tasks": [
        {
            "id": f"worker-{i}",
            "resources": "cpu=1",
            "group": "workers",
            "spec": {"type": "shell", "command": f"echo worker {i} of 3 started with the others"},
        }
        for i in range(3)
    ],
}


def main() -> None:
    with allot.Client() as client:
        client.put_queue("root.examples")
        app = client.submit_and_follow(APP, timeout=120)
        print(f"application {app['id']}: {app['state']}")
        for task in client.tasks(app["id"]):
            logs = client.task_logs(app["id"], task["id"])
            print(f"  {task['id']}: {task['state']}: {logs['text'].strip()}")


if __name__ == "__main__":
    main()

"""An external plugin that wraps a real local program: task type ``checksum`` runs
``sha256sum`` on the file ``inputs.path`` in a process of its own; the digest is the task's
output. A deleted task's process is killed.

    python3 checksum_plugin.py --port 8001 &
    # allot.toml: [plugins.external.checksum]  url = "http://127.0.0.1:8001/tasks"
    #                                          task_types = ["checksum"]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
from typing import Dict

from allot.plugin import JobNotFound, Plugin, Refused, Status, Task, serve


class Checksum(Plugin):
    task_types = ["checksum"]

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.processes: Dict[str, "subprocess.Popen[str]"] = {}

    def create(self, task: Task) -> str:
        path = task.inputs.get("path") if isinstance(task.inputs, dict) else None
        if not isinstance(path, str) or not os.path.isfile(path):
            raise Refused(f"inputs.path must name a file, got {path!r}")
        process = subprocess.Popen(["sha256sum", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        job = str(process.pid)
        with self.lock:
            self.processes[job] = process
        return job

    def get(self, job: str) -> Status:
        with self.lock:
            process = self.processes.get(job)
        if process is None:
            raise JobNotFound(job)
        if process.poll() is None:
            return Status.running(f"sha256sum is running (pid {job})")
        out, err = process.communicate()
        if process.returncode != 0:
            return Status.failed(f"sha256sum exited {process.returncode}: {err.strip()}")
        return Status.succeeded({"sha256": out.split()[0]})

    def delete(self, job: str) -> None:
        with self.lock:
            process = self.processes.get(job)
        if process is not None and process.poll() is None:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description="the checksum plugin: sha256sum as allot tasks")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    serve(Checksum(), port=parser.parse_args().port)


if __name__ == "__main__":
    main()

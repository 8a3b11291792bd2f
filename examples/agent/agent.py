#!/usr/bin/env python3
"""A task plugin served by another process, written on allot's Python plugin kit
(``allot.plugin``, in clients/python): it runs task type ``wordcount``, counting the words of
``inputs.text`` and taking ``spec.seconds`` (default 0.2) to do so, in a thread of its own.

    pip install ./clients/python
    python3 examples/agent/agent.py --port 8000

and give allot ``[plugins.external.wordcount] url = "http://127.0.0.1:8000/tasks"``,
``task_types = ["wordcount"]`` (see examples/agent/allot.toml).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Dict

from allot.plugin import JobNotFound, Plugin, Refused, Status, Task, serve


class WordCount(Plugin):
    task_types = ["wordcount"]

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: Dict[str, Status] = {}

    def create(self, task: Task) -> str:
        text = task.inputs.get("text") if isinstance(task.inputs, dict) else None
        if not isinstance(text, str):
            raise Refused("inputs.text must be a string")
        job = task.key.replace("/", "-")
        with self.lock:
            self.jobs[job] = Status.running("counting")
        seconds = float(task.spec.get("seconds", 0.2))
        threading.Thread(target=self.count, args=(job, text, seconds), daemon=True).start()
        return job

    def count(self, job: str, text: str, seconds: float) -> None:
        time.sleep(seconds)
        with self.lock:
            if self.jobs[job].phase == "running":  # not deleted meanwhile
                self.jobs[job] = Status.succeeded({"words": len(text.split())}, "counted")

    def get(self, job: str) -> Status:
        with self.lock:
            if job not in self.jobs:
                raise JobNotFound(job)
            return self.jobs[job]

    def delete(self, job: str) -> None:
        with self.lock:
            if job in self.jobs:
                self.jobs[job] = Status.failed("deleted")


def main() -> None:
    parser = argparse.ArgumentParser(description="allot's wordcount plugin, on the Python plugin kit")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    serve(WordCount(), port=parser.parse_args().port)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A task plugin served by another process: allot's `external` plugin protocol, in Python.

allot calls it over HTTP/JSON (Flyte's agent protocol: create, get, delete):
  POST   /tasks        {"task_type", "app", "task", "attempt", "inputs", "spec"}
                       header Idempotency-Key: <app>/<task>/<attempt>
                       -> {"resource_meta": "<job id>"}
  GET    /tasks/<id>   -> {"phase": "pending|running|succeeded|failed|retryable",
                           "message": "...", "outputs": {...}}
  DELETE /tasks/<id>   stops the job

This one runs task type `wordcount`: it counts the words of `inputs.text`, taking
`spec.seconds` (default 0.2) to do so, in a thread of its own. Run it with

  python3 examples/agent/agent.py --port 8000

and give allot `[plugins.external.wordcount] url = "http://127.0.0.1:8000/tasks"`,
`task_types = ["wordcount"]` (see examples/agent/allot.toml). Standard library only.
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JOBS = {}  # job id -> {"phase", "message", "outputs", "cancelled"}
LOCK = threading.Lock()


def run_job(job_id, inputs, spec):
    time.sleep(float(spec.get("seconds", 0.2)))
    with LOCK:
        job = JOBS[job_id]
        if job["cancelled"]:
            return
        text = inputs.get("text") if isinstance(inputs, dict) else None
        if not isinstance(text, str):
            job.update(phase="failed", message="inputs.text must be a string")
            return
        job.update(phase="succeeded", message="counted", outputs={"words": len(text.split())})


class Agent(BaseHTTPRequestHandler):
    def answer(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def job_id(self):
        parts = self.path.rstrip("/").split("/")
        return parts[2] if len(parts) == 3 and parts[1] == "tasks" else None

    def do_POST(self):
        if self.path.rstrip("/") != "/tasks":
            return self.answer(404, {"error": "no such route"})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if body.get("task_type") != "wordcount":
            return self.answer(400, {"error": "this agent runs task type wordcount only"})
        # The same key names the same job: a create repeated after a crash starts nothing new.
        job_id = self.headers.get("Idempotency-Key", "").replace("/", "-") or str(time.time_ns())
        with LOCK:
            fresh = job_id not in JOBS
            if fresh:
                JOBS[job_id] = {"phase": "running", "message": "counting", "outputs": None, "cancelled": False}
        if fresh:
            spec = body.get("spec") or {}
            threading.Thread(target=run_job, args=(job_id, body.get("inputs"), spec), daemon=True).start()
        self.answer(200, {"resource_meta": job_id})

    def do_GET(self):
        job_id = self.job_id()
        with LOCK:
            job = JOBS.get(job_id) if job_id else None
            if job is None:
                return self.answer(404, {"error": "no such job"})
            body = {"phase": job["phase"], "message": job["message"]}
            if job["outputs"] is not None:
                body["outputs"] = job["outputs"]
        self.answer(200, body)

    def do_DELETE(self):
        job_id = self.job_id()
        with LOCK:
            job = JOBS.get(job_id) if job_id else None
            if job is None:
                return self.answer(404, {"error": "no such job"})
            job.update(cancelled=True, phase="failed", message="deleted")
        self.answer(204)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Agent)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

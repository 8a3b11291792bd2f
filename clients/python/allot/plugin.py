"""A kit for plugins served in Python: allot's ``external`` plugin protocol (Flyte's agent
protocol: create, get, delete over HTTP/JSON), so that a plugin is one class.

::

    from allot.plugin import Plugin, Status, Task, serve

    class WordCount(Plugin):
        task_types = ["wordcount"]

        def create(self, task: Task) -> str:
            words = len(str(task.inputs["text"]).split())
            self.results[task.key] = words
            return task.key                       # the job's id

        def get(self, job: str) -> Status:
            return Status.succeeded({"words": self.results[job]})

    serve(WordCount(), port=8000)

and give the daemon ``[plugins.external.wordcount]`` with ``url = "http://127.0.0.1:8000/tasks"``
and ``task_types = ["wordcount"]``.

The kit answers allot's calls: ``POST /tasks`` (create; a call repeated with the same
``Idempotency-Key``, as after a crash of the daemon, answers the same job without calling
``create`` again), ``GET /tasks/{job}`` (get), ``DELETE /tasks/{job}`` (delete; an unknown job is
already gone). What a method raises is answered so that allot does the right thing:
:class:`Refused` (400) fails the task for good, :class:`JobNotFound` (404) says the job is lost,
anything else is a 500, which allot retries within the task's system-retry budget. Methods are
called from several threads at once: guard the state they share.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type, Union

__all__ = ["Catalog", "JobNotFound", "Plugin", "PluginServer", "Refused", "Status", "Task", "serve"]

#: Where allot sends a job's state: a task's phases.
PHASES = ("pending", "running", "succeeded", "failed", "retryable")


@dataclass(frozen=True)
class Task:
    """What allot asks a plugin to run: one attempt of one task."""

    task_type: str
    app: str
    task: str
    attempt: int
    #: The task spec's ``inputs``.
    inputs: Any
    #: The whole task spec (``type``, ``inputs`` and the plugin's own fields).
    spec: Dict[str, Any]
    #: ``<app>/<task>/<attempt>``: the same for a create repeated after a crash.
    key: str
    #: The URL of the daemon that runs the task: where :meth:`Plugin.catalog` reaches.
    daemon: str = ""


@dataclass(frozen=True)
class Status:
    """Where a job is. ``failed`` fails the task (a user failure, retried within the task's
    ``retries``); ``retryable`` asks for a new attempt; ``outputs`` become the run's outputs.

    What a front end shows of the job (Flyte's ``TaskInfo``): ``log_links``, ``custom_info``
    (a JSON object of at most 16 KiB, such as the job's id and its page on the service) and
    ``occurred_at``, when the phase really began (a ``datetime``, or seconds since the epoch),
    when the service knows it better than the poll that saw it. A change of the links or of the
    custom information is an event of the run's timeline of its own."""

    phase: str
    message: str = ""
    outputs: Optional[Dict[str, Any]] = None
    #: (name, uri) of logs or consoles to show with the run.
    log_links: Sequence[Tuple[str, str]] = field(default_factory=tuple)
    #: What the front end shows of the job: a JSON object.
    custom_info: Optional[Dict[str, Any]] = None
    #: When the phase began: a ``datetime`` (naive ones are taken as UTC) or seconds since the epoch.
    occurred_at: Optional[Union[datetime, float]] = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase `{self.phase}` is not one of {', '.join(PHASES)}")
        if self.custom_info is not None and not isinstance(self.custom_info, dict):
            raise ValueError("custom_info is a JSON object (a dict)")
        at = self.occurred_at_ms()
        if at is not None and at < 0:
            raise ValueError("occurred_at is before the epoch")

    @staticmethod
    def pending(message: str = "", occurred_at: Optional[Union[datetime, float]] = None) -> "Status":
        return Status("pending", message, occurred_at=occurred_at)

    @staticmethod
    def running(
        message: str = "",
        log_links: Sequence[Tuple[str, str]] = (),
        custom_info: Optional[Dict[str, Any]] = None,
        occurred_at: Optional[Union[datetime, float]] = None,
    ) -> "Status":
        return Status("running", message, log_links=tuple(log_links), custom_info=custom_info, occurred_at=occurred_at)

    @staticmethod
    def succeeded(
        outputs: Optional[Dict[str, Any]] = None, message: str = "", occurred_at: Optional[Union[datetime, float]] = None
    ) -> "Status":
        return Status("succeeded", message, outputs, occurred_at=occurred_at)

    @staticmethod
    def failed(message: str, occurred_at: Optional[Union[datetime, float]] = None) -> "Status":
        return Status("failed", message, occurred_at=occurred_at)

    @staticmethod
    def retryable(message: str, occurred_at: Optional[Union[datetime, float]] = None) -> "Status":
        return Status("retryable", message, occurred_at=occurred_at)

    def occurred_at_ms(self) -> Optional[int]:
        """``occurred_at`` in ms since the epoch, as the protocol carries it."""
        at = self.occurred_at
        if at is None:
            return None
        if isinstance(at, datetime):
            if at.tzinfo is None:
                at = at.replace(tzinfo=timezone.utc)
            return int(at.timestamp() * 1000)
        return int(float(at) * 1000)

    def wire(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {"phase": self.phase, "message": self.message}
        if self.outputs is not None:
            body["outputs"] = self.outputs
        if self.log_links:
            body["log_links"] = [{"name": name, "uri": uri} for name, uri in self.log_links]
        if self.custom_info is not None:
            body["custom_info"] = self.custom_info
        at = self.occurred_at_ms()
        if at is not None:
            body["occurred_at_ms"] = at
        return body


class Catalog:
    """The plugin's own entries of allot's catalog, for a task it runs (Flyte's
    ``TaskExecutionContext.Catalog()``): outputs it keeps and looks up itself, a part of its work
    done before. Entries are the plugin's and the task's queue's: no other plugin or queue reaches
    them. The first entry kept under a name, version and inputs stays until its retention is over.
    Calls go to the daemon that runs the task, while it runs, with the plugin's ``token`` (or
    ``ALLOT_TOKEN``): with access control on, a token that may ``use`` the task's queue."""

    def __init__(self, task: Task, token: Optional[str] = None) -> None:
        if not task.daemon:
            raise ValueError("the task names no daemon: allot sends it with every create")
        self.task = task
        self._token = token

    def _client(self) -> Any:
        from . import Client  # the HTTP client, loaded when a plugin first reaches its catalog

        return Client(self.task.daemon, token=self._token)

    def get(self, name: str, version: str, inputs: Any = None) -> Optional[Dict[str, Any]]:
        """The entry kept as ``name`` at ``version`` for ``inputs`` (``key``, ``outputs``,
        ``app``, ``task``, ``kept_at_ms``), or ``None``."""
        with self._client() as client:
            found = client.catalog_lookup(self.task.app, self.task.task, name, version, inputs)
        entry = found.get("entry")
        return dict(entry) if entry else None

    def put(self, name: str, version: str, outputs: Any, inputs: Any = None) -> Dict[str, Any]:
        """Keeps ``outputs`` as ``name`` at ``version`` for ``inputs``, unless an entry is kept
        there already: answers ``{"created": bool, "entry": {...}}`` (the entry that stays)."""
        with self._client() as client:
            return dict(client.catalog_put(self.task.app, self.task.task, name, version, outputs, inputs))


class Refused(Exception):
    """Raised by ``create``: the task cannot run (bad inputs); allot fails it for good."""


class JobNotFound(Exception):
    """Raised by ``get`` or ``delete``: no such job (lost, say, in a restart of the plugin)."""


class Plugin:
    """A plugin: subclass it, name ``task_types`` and write ``create`` and ``get`` (and
    ``delete`` when a job can be stopped)."""

    #: The task types served; a task of another type is refused. Empty: any type.
    task_types: Sequence[str] = ()

    def create(self, task: Task) -> str:
        """Starts a job for ``task`` and answers its id; returns soon (the job runs on)."""
        raise NotImplementedError

    def get(self, job: str) -> Status:
        """Where job ``job`` is."""
        raise NotImplementedError

    def delete(self, job: str) -> None:
        """Stops job ``job`` (the task was aborted). By default, nothing to stop."""

    #: The API token the plugin calls the daemon with (its catalog); ``None``: ``ALLOT_TOKEN``.
    token: Optional[str] = None

    def catalog(self, task: Task) -> Catalog:
        """The plugin's entries of allot's catalog, for ``task`` (see :class:`Catalog`)."""
        return Catalog(task, token=self.token)


class _Jobs:
    """The jobs made, by idempotency key: a create is called once per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: Dict[str, str] = {}
        self._creating: Dict[str, threading.Event] = {}

    def create(self, key: str, make: Callable[[], str]) -> str:
        while True:
            with self._lock:
                if key in self._by_key:
                    return self._by_key[key]
                running = self._creating.get(key)
                if running is None:
                    self._creating[key] = threading.Event()
                    break
            running.wait()
        try:
            job = make()
            with self._lock:
                self._by_key[key] = job
            return job
        finally:
            with self._lock:
                self._creating.pop(key).set()


def _handler(plugin: Plugin, base: str, jobs: _Jobs) -> Type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, body: Optional[Dict[str, Any]] = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._answer(status, {"error": message})

        def _job(self) -> Optional[str]:
            path = self.path.split("?", 1)[0].rstrip("/")
            if not path.startswith(base + "/"):
                return None
            job = path[len(base) + 1 :]
            return job if job and "/" not in job else None

        def _guarded(self, call: Callable[[], None]) -> None:
            try:
                call()
            except Refused as err:
                self._error(400, str(err))
            except JobNotFound as err:
                # Only the plugin's own word that a job is gone: a KeyError of its code is a bug,
                # a 500 allot retries, not a job lost for good.
                self._error(404, f"no such job: {err}")
            except Exception as err:  # a bug or an outage of the plugin: allot retries
                self._error(500, f"{type(err).__name__}: {err}")

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0].rstrip("/") != base:
                return self._error(404, "no such route")
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                task = Task(
                    task_type=str(body["task_type"]),
                    app=str(body["app"]),
                    task=str(body["task"]),
                    attempt=int(body.get("attempt", 1)),
                    inputs=body.get("inputs"),
                    spec=dict(body.get("spec") or {}),
                    key=self.headers.get("Idempotency-Key") or f"{body['app']}/{body['task']}/{body.get('attempt', 1)}",
                    daemon=str(body.get("daemon") or ""),
                )
            except (ValueError, KeyError, TypeError) as err:
                return self._error(400, f"not a task: {err}")
            if plugin.task_types and task.task_type not in plugin.task_types:
                return self._error(400, f"this plugin runs task types {', '.join(plugin.task_types)} only")

            def create() -> None:
                job = jobs.create(task.key, lambda: plugin.create(task))
                self._answer(200, {"resource_meta": job})

            self._guarded(create)

        def do_GET(self) -> None:
            job = self._job()
            if job is None:
                return self._error(404, "no such route")
            self._guarded(lambda: self._answer(200, plugin.get(job).wire()))

        def do_DELETE(self) -> None:
            job = self._job()
            if job is None:
                return self._error(404, "no such route")

            def delete() -> None:
                plugin.delete(job)
                self._answer(204)

            self._guarded(delete)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class PluginServer:
    """The plugin served on ``host:port`` (``0``: a free port) at ``path``, in a thread of its
    own while the ``with`` block runs (or between ``start()`` and ``stop()``)."""

    def __init__(self, plugin: Plugin, host: str = "127.0.0.1", port: int = 0, path: str = "/tasks") -> None:
        base = "/" + path.strip("/")
        self._server = ThreadingHTTPServer((host, port), _handler(plugin, base, _Jobs()))
        self._server.daemon_threads = True
        self._thread: Optional[threading.Thread] = None
        #: Where it listens, ``http://host:port``.
        self.address = f"http://{host}:{self._server.server_address[1]}"
        #: The URL to give allot (``[plugins.external.<id>] url``): the address and the path.
        self.url = self.address + base

    def start(self) -> "PluginServer":
        self._thread = threading.Thread(target=self._server.serve_forever, name="allot-plugin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "PluginServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Serves in this thread until interrupted."""
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()


def serve(plugin: Plugin, host: str = "127.0.0.1", port: int = 8000, path: str = "/tasks") -> None:
    """Serves the plugin until interrupted, after printing ``listening on http://host:port``
    (``port`` 0: a free one)."""
    server = PluginServer(plugin, host, port, path)
    print(f"listening on {server.address}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


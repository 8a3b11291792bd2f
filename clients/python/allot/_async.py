"""The asynchronous client. ``scripts/generate.py`` writes the blocking one (``_sync.py``) from
this file, so the two never drift apart: edit this one only."""

from __future__ import annotations

import functools
import json
import os
import warnings
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union, cast

import httpx

from . import models as m
from ._resources import OFFER_GONE, amount_to_take, format_resources, parse_resources, pick_offers
from ._sse import EventStream
from ._util import (
    check_snapshot,
    sync_directory,
    APP_ENDED,
    SYSTEM_CLOCK,
    TASK_ENDED,
    Clock,
    Options,
    _AsyncKeeper,
    connection_failed,
    fresh_token,
    may_retry,
    raise_for,
    read_app,
    retry_delay,
    seg,
)
from .errors import ERRORS, AllotError, AppFailed, ConflictError, ConnectionFailed, Exhausted, NamespaceQuotaExceeded, NotGranted

R = TypeVar("R")

#: A watch stream that receives nothing (not even a heartbeat) for this long, in seconds, is
#: taken as cut and opened again: three of the daemon's heartbeats (as the Rust client).
WATCH_IDLE_TIMEOUT = 45.0
AppSource = Union[Mapping[str, Any], str]


class AsyncClient:
    """An asynchronous client of one allot daemon (or of any daemon of a Redis-shared group).

    ``url`` defaults to ``ALLOT_SERVER``, else ``http://127.0.0.1:7070``; ``token`` to
    ``ALLOT_TOKEN``; ``ca_cert`` (a PEM file: the CA of an HTTPS daemon) to ``ALLOT_CA_CERT``;
    ``client_cert`` (certificate and key files, for a daemon that asks for one) to
    ``ALLOT_CLIENT_CERT`` and ``ALLOT_CLIENT_KEY``. A call that gets no answer, or a 503, is
    retried up to ``retries`` times (after ``Retry-After``, or ``backoff`` doubling), only when
    sending it again cannot do harm: reads, puts, removals, keepalives and allocates (whose token
    makes a retry the same call) always; a call that creates (opening a session, accepting an
    offer) only when it surely never took effect. Use it as a context manager, or ``close()`` it.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        ca_cert: Optional[str] = None,
        client_cert: Optional[Tuple[str, str]] = None,
        timeout: float = 330.0,
        retries: int = 5,
        backoff: float = 0.1,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        clock: Optional[Clock] = None,
    ) -> None:
        self.options = Options.resolve(url, token, ca_cert, client_cert, timeout, retries, backoff)
        #: Where the helpers take their time (keepalives, retries' waits, ``run``'s timeout).
        self.clock: Clock = clock or SYSTEM_CLOCK
        self._http = httpx.AsyncClient(transport=transport, **self.options.http_args())

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    # ---- the transport ----

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None] = None,
        idempotent: bool = True,
        gone_is_an_answer: bool = False,
    ) -> Any:
        """Sends one call, retried as the class says; answers the body's JSON (of a 410 too,
        with ``gone_is_an_answer``: the record of what ended)."""
        answer = await self._send(
            method, path, body=body, params=params, idempotent=idempotent, gone_is_an_answer=gone_is_an_answer
        )
        return answer.json() if answer.content else None

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None] = None,
        idempotent: bool = True,
        gone_is_an_answer: bool = False,
    ) -> httpx.Response:
        """:meth:`_call`, answering the answer itself (its headers too)."""
        pairs = params.items() if isinstance(params, Mapping) else (params or [])
        query = [(k, v) for k, v in pairs if v is not None]
        content = None if body is None else json.dumps(body).encode()
        headers = {} if content is None else {"Content-Type": "application/json"}
        attempt = 0
        while True:
            try:
                answer = await self._http.request(method, path, content=content, params=query, headers=headers)
            except httpx.TransportError as err:
                sent = not isinstance(err, (httpx.ConnectError, httpx.ConnectTimeout))
                if attempt >= self.options.retries or not may_retry(None, None, idempotent, sent):
                    raise connection_failed(err, f"{self.options.url.rstrip('/')}{path}") from err
                await self.clock.asleep(retry_delay(attempt, self.options.backoff, None))
                attempt += 1
                continue
            if answer.status_code == 503 and attempt < self.options.retries:
                try:
                    code: Optional[str] = answer.json()["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = None
                if may_retry(503, code, idempotent, True):
                    await self.clock.asleep(retry_delay(attempt, self.options.backoff, answer.headers.get("Retry-After")))
                    attempt += 1
                    continue
            if not (gone_is_an_answer and answer.status_code == 410):
                raise_for(answer.status_code, answer.content)
            return answer

    async def _pages(
        self, path: str, field: str, limit: Optional[int], params: Optional[Dict[str, Any]] = None
    ) -> AsyncIterator[Any]:
        """Every item of a paged list, page after page (``params``: the list's other query)."""
        cursor: Optional[str] = None
        while True:
            page = await self._call("GET", path, params={**(params or {}), "limit": limit, "cursor": cursor})
            for item in page[field]:
                yield item
            cursor = page.get("next_cursor")
            if not cursor:
                return

    # ---- health ----

    async def health(self) -> m.Health:
        """``GET /healthz``: the daemon answers."""
        return cast(m.Health, await self._call("GET", "/healthz"))

    async def ready(self) -> m.Readiness:
        """``GET /readyz``: the daemon can serve (its store answers)."""
        return cast(m.Readiness, await self._call("GET", "/readyz"))

    # ---- snapshots ----

    async def save_snapshot(self, path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
        """``GET /v1/snapshot``: saves a point-in-time archive of everything the daemon's store
        holds to ``path`` while the daemon serves (it needs the daemon's ``admin`` permission), as
        ``allot snapshot save`` does: written beside it first (``path.partial``), synced, checked
        whole, then renamed into place, so ``path`` is a whole archive or left as it was. Answers
        the archive's header (``revision``, ``taken_at_ms``, ``backend``, ...) with its ``bytes``
        and ``sha256``. ``allot snapshot restore`` makes a store of it."""
        target = Path(path)
        partial = target.with_name(target.name + ".partial")
        timeout = httpx.Timeout(self.options.timeout, read=3600.0)
        try:
            with open(partial, "wb") as out:
                async with self._http.stream("GET", "/v1/snapshot", timeout=timeout) as answer:
                    if answer.status_code >= 400:
                        raise_for(answer.status_code, await answer.aread())
                    async for chunk in answer.aiter_bytes():
                        out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            described = check_snapshot(partial)
            os.replace(partial, target)
            sync_directory(target.parent)
        except httpx.TransportError as err:
            partial.unlink(missing_ok=True)
            raise connection_failed(err, self.options.url) from err
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return described

    # ---- token quotas ----

    async def put_namespace(self, namespace: str, quota: int) -> m.PutNamespaceResponse:
        """Creates a namespace with ``quota`` units, or changes its quota."""
        path = f"/v1/namespaces/{seg(namespace)}"
        return cast(m.PutNamespaceResponse, await self._call("PUT", path, body={"quota": quota}))

    async def namespace(self, namespace: str) -> m.Namespace:
        """One namespace: its quota, what is granted, its waiters."""
        return cast(m.Namespace, await self._call("GET", f"/v1/namespaces/{seg(namespace)}"))

    async def namespaces(self, *, page_size: Optional[int] = None) -> AsyncIterator[m.Namespace]:
        """Every namespace, in name order (read page by page)."""
        async for item in self._pages("/v1/namespaces", "namespaces", page_size):
            yield item

    async def remove_namespace(self, namespace: str, *, force: bool = False) -> m.RemovedNamespace:
        """Removes a namespace; with ``force``, also while clients hold grants in it (they end). Never
        while allot holds grants there for tasks (``HeldByScheduler``)."""
        path = f"/v1/namespaces/{seg(namespace)}"
        return cast(m.RemovedNamespace, await self._call("DELETE", path, params={"force": str(force).lower()}))

    async def allocate(
        self,
        namespace: str,
        token: str,
        units: int = 1,
        *,
        ttl_ms: Optional[int] = None,
        session: Optional[str] = None,
        wait_ms: Optional[int] = None,
        scope: Optional[m.Scope] = None,
        caps: Optional[m.Caps] = None,
        raise_if_not_granted: bool = False,
    ) -> m.AllocateResponse:
        """Allocates ``units`` under ``token`` (idempotent: the same token again is the same
        grant). ``wait_ms`` waits in the namespace's first-come-first-served queue for room.
        Answers the status (``Granted``, ``Exhausted``, ``NamespaceQuotaExceeded``); with
        ``raise_if_not_granted``, a status other than ``Granted`` raises :class:`Exhausted` or
        :class:`NamespaceQuotaExceeded`."""
        body: Dict[str, Any] = {"units": units}
        for key, value in (("ttl_ms", ttl_ms), ("session", session), ("wait_ms", wait_ms), ("scope", scope), ("caps", caps)):
            if value is not None:
                body[key] = value
        path = f"/v1/namespaces/{seg(namespace)}/grants/{seg(token)}"
        answer = cast(m.AllocateResponse, await self._call("PUT", path, body=body))
        if raise_if_not_granted and answer["status"] != "Granted":
            raise _not_granted(namespace, token, answer)
        return answer

    async def release(self, namespace: str, token: str, *, fencing: Optional[int] = None) -> m.ReleaseResponse:
        """Releases a grant (``released`` is false if there was none); with ``fencing``, only
        the grant of that fencing number (``stale_fencing`` otherwise)."""
        path = f"/v1/namespaces/{seg(namespace)}/grants/{seg(token)}"
        return cast(m.ReleaseResponse, await self._call("DELETE", path, params={"fencing": fencing}))

    async def grant(self, namespace: str, token: str) -> m.Grant:
        """One grant."""
        return cast(m.Grant, await self._call("GET", f"/v1/namespaces/{seg(namespace)}/grants/{seg(token)}"))

    async def grants(self, namespace: str, *, page_size: Optional[int] = None) -> AsyncIterator[m.Grant]:
        """Every grant of a namespace, in token order."""
        async for item in self._pages(f"/v1/namespaces/{seg(namespace)}/grants", "grants", page_size):
            yield item

    async def keepalive_grant(self, namespace: str, token: str, *, fencing: Optional[int] = None) -> m.Grant:
        """Renews a grant's lease (its TTL from now)."""
        path = f"/v1/namespaces/{seg(namespace)}/grants/{seg(token)}/keepalive"
        return cast(m.Grant, await self._call("POST", path, body={"fencing": fencing}))

    async def waiters(self, namespace: str, *, page_size: Optional[int] = None) -> AsyncIterator[m.Waiter]:
        """The allocates waiting for room in a namespace, first come first."""
        async for item in self._pages(f"/v1/namespaces/{seg(namespace)}/waiters", "waiters", page_size):
            yield item

    # ---- sessions ----

    async def open_session(self, ttl_ms: int) -> m.Session:
        """Opens a session: grants attached to it live while it is kept alive."""
        return cast(m.Session, await self._call("POST", "/v1/sessions", body={"ttl_ms": ttl_ms}, idempotent=False))

    async def session(self, session: str) -> m.Session:
        return cast(m.Session, await self._call("GET", f"/v1/sessions/{seg(session)}"))

    async def sessions(self, *, page_size: Optional[int] = None) -> AsyncIterator[m.Session]:
        async for item in self._pages("/v1/sessions", "sessions", page_size):
            yield item

    async def keepalive_session(self, session: str) -> m.Session:
        """Renews a session's lease, and with it its grants'."""
        return cast(m.Session, await self._call("POST", f"/v1/sessions/{seg(session)}/keepalive"))

    async def close_session(self, session: str) -> m.Session:
        """Closes a session: its grants are released."""
        return cast(m.Session, await self._call("DELETE", f"/v1/sessions/{seg(session)}"))

    # ---- pools ----

    async def put_pool(
        self,
        pool: str,
        capacity: str,
        *,
        labels: Optional[Mapping[str, str]] = None,
        plugins: Optional[Sequence[str]] = None,
        occupied: Optional[str] = None,
    ) -> m.PutPoolResponse:
        """Creates a pool of ``capacity`` (``cpu=16,mem=64GiB``), or changes it. ``labels``
        replace its labels; ``plugins`` the task types its executor runs (``["*"]``: every type);
        ``occupied`` what things allot does not manage hold there (never offered; tasks that no
        longer fit are preempted; ``""`` clears it); any left out keeps what the pool has."""
        body: Dict[str, Any] = {"capacity": capacity}
        if labels is not None:
            body["labels"] = dict(labels)
        if plugins is not None:
            body["plugins"] = list(plugins)
        if occupied is not None:
            body["occupied"] = occupied
        return cast(m.PutPoolResponse, await self._call("PUT", f"/v1/pools/{seg(pool)}", body=body))

    async def pool(self, pool: str) -> m.Pool:
        return cast(m.Pool, await self._call("GET", f"/v1/pools/{seg(pool)}"))

    async def pools(self, *, page_size: Optional[int] = None) -> AsyncIterator[m.Pool]:
        async for item in self._pages("/v1/pools", "pools", page_size):
            yield item

    async def remove_pool(self, pool: str, *, force: bool = False) -> m.RemovedPool:
        """Removes a pool; with ``force``, also while allocs live on it (they end)."""
        path = f"/v1/pools/{seg(pool)}"
        return cast(m.RemovedPool, await self._call("DELETE", path, params={"force": str(force).lower()}))

    async def offers(self, pool: str) -> List[m.Offer]:
        """What the pool can give now."""
        answer = await self._call("GET", f"/v1/pools/{seg(pool)}/offers")
        return cast(List[m.Offer], answer["offers"])

    async def offer(self, pool: str, offer: str) -> m.Offer:
        """One offer by its id (Reflow's ``Pool.Offer``): what is free in the pool now;
        ``OfferNotFound`` when nothing is (or no offer has that id)."""
        return cast(m.Offer, await self._call("GET", f"/v1/pools/{seg(pool)}/offers/{seg(offer)}"))

    async def accept(
        self,
        pool: str,
        offer: str,
        min_resources: str,
        *,
        max_resources: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        owner: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> m.Alloc:
        """Accepts an offer: an alloc of at least ``min_resources`` (and at most
        ``max_resources``), with the owner's ``labels`` and ``metadata`` (a JSON object of at most
        16 KiB: what runs in it, its results)."""
        body: Dict[str, Any] = {
            "min": min_resources,
            "max": max_resources,
            "labels": dict(labels or {}),
            "owner": owner,
            "metadata": None if metadata is None else dict(metadata),
        }
        path = f"/v1/pools/{seg(pool)}/offers/{seg(offer)}"
        return cast(m.Alloc, await self._call("POST", path, body=body, idempotent=False))

    async def alloc(self, pool: str, alloc: str) -> m.Alloc:
        """One alloc; an ended one too, while it is kept (its ``ended`` says why)."""
        path = f"/v1/pools/{seg(pool)}/allocs/{seg(alloc)}"
        return cast(m.Alloc, await self._call("GET", path, gone_is_an_answer=True))

    async def allocs(self, pool: str, *, page_size: Optional[int] = None) -> AsyncIterator[m.Alloc]:
        async for item in self._pages(f"/v1/pools/{seg(pool)}/allocs", "allocs", page_size):
            yield item

    async def allocs_of_pools(self, pools: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """The live allocs of several pools (Reflow's ``Mux.Allocs``): of ``pools``, or of every
        pool of the daemon. A pool that fails is reported, not raised: answers
        ``{"allocs": [...], "failed": [{"pool": ..., "error": ...}]}``."""
        names = list(pools) if pools is not None else [p["name"] async for p in self.pools()]
        found: Dict[str, Any] = {"allocs": [], "failed": []}
        for name in names:
            try:
                found["allocs"].extend([alloc async for alloc in self.allocs(name)])
            except AllotError as err:
                found["failed"].append({"pool": name, "error": str(err)})
        return found

    async def keepalive_alloc(self, pool: str, alloc: str, interval_ms: int) -> m.AllocKeepaliveResponse:
        """Keeps an alloc alive for ``interval_ms`` more (the pool may grant less)."""
        path = f"/v1/pools/{seg(pool)}/allocs/{seg(alloc)}/keepalive"
        return cast(m.AllocKeepaliveResponse, await self._call("POST", path, body={"interval_ms": interval_ms}))

    async def annotate_alloc(
        self,
        pool: str,
        alloc: str,
        *,
        labels: Optional[Mapping[str, str]] = None,
        remove_labels: Sequence[str] = (),
        metadata: Optional[Mapping[str, Any]] = None,
        clear_metadata: bool = False,
    ) -> m.Alloc:
        """Changes the labels and metadata of a live alloc (Reflow: an alloc's execs and their
        results): ``remove_labels`` removed, then ``labels`` set; ``metadata`` replaced, or
        removed with ``clear_metadata``; the rest is kept, and the lease is not renewed."""
        if clear_metadata and metadata is not None:
            raise ValueError("give metadata or clear_metadata, not both")
        body: Dict[str, Any] = {"labels": dict(labels or {}), "remove_labels": list(remove_labels)}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        if clear_metadata:
            body["metadata"] = None
        return cast(m.Alloc, await self._call("PATCH", f"/v1/pools/{seg(pool)}/allocs/{seg(alloc)}", body=body))

    async def alloc_run(self, pool: str, alloc: str) -> m.TaskRun:
        """The run (phases, outputs) of the task in an alloc the scheduler holds, while the
        alloc is kept."""
        return cast(m.TaskRun, await self._call("GET", f"/v1/pools/{seg(pool)}/allocs/{seg(alloc)}/run"))

    async def free_alloc(self, pool: str, alloc: str) -> m.Alloc:
        """Frees an alloc: its resources go back to the pool."""
        return cast(m.Alloc, await self._call("DELETE", f"/v1/pools/{seg(pool)}/allocs/{seg(alloc)}"))

    async def stop_if_idle(self, pool: str, idle_ms: int) -> m.StopIfIdleResponse:
        """Stops the pool if it has had no alloc for ``idle_ms``."""
        path = f"/v1/pools/{seg(pool)}/stop-if-idle"
        return cast(m.StopIfIdleResponse, await self._call("POST", path, body={"idle_ms": idle_ms}))

    async def cordon_pool(self, pool: str) -> m.Pool:
        """Cordons the pool: no new allocs, nothing placed there; what runs there runs on."""
        return cast(m.Pool, await self._call("POST", f"/v1/pools/{seg(pool)}/cordon"))

    async def drain_pool(self, pool: str, grace_ms: Optional[int] = None) -> m.Pool:
        """Cordons the pool and preempts its tasks once ``grace_ms`` has passed (the daemon's
        default, 30 s, when left out); they are placed again elsewhere."""
        body: Dict[str, Any] = {} if grace_ms is None else {"grace_ms": grace_ms}
        return cast(m.Pool, await self._call("POST", f"/v1/pools/{seg(pool)}/drain", body=body))

    async def uncordon_pool(self, pool: str) -> m.Pool:
        """The pool takes allocs again; a drain not carried out yet is called off."""
        return cast(m.Pool, await self._call("POST", f"/v1/pools/{seg(pool)}/uncordon"))

    # ---- queues, applications, tasks ----

    async def put_queue(self, queue: str, **limits: Any) -> m.PutQueueResponse:
        """Creates a queue (and its parents) or sets its limits: ``max``, ``guaranteed``,
        ``max_apps``, ``user_max_apps``, ``user_max``, ``group_max_apps``, ``group_max``, ``sort``,
        ``submit_acl``, ``admin_acl`` (a limit left out is no limit)."""
        return cast(m.PutQueueResponse, await self._call("PUT", f"/v1/queues/{seg(queue)}", body=limits))

    async def queue(self, queue: str) -> m.Queue:
        return cast(m.Queue, await self._call("GET", f"/v1/queues/{seg(queue)}"))

    async def queues(self) -> List[m.Queue]:
        """Every queue, in path order."""
        return cast(List[m.Queue], (await self._call("GET", "/v1/queues"))["queues"])

    async def remove_queue(self, queue: str) -> m.RemovedQueue:
        return cast(m.RemovedQueue, await self._call("DELETE", f"/v1/queues/{seg(queue)}"))

    async def submit_app(self, app: AppSource) -> m.SubmitAppResponse:
        """Submits an application (a dict with the fields of ``SubmitApp``, or a YAML or TOML
        file's path) with the tasks it carries, all or nothing. The same application again is
        answered as it is (``created`` false)."""
        return cast(m.SubmitAppResponse, await self._call("POST", "/v1/apps", body=read_app(app)))

    async def app(self, app: str) -> m.App:
        return cast(m.App, await self._call("GET", f"/v1/apps/{seg(app)}"))

    async def apps(self, *, sort: str = "id", page_size: Optional[int] = None) -> AsyncIterator[m.App]:
        """Every application, in the order ``sort`` says: ``id``, ``submitted`` or ``ended``
        (``-submitted``, ``-ended``: the newest first; by end, those not ended come last). Each
        has ``submitted_at`` and, once it ended, ``ended_at`` (RFC 3339 timestamps)."""
        async for item in self._pages("/v1/apps", "apps", page_size, {"sort": sort}):
            yield item

    async def remove_app(self, app: str) -> m.App:
        """Removes an application: its tasks end, everything it holds is released."""
        return cast(m.App, await self._call("DELETE", f"/v1/apps/{seg(app)}"))

    async def complete_app(self, app: str) -> m.App:
        return cast(m.App, await self._call("POST", f"/v1/apps/{seg(app)}/complete"))

    async def fail_app(self, app: str, reason: Optional[str] = None) -> m.App:
        return cast(m.App, await self._call("POST", f"/v1/apps/{seg(app)}/fail", body={"reason": reason}))

    async def add_task(self, app: str, task: Mapping[str, Any]) -> m.AddTaskResponse:
        """Adds a task (the fields of ``AddTask``) to an application."""
        path = f"/v1/apps/{seg(app)}/tasks"
        return cast(m.AddTaskResponse, await self._call("POST", path, body=dict(task)))

    async def task(self, app: str, task: str) -> m.Task:
        return cast(m.Task, await self._call("GET", f"/v1/apps/{seg(app)}/tasks/{seg(task)}"))

    async def tasks(self, app: str, *, page_size: Optional[int] = None) -> AsyncIterator[m.Task]:
        async for item in self._pages(f"/v1/apps/{seg(app)}/tasks", "tasks", page_size):
            yield item

    async def remove_task(self, app: str, task: str) -> m.Task:
        return cast(m.Task, await self._call("DELETE", f"/v1/apps/{seg(app)}/tasks/{seg(task)}"))

    async def start_task(self, app: str, task: str) -> m.Task:
        """Reports a placed task running."""
        return cast(m.Task, await self._call("POST", f"/v1/apps/{seg(app)}/tasks/{seg(task)}/start"))

    async def complete_task(self, app: str, task: str) -> m.Task:
        return cast(m.Task, await self._call("POST", f"/v1/apps/{seg(app)}/tasks/{seg(task)}/complete"))

    async def fail_task(self, app: str, task: str, reason: Optional[str] = None) -> m.Task:
        path = f"/v1/apps/{seg(app)}/tasks/{seg(task)}/fail"
        return cast(m.Task, await self._call("POST", path, body={"reason": reason}))

    async def finish_tasks(self, ends: Sequence[m.TaskEnd]) -> m.FinishedTasks:
        """Reports many task ends at once; each is answered on its own."""
        body = {"tasks": list(ends)}
        return cast(m.FinishedTasks, await self._call("POST", "/v1/tasks/finish", body=body))

    async def task_run(self, app: str, task: str) -> m.TaskRun:
        """A task's run: its phases, attempts and timeline, from the executor that runs it."""
        return cast(m.TaskRun, await self._call("GET", f"/v1/apps/{seg(app)}/tasks/{seg(task)}/run"))

    async def task_logs(
        self,
        app: str,
        task: str,
        *,
        stream: str = "stdout",
        attempt: Optional[int] = None,
        offset: Optional[int] = None,
    ) -> m.TaskLogs:
        """A task's log (``stdout`` or ``stderr``) from ``offset``; ``next_offset`` reads on."""
        path = f"/v1/apps/{seg(app)}/tasks/{seg(task)}/logs"
        params = {"stream": stream, "attempt": attempt, "offset": offset}
        return cast(m.TaskLogs, await self._call("GET", path, params=params))

    async def wake_task(self, app: str, task: str) -> m.Woken:
        """Asks the executor to look at a task now (an outside job it waits for has ended)."""
        return cast(m.Woken, await self._call("POST", f"/v1/apps/{seg(app)}/tasks/{seg(task)}/wake"))

    async def catalog_lookup(
        self, app: str, task: str, name: str, version: str, inputs: Any = None
    ) -> m.CatalogFound:
        """Looks up entry ``name`` at ``version`` for ``inputs`` in the catalog of the plugin that
        runs ``task`` (Flyte's ``Catalog().Download``), in its application's queue: a plugin's
        call, on the daemon that runs the task, while it runs (``run_not_here`` otherwise)."""
        body = {"name": name, "version": version, "inputs": inputs}
        path = f"/v1/apps/{seg(app)}/tasks/{seg(task)}/catalog/lookup"
        return cast(m.CatalogFound, await self._call("POST", path, body=body))

    async def catalog_put(
        self, app: str, task: str, name: str, version: str, outputs: Any, inputs: Any = None
    ) -> m.CatalogKept:
        """Keeps ``outputs`` as entry ``name`` at ``version`` for ``inputs`` in the catalog of
        the plugin that runs ``task`` (Flyte's ``Catalog().Upload``); an entry kept before under
        the key stays (``created`` is false, and it is answered)."""
        body = {"name": name, "version": version, "inputs": inputs, "outputs": outputs}
        path = f"/v1/apps/{seg(app)}/tasks/{seg(task)}/catalog"
        return cast(m.CatalogKept, await self._call("POST", path, body=body))

    # ---- identity and access ----

    async def whoami(self, *checks: str) -> m.WhoAmI:
        """Who the caller is, and which of ``checks`` (``use:namespace:hive:a``,
        ``admin:pool:gpu``, ``use:queue:root.a``, ``read:daemon``) it may do (``can``)."""
        params = [("can", check) for check in checks]
        return cast(m.WhoAmI, await self._call("GET", "/v1/whoami", params=params))

    async def create_api_token(
        self, name: str, user: str, *, groups: Sequence[str] = (), ttl_ms: Optional[int] = None
    ) -> m.CreatedApiToken:
        """Makes an API token (shown once, in ``token``)."""
        body = {"name": name, "user": user, "groups": list(groups), "ttl_ms": ttl_ms}
        return cast(m.CreatedApiToken, await self._call("POST", "/v1/api-tokens", body=body, idempotent=False))

    async def api_tokens(self) -> List[m.ApiToken]:
        return cast(List[m.ApiToken], (await self._call("GET", "/v1/api-tokens"))["api_tokens"])

    async def revoke_api_token(self, name: str) -> m.ApiToken:
        return cast(m.ApiToken, await self._call("DELETE", f"/v1/api-tokens/{seg(name)}"))

    async def put_binding(
        self, name: str, role: str, *, users: Sequence[str] = (), groups: Sequence[str] = ()
    ) -> m.Binding:
        """Gives a role to users and groups."""
        body = {"role": role, "users": list(users), "groups": list(groups)}
        return cast(m.Binding, await self._call("PUT", f"/v1/bindings/{seg(name)}", body=body))

    async def bindings(self) -> List[m.Binding]:
        return cast(List[m.Binding], (await self._call("GET", "/v1/bindings"))["bindings"])

    async def remove_binding(self, name: str) -> m.Binding:
        return cast(m.Binding, await self._call("DELETE", f"/v1/bindings/{seg(name)}"))

    # ---- the change feed ----

    async def watch(
        self,
        *,
        kind: Optional[str] = None,
        prefix: Optional[str] = None,
        since: Optional[int] = None,
        reconnects: int = 1000,
    ) -> AsyncIterator[m.WatchEvent]:
        """Every change, as it is committed: of one ``kind`` (``grant.granted``), under a
        ``prefix`` of keys (``namespaces/hive``), from after revision ``since``
        (default: from now). A broken stream is resumed from the last event seen (at most
        ``reconnects`` times in a row); a revision no longer kept raises ``RevisionCompacted``:
        list again, then watch from the list's ``Allot-Revision``."""
        async for event in self._events(kind, prefix, since, reconnects, None):
            yield event

    async def _events(
        self,
        kind: Optional[str],
        prefix: Optional[str],
        since: Optional[int],
        reconnects: int,
        deadline: Optional[float],
    ) -> AsyncGenerator[m.WatchEvent, None]:
        """:meth:`watch`, raising ``TimeoutError`` once ``deadline`` (``self.clock.now()``) passes.

        Where it resumes (``last``) moves with every event, every heartbeat's ``id`` (how far the
        daemon has looked for this watcher) and the stream's ``Allot-Revision`` (where a stream
        from now starts), so a reconnect misses nothing and repeats nothing; a ``behind``
        message (the watcher fell behind) resumes from where it says. A stream silent for
        :data:`WATCH_IDLE_TIMEOUT` (three heartbeats) is taken as cut and opened again."""
        last = since
        failures = 0
        while True:
            params = {"kind": kind, "prefix": prefix, "since": last}
            query = {k: v for k, v in params.items() if v is not None}
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            left = _left(deadline, self.clock)
            read = WATCH_IDLE_TIMEOUT if left is None else min(left, WATCH_IDLE_TIMEOUT)
            timeout = httpx.Timeout(self.options.timeout, read=read)
            try:
                async with self._http.stream("GET", "/v1/watch", params=query, headers=headers, timeout=timeout) as answer:
                    if answer.status_code >= 400:
                        raise_for(answer.status_code, await answer.aread())
                    failures = 0
                    start = _revision(answer.headers.get("allot-revision"))
                    if start is not None and (last is None or start > last):
                        last = start
                    stream = EventStream()
                    async for chunk in answer.aiter_bytes():
                        for message in stream.feed(chunk):
                            if message.event == "behind" and message.data is not None:
                                last = json.loads(message.data)["resume"]
                                raise _Resume()
                            if message.data is None:
                                seen = _revision(message.id)
                                if seen is not None and (last is None or seen > last):
                                    last = seen
                                continue
                            event = cast(m.WatchEvent, json.loads(message.data))
                            last = event["revision"]
                            yield event
                        _left(deadline, self.clock)
            except _Resume:
                _left(deadline, self.clock)
                continue
            except (httpx.TransportError, ConnectionFailed) as err:
                _left(deadline, self.clock)
                failures += 1
                if failures > reconnects:
                    raise connection_failed(err, f"{self.options.url.rstrip('/')}/v1/watch") from err
            except AllotError as err:
                if err.status != 503:
                    raise
                failures += 1
                if failures > reconnects:
                    raise
            await self.clock.asleep(retry_delay(min(failures, 5), self.options.backoff, None))

    # ---- what Python users write ----

    @asynccontextmanager
    async def token(
        self,
        namespace: str,
        units: int = 1,
        *,
        wait: Optional[float] = None,
        ttl: float = 30.0,
        token: Optional[str] = None,
        scope: Optional[m.Scope] = None,
        caps: Optional[m.Caps] = None,
    ) -> AsyncIterator[m.Grant]:
        """Holds ``units`` of ``namespace`` for the block: allocates (waiting up to ``wait``
        seconds for room; none: not at all), keeps the lease (``ttl`` seconds) alive in the
        background, releases on the way out, also on an exception or a cancellation. Raises
        :class:`Exhausted` or :class:`NamespaceQuotaExceeded` when not granted. A lease lost
        while the block ran (the keepalive refused) raises at the end of a block that raised
        nothing itself: what it protected was not protected all along.

        ``async with client.token("api:openai", units=2, wait=30) as grant: ...``
        """
        name = token or fresh_token()
        wait_ms = None if wait is None else int(wait * 1000)
        answer = await self.allocate(
            namespace, name, units, ttl_ms=int(ttl * 1000), wait_ms=wait_ms, scope=scope, caps=caps,
            raise_if_not_granted=True,
        )  # fmt: skip
        grant = cast(m.Grant, answer.get("grant"))
        fencing = grant["fencing"]

        async def renew() -> object:
            return await self.keepalive_grant(namespace, name, fencing=fencing)

        keeper = _AsyncKeeper(renew, ttl / 3, self.clock)
        raised = True
        try:
            yield grant
            raised = False
        finally:
            await keeper.stop()
            try:
                await self.release(namespace, name, fencing=fencing)
            except AllotError:
                if not raised and keeper.error is None:
                    raise
            if not raised and keeper.error is not None:
                raise keeper.error

    def limited(
        self, namespace: str, units: int = 1, *, wait: Optional[float] = None, ttl: float = 30.0
    ) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
        """A decorator: each call of the function holds ``units`` of ``namespace`` while it runs
        (as :meth:`token` does).

        ``@client.limited("api:openai", wait=60)``
        """

        def decorate(function: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
            @functools.wraps(function)
            async def limited_call(*args: Any, **kwargs: Any) -> R:
                async with self.token(namespace, units, wait=wait, ttl=ttl):
                    return await function(*args, **kwargs)

            return limited_call

        return decorate

    @asynccontextmanager
    async def hold_alloc(
        self,
        pools: Union[str, Sequence[str]],
        min_resources: str,
        *,
        max_resources: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        owner: Optional[str] = None,
        keepalive: float = 10.0,
    ) -> AsyncIterator[m.Alloc]:
        """Holds an alloc of at least ``min_resources`` (up to ``max_resources``) for the block,
        from the pool (or of the pools) whose offer the Rust client's ``allocate`` would pick:
        offers that hold ``max_resources`` first, then those that hold only ``min_resources``, each
        nearest to ``max_resources`` first; it asks for ``max_resources`` capped by the offer, or
        the whole offer when what it would leave is useless (``docs/glossary.md``, "pick rule").
        An offer gone when accepted moves on to the next. Keeps the alloc alive every
        ``keepalive`` seconds (for three times that), frees it on the way out. Raises
        ``ExceedsCapacity`` when no offer holds ``min_resources``.

        ``with client.hold_alloc(["worker-1", "worker-2"], "cpu=2,mem=8GiB") as alloc: ...``
        """
        names = [pools] if isinstance(pools, str) else list(pools)
        wanted = parse_resources(min_resources)
        most = wanted if max_resources is None else parse_resources(max_resources)
        offers = [(offer, parse_resources(offer["available"])) for name in names for offer in await self.offers(name)]
        gone: Optional[AllotError] = None
        for offer, available in pick_offers(offers, wanted, most):
            take = amount_to_take(available, wanted, most)
            take_text = None if take == wanted else format_resources(take)
            try:
                alloc = await self.accept(offer["pool"], offer["id"], min_resources, max_resources=take_text, labels=labels, owner=owner)
                break
            except AllotError as err:
                if err.code not in OFFER_GONE:
                    raise
                gone = err
        else:
            raise gone or ERRORS["exceeds_capacity"](
                f"no offer of {', '.join(names)} holds {min_resources}", code="exceeds_capacity", status=None
            )
        interval_ms = int(keepalive * 3000)
        await self.keepalive_alloc(alloc["pool"], alloc["id"], interval_ms)

        async def renew() -> object:
            return await self.keepalive_alloc(alloc["pool"], alloc["id"], interval_ms)

        keeper = _AsyncKeeper(renew, keepalive, self.clock)
        raised = True
        try:
            yield alloc
            raised = False
        finally:
            await keeper.stop()
            try:
                await self.free_alloc(alloc["pool"], alloc["id"])
            except AllotError as err:
                if err.code not in ("alloc_ended", "alloc_not_found") and not raised:
                    raise
            if not raised and keeper.error is not None:
                raise keeper.error

    async def submit_and_follow(
        self, app: AppSource, *, timeout: Optional[float] = None, raise_if_failed: bool = True
    ) -> m.App:
        """Submits an application (a dict, or a YAML or TOML file's path) and follows it, through
        the change feed, until every task has ended; then completes it (or fails it, naming the
        tasks that did not complete), as ``allot app submit --follow`` does, and answers it as it ended. One that
        does not end ``Completed`` raises :class:`AppFailed` (unless ``raise_if_failed`` is
        false); one still running after ``timeout`` seconds raises ``TimeoutError`` (it goes
        on running)."""
        submitted = await self.submit_app(read_app(app))
        app_id = submitted["app"]["id"]
        deadline = None if timeout is None else self.clock.now() + timeout
        ended = await self._follow(app_id, deadline)
        if raise_if_failed and ended["state"] != "Completed":
            raise AppFailed(f"application `{app_id}` ended {ended['state']}: {ended.get('reason')}", dict(ended))
        return ended

    async def run(self, app: AppSource, *, timeout: Optional[float] = None, raise_if_failed: bool = True) -> m.App:
        """Deprecated: :meth:`submit_and_follow` (a *run* is one execution of a task)."""
        warnings.warn("run() is now submit_and_follow()", DeprecationWarning, stacklevel=2)
        return await self.submit_and_follow(app, timeout=timeout, raise_if_failed=raise_if_failed)

    async def _follow(self, app_id: str, deadline: Optional[float]) -> m.App:
        """Waits until the application's tasks have all ended, then ends it; or until it ends
        otherwise. Reads it, then watches it from that revision."""
        answer = await self._send("GET", f"/v1/apps/{seg(app_id)}")
        current = cast(m.App, answer.json())
        revision = int(answer.headers.get("Allot-Revision", "0"))
        states = {task["id"]: task["state"] async for task in self.tasks(app_id)}
        key = f"apps/{app_id}"
        events = self._events(None, key, revision, 1000, deadline)
        try:
            while current["state"] not in APP_ENDED and not all(s in TASK_ENDED for s in states.values()):
                event = await events.__anext__()
                if event["key"] == key and event["kind"].startswith("app."):
                    app = cast(Optional[m.App], event.get("object"))
                    current = app if app is not None else await self.app(app_id)
                elif event["key"].startswith(key + "/tasks/") and event["kind"].startswith("task."):
                    task = cast(Optional[m.Task], event.get("object"))
                    if task is not None:
                        states[task["id"]] = task["state"]
                    elif event["kind"] == "task.removed":
                        # Removed from outside: nothing of it is left to wait for.
                        states.pop(event["key"][len(key + "/tasks/") :], None)
        finally:
            await events.aclose()  # the stream's connection, now
        if current["state"] in APP_ENDED:
            return current
        failed = sorted(name for name, state in states.items() if state != "Completed")
        try:
            if failed:
                return await self.fail_app(app_id, f"tasks that did not complete: {', '.join(failed)}")
            return await self.complete_app(app_id)
        except ConflictError:  # ended meanwhile (by hand, by a timeout): as it is
            return await self.app(app_id)


class _Resume(Exception):
    """The daemon said where the watcher is to resume: open the stream again from there."""


def _revision(text: Optional[str]) -> Optional[int]:
    """A revision the daemon sent (a header's or a heartbeat's ``id``), if it reads as one."""
    if text is None or not text.strip().isdigit():
        return None
    return int(text.strip())


def _left(deadline: Optional[float], clock: Clock) -> Optional[float]:
    """The seconds left before ``deadline`` on ``clock``; ``TimeoutError`` once it has passed."""
    if deadline is None:
        return None
    left = deadline - clock.now()
    if left <= 0:
        raise TimeoutError("the application did not end in time (it goes on)")
    return left


def _not_granted(namespace: str, token: str, answer: m.AllocateResponse) -> NotGranted:
    status = answer["status"]
    cls = Exhausted if status == "Exhausted" else NamespaceQuotaExceeded
    where = f"allocate `{token}` in `{namespace}`"
    return cls(f"{where}: {status}", dict(answer))

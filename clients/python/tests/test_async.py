"""The asyncio client against a real daemon: every part, and the context managers' clean-up on
exceptions and on cancellation."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Awaitable, Callable, List

import pytest

import allot
from allot import AsyncClient

from .clock import ManualClock
from .conftest import Daemon

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(daemon.url) as c:
        yield c


async def test_every_part(client: AsyncClient) -> None:
    assert (await client.ready())["status"] == "ready"
    await client.put_namespace("apy:q", 1)
    assert [ns["name"] async for ns in client.namespaces() if ns["name"] == "apy:q"] == ["apy:q"]
    answer = await client.allocate("apy:q", "a", ttl_ms=10_000)
    grant = answer["grant"]
    assert grant is not None
    assert [g["token"] async for g in client.grants("apy:q")] == ["a"]
    await client.keepalive_grant("apy:q", "a")
    with pytest.raises(allot.Exhausted):
        await client.allocate("apy:q", "b", raise_if_not_granted=True)
    waiter = asyncio.ensure_future(client.allocate("apy:q", "b", wait_ms=10_000))
    while not [w async for w in client.waiters("apy:q")]:
        await asyncio.sleep(0.02)
    await client.release("apy:q", "a", fencing=grant["fencing"])
    assert (await waiter)["status"] == "Granted"
    await client.remove_namespace("apy:q", force=True)

    session = await client.open_session(5_000)
    assert (await client.keepalive_session(session["id"]))["id"] == session["id"]
    assert session["id"] in [s["id"] async for s in client.sessions()]
    await client.close_session(session["id"])

    await client.put_pool("apy-pool", "cpu=2")
    [offer] = await client.offers("apy-pool")
    alloc = await client.accept("apy-pool", offer["id"], "cpu=1")
    assert [a["id"] async for a in client.allocs("apy-pool")] == [alloc["id"]]
    await client.keepalive_alloc("apy-pool", alloc["id"], 10_000)
    await client.free_alloc("apy-pool", alloc["id"])
    assert (await client.alloc("apy-pool", alloc["id"])).get("ended") is not None
    await client.remove_pool("apy-pool")

    await client.put_queue("root.apy")
    app = {"id": "apy-app", "queue": "root.apy", "tasks": [{"id": "t", "resources": "cpu=1", "selector": {"pool": "none"}}]}
    assert (await client.submit_app(app))["created"]
    await client.add_task("apy-app", {"id": "u", "resources": "cpu=1", "selector": {"pool": "none"}})
    assert [t["id"] async for t in client.tasks("apy-app")] == ["t", "u"]
    assert "apy-app" in [a["id"] async for a in client.apps()]
    assert (await client.task("apy-app", "u"))["state"] == "Pending"
    await client.remove_task("apy-app", "u")
    await client.fail_task("apy-app", "t", "not wanted")
    await client.remove_app("apy-app")
    await client.remove_queue("root.apy")
    with pytest.raises(allot.AppNotFound):
        await client.app("apy-app")


async def test_run_and_watch(client: AsyncClient) -> None:
    await client.put_queue("root.arun")
    app = {"id": "apy-run", "queue": "root.arun", "tasks": [{"id": "s", "resources": "cpu=1", "spec": {"type": "shell", "command": "echo async"}}]}
    ended = await client.submit_and_follow(app, timeout=60)
    assert ended["state"] == "Completed"
    assert (await client.task_logs("apy-run", "s"))["text"].strip() == "async"
    assert (await client.task_run("apy-run", "s"))["phase"] == "Success"

    events: List[str] = []

    async def follow() -> None:
        async for event in client.watch(kind="namespace.put", prefix="namespaces/apy-watch"):
            events.append(event["key"])
            if len(events) == 2:
                return

    watching = asyncio.ensure_future(follow())
    deadline = time.monotonic() + 10
    while not events:  # until the watch has started
        assert time.monotonic() < deadline and not watching.done(), watching
        await client.put_namespace("apy-watch:1", 1)
        await asyncio.sleep(0.05)
    await client.put_namespace("apy-watch:2", 1)
    await asyncio.wait_for(watching, 10)
    assert events[-1] == "namespaces/apy-watch:2"


async def test_token_is_released_on_exception_and_on_cancellation(client: AsyncClient) -> None:
    await client.put_namespace("apy:limited", 1)
    with pytest.raises(KeyError):
        async with client.token("apy:limited", ttl=2) as grant:
            assert grant["units"] == 1
            raise KeyError("boom")
    assert (await client.namespace("apy:limited"))["granted_units"] == 0

    entered = asyncio.Event()

    async def hold() -> None:
        async with client.token("apy:limited", ttl=2):
            entered.set()
            await asyncio.sleep(60)

    holder = asyncio.ensure_future(hold())
    await asyncio.wait_for(entered.wait(), 10)
    assert (await client.namespace("apy:limited"))["granted_units"] == 1
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert (await client.namespace("apy:limited"))["granted_units"] == 0, "released on cancellation"

    running, most = [0], [0]

    @client.limited("apy:limited", wait=30)
    async def call(i: int) -> int:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.05)
        running[0] -= 1
        return i

    assert sorted(await asyncio.gather(*(call(i) for i in range(4)))) == [0, 1, 2, 3]
    assert most[0] == 1


async def test_token_renews_each_time_its_clock_passes_a_third_of_the_ttl(daemon: Daemon) -> None:
    clock = ManualClock()
    async with AsyncClient(daemon.url) as plain, AsyncClient(daemon.url, clock=clock) as clocked:
        await plain.put_namespace("apy:clocked", 1)

        async def left(token: str) -> int:
            return (await plain.grant("apy:clocked", token)).get("expires_in_ms") or 0

        async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
            deadline = time.monotonic() + 60
            while not await check():
                assert time.monotonic() < deadline, f"{what}: not so after 60 s"
                await asyncio.sleep(0.01)  # polls what the daemon or the keeper makes true

        async with clocked.token("apy:clocked", ttl=30.0) as grant:
            token = grant["token"]
            for renewal in range(3):
                await until("the daemon's clock moved on", lambda: _below(left(token), 29_900))
                await until("the keeper waits on its clock", lambda: _true(clock.waiting() == 1))
                before = await left(token)
                clock.advance(10.0)
                await until(f"renewal {renewal} restarted the lease", lambda: _above(left(token), before))
        assert (await plain.namespace("apy:clocked"))["granted_units"] == 0, "released at the end"
        await plain.remove_namespace("apy:clocked")


async def _below(value: Awaitable[int], limit: int) -> bool:
    return await value <= limit


async def _above(value: Awaitable[int], limit: int) -> bool:
    return await value > limit


async def _true(value: bool) -> bool:
    return value


async def test_alloc_is_freed_on_cancellation(client: AsyncClient) -> None:
    await client.put_pool("apy-cancel", "cpu=2")
    entered = asyncio.Event()
    held: List[str] = []

    async def hold() -> None:
        async with client.hold_alloc("apy-cancel", min_resources="cpu=1", keepalive=0.2) as alloc:
            held.append(alloc["id"])
            entered.set()
            await asyncio.sleep(60)

    holder = asyncio.ensure_future(hold())
    await asyncio.wait_for(entered.wait(), 10)
    start = time.monotonic()
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert time.monotonic() - start < 5
    assert (await client.alloc("apy-cancel", held[0])).get("ended") is not None
    await client.remove_pool("apy-cancel")


async def test_the_rest_of_the_methods(client: AsyncClient) -> None:
    assert (await client.health())["status"] == "ok"
    await client.put_namespace("apy:rest", 1)
    session = await client.open_session(5_000)
    await client.allocate("apy:rest", "r", session=session["id"])
    assert (await client.grant("apy:rest", "r"))["session"] == session["id"]
    assert [g["token"] for g in (await client.session(session["id"]))["grants"]] == ["r"]
    await client.close_session(session["id"])
    await client.remove_namespace("apy:rest")
    await client.put_pool("apy-hand", "cpu=2", labels={"hand": "yes"})
    assert (await client.pool("apy-hand"))["name"] == "apy-hand"
    assert "apy-hand" in [p["name"] async for p in client.pools()]
    await client.put_queue("root.ahand")
    assert (await client.queue("root.ahand"))["leaf"] is True
    assert "root.ahand" in [q["path"] for q in await client.queues()]
    tasks = [{"id": i, "resources": "cpu=1", "selector": {"hand": "yes"}} for i in ("t", "u")]
    await client.submit_app({"id": "apy-hand", "queue": "root.ahand", "tasks": tasks})
    while (await client.task("apy-hand", "u"))["state"] != "Allocated":
        await asyncio.sleep(0.02)
    assert (await client.start_task("apy-hand", "t"))["state"] == "Running"
    assert (await client.complete_task("apy-hand", "t"))["state"] == "Completed"
    ends = await client.finish_tasks([{"app": "apy-hand", "task": "u", "outcome": "completed"}])
    assert ends["tasks"][0]["ended"]["state"] == "Completed"  # type: ignore[index]
    assert (await client.complete_app("apy-hand"))["state"] in ("Completing", "Completed")
    await client.remove_app("apy-hand")
    assert "stopped" in await client.stop_if_idle("apy-hand", 0)
    await client.remove_pool("apy-hand", force=True)

"""The blocking client against a real daemon: every part, errors as exceptions, retries."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

import allot
from allot import Client

from .clock import ManualClock, until
from .conftest import Daemon


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.url) as c:
        yield c


def test_quotas_grants_and_waiters(client: Client) -> None:
    assert client.health()["status"] == "ok"
    assert client.put_namespace("py:q", 2)["created"] is True
    assert client.namespace("py:q")["quota"] == 2
    for name in ("py:q1", "py:q2", "py:q3"):
        client.put_namespace(name, 1)
    listed = [ns["name"] for ns in client.namespaces(page_size=1)]
    assert {"py:q", "py:q1", "py:q2", "py:q3"} <= set(listed), "every page is read"

    answer = client.allocate("py:q", "job-1", 2, ttl_ms=30_000)
    assert answer["status"] == "Granted"
    grant = answer["grant"]
    assert grant is not None and grant["units"] == 2
    again = client.allocate("py:q", "job-1", 2, ttl_ms=30_000)
    assert again["existing"] is True, "the same token again is the same grant"
    with pytest.raises(allot.TokenConflict) as conflict:
        client.allocate("py:q", "job-1", 1)
    assert conflict.value.code == "token_conflict" and conflict.value.status == 409
    assert client.allocate("py:q", "job-2")["status"] == "Exhausted"
    with pytest.raises(allot.Exhausted) as exhausted:
        client.allocate("py:q", "job-2", raise_if_not_granted=True)
    assert exhausted.value.answer["status"] == "Exhausted"
    assert client.grant("py:q", "job-1")["fencing"] == grant["fencing"]
    assert [g["token"] for g in client.grants("py:q")] == ["job-1"]
    assert client.keepalive_grant("py:q", "job-1", fencing=grant["fencing"])["token"] == "job-1"
    with pytest.raises(allot.StaleFencing):
        client.release("py:q", "job-1", fencing=grant["fencing"] + 1)

    # A waiter: an allocate that waits for room, seen in the waiters, granted on the release.
    result: List[str] = []
    waiting = threading.Thread(target=lambda: result.append(client.allocate("py:q", "job-3", wait_ms=10_000)["status"]))
    waiting.start()
    deadline = time.monotonic() + 5
    while not list(client.waiters("py:q")):
        assert time.monotonic() < deadline, "the allocate waits"
        time.sleep(0.02)
    assert client.release("py:q", "job-1", fencing=grant["fencing"])["released"] is True
    waiting.join(10)
    assert result == ["Granted"]
    with pytest.raises(allot.NamespaceInUse):
        client.remove_namespace("py:q")
    assert client.remove_namespace("py:q", force=True)["name"] == "py:q"
    with pytest.raises(allot.NamespaceNotFound) as missing:
        client.namespace("py:q")
    assert isinstance(missing.value, allot.NotFoundError) and "py:q" in missing.value.message


def test_sessions(client: Client) -> None:
    client.put_namespace("py:sessions", 3)
    session = client.open_session(5_000)
    client.allocate("py:sessions", "s-1", session=session["id"])
    assert [g["token"] for g in client.session(session["id"])["grants"]] == ["s-1"]
    assert any(s["id"] == session["id"] for s in client.sessions())
    assert client.keepalive_session(session["id"])["id"] == session["id"]
    client.close_session(session["id"])
    assert client.namespace("py:sessions")["granted_units"] == 0, "closing releases its grants"
    with pytest.raises(allot.SessionNotFound):
        client.session(session["id"])


def test_pools_offers_and_allocs(client: Client) -> None:
    client.put_pool("py-pool", "cpu=4,mem=8GiB", labels={"zone": "a"})
    assert client.pool("py-pool")["capacity"] == "cpu=4,mem=8GiB"
    # What its executor runs: kept when only the labels change, every type again with "*".
    assert client.put_pool("py-pool", "cpu=4,mem=8GiB", plugins=["noop", "http"])["pool"]["plugins"] == ["http", "noop"]
    changed = client.put_pool("py-pool", "cpu=4,mem=8GiB", labels={"zone": "b"})["pool"]
    assert changed["plugins"] == ["http", "noop"] and changed["labels"] == {"zone": "b"}
    assert client.put_pool("py-pool", "cpu=4,mem=8GiB", plugins=["*"])["pool"]["plugins"] is None
    assert any(p["name"] == "py-pool" for p in client.pools())
    [offer] = client.offers("py-pool")
    alloc = client.accept("py-pool", offer["id"], "cpu=1", max_resources="cpu=2", owner="tests")
    assert alloc["resources"] == "cpu=2" and alloc["owner"] == "tests"
    assert client.alloc("py-pool", alloc["id"])["id"] == alloc["id"]
    assert [a["id"] for a in client.allocs("py-pool")] == [alloc["id"]]
    # Reflow's mux: one offer by its id, the allocs of several pools with the failures reported.
    assert client.offer("py-pool", offer["id"])["available"] == "cpu=2,mem=8GiB"
    with pytest.raises(allot.OfferNotFound):
        client.offer("py-pool", "2")
    found = client.allocs_of_pools(["py-pool", "py-none"])
    assert [a["id"] for a in found["allocs"]] == [alloc["id"]]
    assert [f["pool"] for f in found["failed"]] == ["py-none"] and "pool_not_found" in found["failed"][0]["error"]
    assert alloc["id"] in [a["id"] for a in client.allocs_of_pools()["allocs"]]
    assert client.keepalive_alloc("py-pool", alloc["id"], 60_000)["alloc"]["id"] == alloc["id"]
    # What runs in it: the owner's labels and metadata, changed while it lives.
    noted = client.annotate_alloc("py-pool", alloc["id"], labels={"step": "1"}, metadata={"exec": "e1", "n": [1, 2.5]})
    assert noted["labels"] == {"step": "1"} and noted["metadata"] == {"exec": "e1", "n": [1, 2.5]}
    noted = client.annotate_alloc("py-pool", alloc["id"], remove_labels=["step"], clear_metadata=True)
    assert noted["labels"] == {} and "metadata" not in noted
    with pytest.raises(allot.InvalidArgument):
        client.annotate_alloc("py-pool", alloc["id"], labels={"allot/task": "t"})
    with pytest.raises(allot.TaskNotFound):
        client.alloc_run("py-pool", alloc["id"])
    client.free_alloc("py-pool", alloc["id"])
    with pytest.raises(allot.AllocEnded):
        client.keepalive_alloc("py-pool", alloc["id"], 60_000)
    with pytest.raises(allot.ExceedsCapacity):
        [offer] = client.offers("py-pool")
        client.accept("py-pool", offer["id"], "cpu=64")
    assert "stopped" in client.stop_if_idle("py-pool", 0)
    assert client.remove_pool("py-pool", force=True)["name"] == "py-pool"


def test_queues_applications_and_tasks(client: Client) -> None:
    client.put_queue("root.py", max="cpu=4", group_max_apps=3)
    assert client.queue("root.py")["group_max_apps"] == 3
    assert any(q["path"] == "root.py" for q in client.queues())
    task = {"id": "t1", "resources": "cpu=1", "selector": {"pool": "none"}}
    submitted = client.submit_app({"id": "py-app", "queue": "root.py", "tasks": [task]})
    assert submitted["created"] and submitted["tasks"][0]["state"] in ("New", "Pending")
    assert client.submit_app({"id": "py-app", "queue": "root.py", "tasks": [task]})["created"] is False
    assert client.app("py-app")["queue"] == "root.py"
    assert any(a["id"] == "py-app" for a in client.apps(page_size=1))
    client.add_task("py-app", {"id": "t2", "resources": "cpu=1", "selector": {"pool": "none"}})
    assert [t["id"] for t in client.tasks("py-app")] == ["t1", "t2"]
    assert client.task("py-app", "t2")["state"] == "Pending"
    ends = client.finish_tasks([{"app": "py-app", "task": "nope", "outcome": "completed"}])
    assert ends["tasks"][0]["error"]["code"] == "task_not_found"  # type: ignore[index]
    assert client.remove_task("py-app", "t2")["state"] == "Killed"
    with pytest.raises(allot.IllegalTransition):
        client.complete_task("py-app", "t1")  # never placed: it cannot complete
    assert client.fail_app("py-app", "given up")["state"] in ("Failing", "Failed")
    with pytest.raises(allot.AppEnded):
        client.complete_app("py-app")
    # Submission and end as timestamps, and lists in those orders.
    client.submit_app({"id": "py-later", "queue": "root.py"})
    later = client.app("py-later")
    assert later["submitted_at"].endswith("Z") and later["ended_at"] is None
    by_submission = [a["id"] for a in client.apps(sort="submitted", page_size=1)]
    assert by_submission.index("py-app") < by_submission.index("py-later")
    newest = [a["id"] for a in client.apps(sort="-submitted")]
    assert newest.index("py-later") < newest.index("py-app")
    # The latest ended first, those not ended (``py-later``) last.
    ended_at = [a.get("ended_at") for a in client.apps(sort="-ended")]
    done = [e for e in ended_at if e is not None]
    assert ended_at[: len(done)] == done and done == sorted(done, reverse=True) and ended_at[-1] is None
    client.remove_app("py-later")
    client.remove_app("py-app")
    client.remove_queue("root.py")
    with pytest.raises(allot.QueueNotFound):
        client.queue("root.py")


def test_run_follows_an_application_to_its_end(client: Client, tmp_path: Path) -> None:
    client.put_queue("root.runs")
    app = {
        "id": "py-run",
        "queue": "root.runs",
        "tasks": [
            {"id": "hello", "resources": "cpu=1", "spec": {"type": "shell", "command": "echo hello from allot"}},
            {"id": "nap", "resources": "cpu=1", "spec": {"type": "sleep", "seconds": 0.2}},
        ],
    }
    ended = client.submit_and_follow(app, timeout=60)
    assert ended["state"] == "Completed"
    run = client.task_run("py-run", "hello")
    assert run["phase"] == "Success"
    logs = client.task_logs("py-run", "hello")
    assert logs["text"].strip() == "hello from allot" and logs["ended"]
    # From a file, and a failure raised as such.
    path = tmp_path / "fails.yaml"
    path.write_text(
        "id: py-fails\nqueue: root.runs\ntasks:\n  - id: bad\n    resources: cpu=1\n"
        "    spec: {type: shell, command: 'exit 3'}\n"
    )
    with pytest.raises(allot.AppFailed) as failed:
        client.submit_and_follow(str(path), timeout=60)
    assert failed.value.app["state"] == "Failed"
    toml = tmp_path / "ok.toml"
    toml.write_text(
        'id = "py-toml"\nqueue = "root.runs"\n[[tasks]]\nid = "t"\nresources = "cpu=1"\n'
        'spec = { type = "shell", command = "true" }\n'
    )
    # `run`, the old name of `submit_and_follow`, still works, and says it is deprecated.
    with pytest.deprecated_call():
        assert client.run(str(toml), timeout=60)["state"] == "Completed"
    # A timeout says so, and the application goes on.
    client.put_queue("root.slow")
    slow = {"id": "py-slow", "queue": "root.slow", "tasks": [{"id": "s", "resources": "cpu=1", "spec": {"type": "sleep", "seconds": 30}}]}
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        client.submit_and_follow(slow, timeout=0.5)
    assert time.monotonic() - start < 10
    assert client.app("py-slow")["state"] not in ("Completed", "Failed")
    deadline = time.monotonic() + 10
    while client.task("py-slow", "s")["state"] != "Running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert client.wake_task("py-slow", "s")["task"] == "s"
    client.remove_app("py-slow")


def test_watch_streams_changes_and_resumes_after_a_restart(fresh_daemon: Daemon) -> None:
    seen: List[str] = []
    done = threading.Event()

    def follow() -> None:
        with Client(fresh_daemon.url, backoff=0.05) as watcher:
            for event in watcher.watch(prefix="namespaces/watched"):
                seen.append(f"{event['kind']} {event['key']}")
                if len(seen) == 2:
                    done.set()
                    return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    with Client(fresh_daemon.url) as client:
        deadline = time.monotonic() + 5
        while not seen:
            client.put_namespace("watched:a", 1)  # until the watch has started
            assert time.monotonic() < deadline, "the watch sees a change"
            time.sleep(0.1)
        fresh_daemon.restart()
        client.put_namespace("watched:b", 1)  # the client retries while the daemon starts
    assert done.wait(15), seen
    assert seen[-1] == "namespace.put namespaces/watched:b", seen


def test_calls_are_retried_across_a_restart_and_fail_when_the_daemon_is_gone(fresh_daemon: Daemon) -> None:
    with Client(fresh_daemon.url, retries=8, backoff=0.1) as client:
        client.put_namespace("retried", 1)
        address = fresh_daemon.address()
        fresh_daemon.stop()
        restarted = threading.Timer(0.5, lambda: fresh_daemon.start(address))
        restarted.start()
        assert client.namespace("retried")["quota"] == 1, "answered once the daemon is back"
        restarted.join()
    fresh_daemon.stop()
    with Client(fresh_daemon.url, retries=1, backoff=0.01) as client:
        with pytest.raises(allot.ConnectionFailed) as failed:
            client.namespace("retried")
        assert isinstance(failed.value, allot.Unavailable)
        assert f"{fresh_daemon.url}/v1/namespaces/retried" in str(failed.value), "it names the URL"


def test_token_context_manager_limits_concurrency_and_releases_on_every_path(client: Client) -> None:
    client.put_namespace("py:limited", 2)
    running, most = [0], [0]
    lock = threading.Lock()

    @client.limited("py:limited", wait=30, ttl=3)
    def call_api(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return i

    threads = [threading.Thread(target=call_api, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 2, "never more than the quota at once"
    assert client.namespace("py:limited")["granted_units"] == 0

    with pytest.raises(RuntimeError):
        with client.token("py:limited", units=2) as grant:
            assert client.namespace("py:limited")["granted_units"] == 2
            assert grant["units"] == 2
            raise RuntimeError("the work failed")
    assert client.namespace("py:limited")["granted_units"] == 0, "released on the exception"
    # The lease is kept alive while the block runs longer than its TTL: the keeper renews it each
    # time its clock (moved by the test) passes a third of the TTL. The daemon's clock is real: the
    # test waits for it to run a third of the lease down before each move.
    clock = ManualClock()
    with Client(client.options.url, clock=clock) as clocked, clocked.token("py:limited", ttl=2.0) as grant:

        def left() -> int:
            return client.grant("py:limited", grant["token"]).get("expires_in_ms") or 0

        for renewal in range(4):  # four thirds of the TTL on the daemon's clock: past it
            until("a third of the lease ran down on the daemon", lambda: left() <= 1334)
            until("the keeper waits on its clock", lambda: clock.waiting() == 1)
            before = left()
            clock.advance(2.0 / 3)
            until(f"renewal {renewal} restarted the lease", lambda: left() > before)
        assert client.grant("py:limited", grant["token"])["fencing"] == grant["fencing"]
    with client.token("py:limited", units=2):
        with pytest.raises(allot.Exhausted):
            with client.token("py:limited"):
                pass


def test_alloc_context_manager_picks_the_best_fit_and_frees(client: Client) -> None:
    client.put_pool("py-big", "cpu=16,mem=64GiB")
    client.put_pool("py-small", "cpu=4,mem=8GiB")
    # Kept alive every `keepalive` seconds of the client's clock (moved by the test), for three
    # times that: past a whole lease of the daemon's (real) clock, awaited a third at a time.
    clock = ManualClock()
    with Client(client.options.url, clock=clock) as clocked, clocked.hold_alloc(
        ["py-big", "py-small"], min_resources="cpu=2,mem=4GiB", keepalive=0.5
    ) as alloc:
        assert alloc["pool"] == "py-small", "the offer nearest to what it asks (the pick rule)"

        def since() -> int:
            return client.alloc("py-small", alloc["id"]).get("last_keepalive_ms_ago") or 0

        for renewal in range(4):  # four thirds of the 1.5 s lease on the daemon's clock
            until("a third of the lease ran down on the daemon", lambda: since() >= 500)
            until("the keeper waits on its clock", lambda: clock.waiting() == 1)
            before = since()
            clock.advance(0.5)
            until(f"renewal {renewal} reached the daemon", lambda: since() < before)
        assert client.alloc("py-small", alloc["id"]).get("ended") is None, "kept alive"
    with pytest.raises(allot.AllocEnded):
        client.keepalive_alloc("py-small", alloc["id"], 1000)
    with pytest.raises(ValueError):
        with client.hold_alloc("py-small", min_resources="cpu=1") as held:
            raise ValueError("boom")
    with pytest.raises(allot.AllocEnded):
        client.keepalive_alloc("py-small", held["id"], 1000)
    with pytest.raises(allot.ExceedsCapacity):
        with client.hold_alloc(["py-big", "py-small"], min_resources="cpu=32"):
            pass
    client.remove_pool("py-big", force=True)
    client.remove_pool("py-small", force=True)


def test_a_503_is_retried_until_the_store_is_back(data_root: Path) -> None:
    """A daemon on Redis answers 503 `store_unavailable` while Redis is stopped: the client waits
    (bounded) and its call is answered once Redis is back."""
    import shutil
    import signal
    import socket
    import subprocess

    from .conftest import new_daemon

    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is needed: apt-get install -y redis-server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    redis = subprocess.Popen([server, "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server starts"
                time.sleep(0.05)
        daemon = new_daemon(data_root, "--store", f"redis://127.0.0.1:{port}")
        try:
            with Client(daemon.url, retries=10, backoff=0.2) as client:
                client.put_namespace("py:redis", 1)
                redis.send_signal(signal.SIGSTOP)  # Redis stops answering: the daemon answers 503
                threading.Timer(1.5, lambda: redis.send_signal(signal.SIGCONT)).start()
                start = time.monotonic()
                assert client.allocate("py:redis", "t")["status"] == "Granted"
                assert time.monotonic() - start >= 1.0, "answered after Redis came back"
            with Client(daemon.url, retries=0) as impatient:
                redis.send_signal(signal.SIGSTOP)
                try:
                    with pytest.raises(allot.Unavailable) as unavailable:
                        impatient.namespace("py:redis")
                    assert unavailable.value.status == 503, unavailable.value
                finally:
                    redis.send_signal(signal.SIGCONT)
        finally:
            daemon.stop()
    finally:
        redis.kill()
        redis.wait()


def test_a_pool_is_cordoned_drained_and_occupied(client: Client) -> None:
    client.put_pool("py-cordon", "cpu=4")
    assert client.put_pool("py-cordon", "cpu=4", occupied="cpu=1")["pool"]["occupied"] == "cpu=1"
    assert [o["available"] for o in client.offers("py-cordon")] == ["cpu=3"]
    cordoned = client.cordon_pool("py-cordon")
    assert cordoned["cordon"] is not None and cordoned["cordon"].get("drain_in_ms") is None
    assert client.offers("py-cordon") == []
    with pytest.raises(allot.PoolCordoned) as refused:
        client.accept("py-cordon", "1", "cpu=1")
    assert refused.value.status == 409
    drained = client.drain_pool("py-cordon", grace_ms=60_000)
    assert 0 < drained["cordon"]["drain_in_ms"] <= 60_000  # type: ignore[index,operator]
    assert client.uncordon_pool("py-cordon").get("cordon") is None
    client.put_pool("py-cordon", "cpu=4", occupied="")
    assert [o["available"] for o in client.offers("py-cordon")] == ["cpu=4"]
    client.remove_pool("py-cordon")


def test_tasks_reported_by_hand_on_a_pool_no_daemon_runs(client: Client) -> None:
    client.put_pool("py-hand", "cpu=2", labels={"hand": "yes"})
    client.put_queue("root.hand")
    task = {"id": "t", "resources": "cpu=1", "selector": {"hand": "yes"}}
    other = {"id": "u", "resources": "cpu=1", "selector": {"hand": "yes"}}
    client.submit_app({"id": "py-hand", "queue": "root.hand", "tasks": [task, other]})
    deadline = time.monotonic() + 10
    while client.task("py-hand", "u")["state"] != "Allocated":
        assert time.monotonic() < deadline, "placed"
        time.sleep(0.02)
    assert client.start_task("py-hand", "t")["state"] == "Running"
    assert client.complete_task("py-hand", "t")["state"] == "Completed"
    ends = client.finish_tasks([{"app": "py-hand", "task": "u", "outcome": "failed", "reason": "by hand"}])
    assert ends["tasks"][0]["ended"]["state"] == "Failed"  # type: ignore[index]
    assert client.complete_app("py-hand")["state"] in ("Completing", "Completed")
    client.remove_app("py-hand")
    client.remove_pool("py-hand", force=True)


def test_save_snapshot_writes_a_whole_archive_or_nothing(client: Client, tmp_path: Path) -> None:
    client.put_namespace("py:snapshot", 3)
    client.allocate("py:snapshot", "kept")
    archive = tmp_path / "store.snapshot"
    described = client.save_snapshot(archive)
    assert described["backend"] == "embedded" and described["revision"] > 0, described
    assert described["bytes"] == archive.stat().st_size and len(described["sha256"]) == 64
    assert not (tmp_path / "store.snapshot.partial").exists()
    # A copy cut short, or altered, is refused by the same check.
    from allot._util import check_snapshot

    data = archive.read_bytes()
    for broken in (data[:-1], data[:-40] + bytes([data[-40] ^ 0x55]) + data[-39:]):
        copy = tmp_path / "broken.snapshot"
        copy.write_bytes(broken)
        with pytest.raises(allot.AllotError) as refused:
            check_snapshot(copy)
        assert refused.value.code == "snapshot_damaged", refused.value


def test_a_watcher_that_falls_behind_resumes_where_the_daemon_says(data_root: Path) -> None:
    """A daemon that lets a watcher lag by one event only (``[watch] buffer = 1``) ends the
    stream with ``event: behind`` at the first commit of several events; the client watches again
    from the revision it names, so every event comes once, in order."""
    from .conftest import new_daemon

    d = new_daemon(data_root, config="\n[watch]\nbuffer = 1\n")
    try:
        seen: List[Tuple[int, str, str]] = []
        done = threading.Event()

        def follow() -> None:
            with Client(d.url, backoff=0.05) as watcher:
                for event in watcher.watch(prefix="apps"):
                    seen.append((event["revision"], event["kind"], event["key"]))
                    if sum(1 for _, kind, _ in seen if kind == "task.changed") == 3:
                        done.set()
                        return

        with Client(d.url) as client:
            client.put_queue("root.behind")
            thread = threading.Thread(target=follow, daemon=True)
            thread.start()
            # The watch has started once it sees an event (an application alone, one event).
            alone = iter(range(1_000_000))

            def started() -> bool:
                client.submit_app({"id": f"alone-{next(alone)}", "queue": "root.behind"})
                return bool(seen)

            until("the watch sees an application", started)
            # One commit, four events (the application and its three tasks): more than the buffer.
            tasks = [{"id": f"t{i}", "resources": "cpu=1"} for i in range(1, 4)]
            client.submit_app({"id": "behind-1", "queue": "root.behind", "tasks": tasks})
            assert done.wait(15), seen
        revisions = [revision for revision, _, _ in seen]
        assert revisions == sorted(set(revisions)), f"every event once, in order: {seen}"
        keys = [key for _, kind, key in seen if kind == "task.changed"]
        assert keys == ["apps/behind-1/tasks/t1", "apps/behind-1/tasks/t2", "apps/behind-1/tasks/t3"], seen
    finally:
        d.stop()
